package admission_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stormguard/stormguard/admission"
	"github.com/stormguard/stormguard/observe"
	"github.com/stormguard/stormguard/wire"
)

// The attempt header decides original or retry; a missing or invalid one
// is an original.
func TestWrapAttemptHeader(t *testing.T) {
	tests := []struct {
		name   string
		values []string // header lines; nil: no header
		want   int
	}{
		{"absent", nil, 1},
		{"one", []string{"1"}, 1},
		{"two", []string{"2"}, 2},
		{"spaces", []string{" 3\t"}, 3},
		{"folded list", []string{"2, 5"}, 2},
		{"first line counts", []string{"1", "4"}, 1},
		{"zero", []string{"0"}, 1},
		{"negative", []string{"-2"}, 1},
		{"plus sign", []string{"+2"}, 1},
		{"garbage", []string{"two"}, 1},
		{"empty", []string{""}, 1},
		{"huge", []string{"99999999999999999999"}, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var got observe.Event
			ctl := newController(t, admission.Config{Observer: observe.Func(func(_ context.Context, e observe.Event) { got = e })})
			called := false
			h := ctl.Wrap(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { called = true }))
			r := request(0)
			if tt.values != nil {
				r.Header[wire.AttemptHeader] = tt.values
			}
			h.ServeHTTP(httptest.NewRecorder(), r)
			if got.Attempt != tt.want || got.Outcome != "admitted" || !called {
				t.Errorf("header %q: decision %+v (handler called %v), want attempt %d admitted",
					tt.values, got, called, tt.want)
			}
			s := ctl.Stats()
			if tt.want >= 2 && (s.Retries != 1 || s.Originals != 0) || tt.want == 1 && (s.Originals != 1 || s.Retries != 0) {
				t.Errorf("header %q: Stats() = %+v, want one %s", tt.values, s, map[bool]string{true: "retry", false: "original"}[tt.want >= 2])
			}
		})
	}
}

// Every kind of refusal: 503, a Retry-After, the don't-retry signal when
// appropriate, and the handler never runs.
func TestWrapRefusals(t *testing.T) {
	tests := []struct {
		name      string
		cfg       admission.Config
		busy      bool // one request holds the only slot
		attempt   int
		outcome   admission.Outcome
		reported  string // the event's Outcome
		dontRetry bool
	}{
		{"retry beyond the ratio", admission.Config{MinRetriesPerSecond: -1}, false, 2, admission.RetryRefused, "shed-retry", true},
		{"retry beyond the ratio, third attempt", admission.Config{MinRetriesPerSecond: -1}, false, 3, admission.RetryRefused, "shed-retry", true},
		{"original, no slot, no queue", admission.Config{MaxInFlight: 1, MaxQueue: -1}, true, 0, admission.QueueFull, "shed-busy", false},
		{"retry, no slot, no queue", admission.Config{MaxInFlight: 1, MaxQueue: -1}, true, 2, admission.QueueFull, "shed-busy", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var got observe.Event
			tt.cfg.Observer = observe.Func(func(_ context.Context, e observe.Event) { got = e })
			ctl := newController(t, tt.cfg)
			if tt.busy {
				p, _ := ctl.Acquire(context.Background(), 1)
				defer p.Release()
			}
			h := ctl.Wrap(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {
				t.Error("the handler ran for a refused request")
			}))
			rec := serve(h, tt.attempt)
			checkRefusal(t, rec, 1, 10, tt.dontRetry)
			if got.Kind != observe.Admission || got.Outcome != tt.reported || got.Reason != tt.outcome.String() || got.Attempt != max(tt.attempt, 1) {
				t.Errorf("reported %+v, want outcome %s, reason %v, attempt %d", got, tt.reported, tt.outcome, max(tt.attempt, 1))
			}
			if ct := rec.Header().Get("Content-Type"); ct != "text/plain; charset=utf-8" {
				t.Errorf("Content-Type = %q", ct)
			}
			if want := strconv.Itoa(max(int(got.Delay/time.Second), 1)); rec.Header().Get("Retry-After") != want {
				t.Errorf("Retry-After = %q for a decision of %v, want %s", rec.Header().Get("Retry-After"), got.Delay, want)
			}
			if rec.Body.Len() == 0 {
				t.Error("refusal has no body")
			}
		})
	}
}

// Retry-After values beyond the precomputed ones are written too.
func TestWrapLongRetryAfter(t *testing.T) {
	ctl := newController(t, admission.Config{
		MaxInFlight: 1, MaxQueue: -1, RetryAfterBase: 2 * time.Hour, RetryAfterSpread: -1,
	})
	p, _ := ctl.Acquire(context.Background(), 1)
	defer p.Release()
	rec := serve(ctl.Wrap(http.NotFoundHandler()), 1)
	checkRefusal(t, rec, 7200, 7200, false)
}

// A nil handler answers 404 to admitted requests.
func TestWrapNilNext(t *testing.T) {
	ctl := newController(t, admission.Config{})
	if rec := serve(ctl.Wrap(nil), 1); rec.Code != http.StatusNotFound {
		t.Errorf("Wrap(nil) answered %d, want 404", rec.Code)
	}
}

// The whole seconds HTTP sends are spread evenly over the configured range.
func TestWrapRetryAfterDistribution(t *testing.T) {
	ctl := newController(t, admission.Config{MaxInFlight: 1, MaxQueue: -1, Rand: seeded(1)})
	p, _ := ctl.Acquire(context.Background(), 1)
	defer p.Release()
	h := ctl.Wrap(http.NotFoundHandler())
	const n = 10000
	counts := map[string]int{}
	for range n {
		counts[serve(h, 1).Header().Get("Retry-After")]++
	}
	for s := 1; s <= 10; s++ {
		// Each of the ten values has probability 1/10: 1000 expected,
		// standard deviation 30; 850 to 1150 is five of them.
		if c := counts[strconv.Itoa(s)]; c < 850 || c > 1150 {
			t.Errorf("Retry-After %d sent %d times of %d, want about %d", s, c, n, n/10)
		}
		delete(counts, strconv.Itoa(s))
	}
	if len(counts) != 0 {
		t.Errorf("Retry-After values outside 1..10: %v", counts)
	}
}

// A thousand clients refused in the same instant, each honouring the
// Retry-After it got, come back spread over the jitter window: the peak per
// 50 ms is about a tenth of them. Without jitter they all come back in the
// same instant.
func TestWrapClientsReturnSpread(t *testing.T) {
	tests := []struct {
		name     string
		spread   time.Duration
		peakMin  int // peak returns per 50 ms, at least
		peakMax  int // and at most
		occupied int // 50 ms windows with returns, at least
	}{
		{"jitter", 0, 1, 150, 10},        // the default 10 s spread
		{"no jitter", -1, 1000, 1000, 1}, // the control: all return at once
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				const clients = 1000
				start := time.Now()
				var mu sync.Mutex
				perWindow := map[int64]int{}
				ctl := newController(t, admission.Config{
					MaxInFlight: 1, MaxQueue: -1, RetryAfterSpread: tt.spread, Rand: seeded(42),
					RetryRatio: 1, // let every retry through the ratio: this test is about the timing
					Observer: observe.Func(func(_ context.Context, e observe.Event) {
						if e.Attempt >= 2 {
							mu.Lock()
							perWindow[int64(time.Since(start)/(50*time.Millisecond))]++
							mu.Unlock()
						}
					}),
				})
				// One long request holds the only slot, so everyone is shed.
				busy := make(chan struct{})
				h := ctl.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					if r.Header.Get(wire.AttemptHeader) == "" {
						<-busy
					}
				}))
				go serve(h, 0)
				synctest.Wait()

				var refused atomic.Int64
				var wg sync.WaitGroup
				for range clients {
					wg.Go(func() {
						rec := serve(h, 0)
						if rec.Code != http.StatusServiceUnavailable {
							return
						}
						refused.Add(1)
						s, err := strconv.Atoi(rec.Header().Get("Retry-After"))
						if err != nil {
							t.Errorf("Retry-After %q: %v", rec.Header().Get("Retry-After"), err)
							return
						}
						time.Sleep(time.Duration(s) * time.Second) // honour it
						serve(h, 2)
					})
				}
				wg.Wait()
				close(busy)
				synctest.Wait()

				if refused.Load() != clients {
					t.Fatalf("%d of %d clients refused, want all", refused.Load(), clients)
				}
				peak, total := 0, 0
				for _, n := range perWindow {
					peak = max(peak, n)
					total += n
				}
				if total != clients {
					t.Errorf("%d returns seen, want %d", total, clients)
				}
				if peak < tt.peakMin || peak > tt.peakMax || len(perWindow) < tt.occupied {
					t.Errorf("returns: peak %d per 50 ms over %d windows, want %d to %d over at least %d",
						peak, len(perWindow), tt.peakMin, tt.peakMax, tt.occupied)
				}
				t.Logf("%d clients return with a peak of %d per 50 ms over %d windows", clients, peak, len(perWindow))
			})
		})
	}
}

// Over HTTP, a queued request waits at most MaxQueueWait and is then
// answered 503 with a Retry-After (and the don't-retry signal if it was a
// retry); one that gets a slot in time reaches the handler.
func TestWrapQueueWaitBounded(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctl := newController(t, admission.Config{MaxInFlight: 1, MaxQueue: 4, MaxQueueWait: 300 * time.Millisecond})
		release := make(chan struct{})
		h := ctl.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Query().Has("hold") {
				<-release
			}
		}))
		go h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(http.MethodGet, "/?hold", nil))
		synctest.Wait()

		for _, attempt := range []int{1, 2} {
			start := time.Now()
			rec := serve(h, attempt)
			if waited := time.Since(start); waited != 300*time.Millisecond {
				t.Errorf("attempt %d answered after %v, want exactly 300ms", attempt, waited)
			}
			checkRefusal(t, rec, 1, 10, attempt == 2)
		}

		done := make(chan int)
		go func() { done <- serve(h, 1).Code }()
		synctest.Wait()
		time.Sleep(100 * time.Millisecond)
		close(release)
		if code := <-done; code != http.StatusOK {
			t.Errorf("request queued for 100ms before the slot freed: %d, want 200", code)
		}
		if s := ctl.Stats(); s.Outcomes[admission.QueueTimeout] != 2 || s.Outcomes[admission.Admitted] != 2 {
			t.Errorf("Stats() = %+v, want 2 timed out, 2 admitted", s)
		}
	})
}

// TestWrapFieldsAmongMany: the handler finds each field it reads whether
// the request has few other fields or many (the map is read in one pass
// for a few fields, by a lookup per name for more).
func TestWrapFieldsAmongMany(t *testing.T) {
	tests := []struct {
		name     string
		fields   map[string]string
		twice    bool // send it twice: the second is judged
		want     int  // status
		attempt  int  // the attempt the observer sees (want 200 only)
		dontRetr bool
	}{
		{"none", nil, false, 200, 1, false},
		{"attempt", map[string]string{wire.AttemptHeader: "2"}, false, 503, 0, true},
		{"probe", map[string]string{wire.AttemptHeader: "2", wire.ProbeHeader: "1"}, false, 200, 2, false},
		{"timeout", map[string]string{wire.TimeoutHeader: "0"}, false, 503, 0, true},
		{"envoy timeout", map[string]string{"X-Envoy-Expected-Rq-Timeout-Ms": "0"}, false, 503, 0, true},
		{"far timeout", map[string]string{wire.TimeoutHeader: "60000"}, false, 200, 1, false},
		{"key", map[string]string{"Idempotency-Key": "k"}, true, 503, 0, true},
		{"older key", map[string]string{"X-Idempotency-Key": "k"}, true, 503, 0, true},
		{"blank key, older key", map[string]string{"Idempotency-Key": " ", "X-Idempotency-Key": "k"}, true, 503, 0, true},
	}
	for _, others := range []int{0, 3, 12} {
		for _, tt := range tests {
			t.Run(fmt.Sprintf("%s/%d_others", tt.name, others), func(t *testing.T) {
				var got observe.Event
				ctl := newController(t, admission.Config{RetryRatio: -1, MinRetriesPerSecond: -1,
					Observer: observe.Func(func(_ context.Context, e observe.Event) { got = e })})
				h := ctl.Wrap(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
				var rec *httptest.ResponseRecorder
				sends := 1
				if tt.twice {
					sends = 2
				}
				for range sends {
					r := request(0)
					for i := range others {
						r.Header.Set("X-Other-"+strconv.Itoa(i), "v")
					}
					for k, v := range tt.fields {
						r.Header.Set(k, v)
					}
					rec = httptest.NewRecorder()
					h.ServeHTTP(rec, r)
				}
				if rec.Code != tt.want || wire.DontRetry(rec.Header()) != tt.dontRetr {
					t.Errorf("%v among %d others: %d, don't-retry %v; want %d, %v", tt.fields, others, rec.Code, wire.DontRetry(rec.Header()), tt.want, tt.dontRetr)
				}
				if tt.want == 200 && got.Attempt != tt.attempt {
					t.Errorf("%v among %d others: attempt %d, want %d", tt.fields, others, got.Attempt, tt.attempt)
				}
			})
		}
	}
}

// TestWrapRefusalHeadersOwned: each refusal's header values are its own: a
// handler or middleware that edits one in place (a legal edit of an
// http.Header) changes no later refusal.
func TestWrapRefusalHeadersOwned(t *testing.T) {
	ctl, err := admission.New(admission.Config{MaxInFlight: 1, MaxQueue: -1, RetryAfterSpread: -1})
	if err != nil {
		t.Fatal(err)
	}
	hold, _ := ctl.Acquire(context.Background(), 1)
	defer hold.Release()
	h := ctl.Wrap(http.NotFoundHandler())
	first := httptest.NewRecorder()
	h.ServeHTTP(first, httptest.NewRequest(http.MethodGet, "http://p.test/", nil))
	if first.Code != http.StatusServiceUnavailable {
		t.Fatalf("refusal answered %d", first.Code)
	}
	for _, k := range []string{"Retry-After", wire.CapacityHeader, "Content-Type", "Stormguard-Retry"} {
		if v := first.Header()[k]; len(v) > 0 {
			v[0] = "edited"
		}
	}
	second := httptest.NewRecorder()
	h.ServeHTTP(second, httptest.NewRequest(http.MethodGet, "http://p.test/", nil))
	if got := second.Header().Get("Retry-After"); got != "1" {
		t.Errorf("next refusal's Retry-After %q, want 1", got)
	}
	if got := second.Header().Get(wire.CapacityHeader); got != "1" {
		t.Errorf("next refusal's capacity hint %q, want 1", got)
	}
	if got := second.Header().Get("Content-Type"); got != "text/plain; charset=utf-8" {
		t.Errorf("next refusal's Content-Type %q", got)
	}
}
