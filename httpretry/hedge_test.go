package httpretry_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/budget"
	"github.com/stormguard/stormguard/httpretry"
	"github.com/stormguard/stormguard/limit"
	"github.com/stormguard/stormguard/observe"
	"github.com/stormguard/stormguard/retry"
	"github.com/stormguard/stormguard/wire"
)

// legBase is a base RoundTripper for hedging tests, in a synctest bubble:
// its i-th request (from 0) answers after the delay and with the status
// answer(i) gives, or ends with its context's error when canceled first
// (unless deaf: then it answers anyway). It counts the requests in
// flight and the response bodies not yet closed.
type legBase struct {
	answer func(i int) (time.Duration, int)
	header func(i int) http.Header // nil: none (but Retry-After: 2 on a 503)
	deaf   bool
	watch  bool // a body's reads fail once its request's context ends, as net/http's do

	mu       sync.Mutex
	reqs     []*http.Request
	inflight atomic.Int64
	open     atomic.Int64
}

func (b *legBase) RoundTrip(r *http.Request) (*http.Response, error) {
	b.mu.Lock()
	i := len(b.reqs)
	b.reqs = append(b.reqs, r)
	b.mu.Unlock()
	b.inflight.Add(1)
	defer b.inflight.Add(-1)
	d, code := b.answer(i)
	t := time.NewTimer(d)
	defer t.Stop()
	if b.deaf {
		<-t.C
	} else {
		select {
		case <-t.C:
		case <-r.Context().Done():
			return nil, r.Context().Err()
		}
	}
	b.open.Add(1)
	h := http.Header{}
	if code == http.StatusServiceUnavailable {
		h.Set("Retry-After", "2")
	}
	if b.header != nil {
		for k, v := range b.header(i) {
			h[k] = v
		}
	}
	return &http.Response{StatusCode: code, Header: h, Request: r,
		Body: &countedBody{Reader: strings.NewReader("leg" + strconv.Itoa(i)), open: &b.open, ctx: b.watched(r)}}, nil
}

// sent returns the requests the base got.
func (b *legBase) sent() []*http.Request {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]*http.Request(nil), b.reqs...)
}

// delays answers 200 after ds[i] (the last one for any later request).
func delays(ds ...time.Duration) func(int) (time.Duration, int) {
	return func(i int) (time.Duration, int) { return ds[min(i, len(ds)-1)], http.StatusOK }
}

type countedBody struct {
	io.Reader
	open   *atomic.Int64
	closed atomic.Bool
	ctx    context.Context // nil: reads ignore the request's context
}

func (b *countedBody) Read(p []byte) (int, error) {
	if b.ctx != nil && b.ctx.Err() != nil {
		return 0, b.ctx.Err()
	}
	return b.Reader.Read(p)
}

// watched returns the context r's body reads watch, nil if none.
func (b *legBase) watched(r *http.Request) context.Context {
	if b.watch {
		return r.Context()
	}
	return nil
}

func (b *countedBody) Close() error {
	if b.closed.CompareAndSwap(false, true) {
		b.open.Add(-1)
	}
	return nil
}

// hedgeGet sends a GET through tr and returns its body, the time it took
// until the response, and closes the body.
func hedgeGet(t *testing.T, tr http.RoundTripper, ctx context.Context) (string, time.Duration, error) {
	t.Helper()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://example.test/x", nil)
	start := time.Now()
	resp, err := tr.RoundTrip(req)
	took := time.Since(start)
	if err != nil {
		return "", took, err
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return string(b), took, nil
}

// settle lets every leg end and checks that none is left in flight and
// every body was closed.
func (b *legBase) settle(t *testing.T) {
	t.Helper()
	time.Sleep(time.Minute)
	synctest.Wait()
	if n, o := b.inflight.Load(), b.open.Load(); n != 0 || o != 0 {
		t.Errorf("after the call: %d requests in flight, %d bodies open; want 0 and 0", n, o)
	}
}

func attemptHeaders(reqs []*http.Request) []string {
	var hs []string
	for _, r := range reqs {
		hs = append(hs, r.Header.Get(wire.AttemptHeader))
	}
	return hs
}

func TestHedgeWinsAtDelay(t *testing.T) {
	tests := []struct {
		name     string
		max      int
		answer   func(int) (time.Duration, int)
		deaf     bool
		wantBody string
		wantTook time.Duration
		wantHdrs string
	}{
		{"hedge at 50ms answers in 10ms", 1, delays(time.Second, 10*time.Millisecond), false, "leg1", 60 * time.Millisecond, ",2"},
		{"attempt answers before the delay", 1, delays(10*time.Millisecond, time.Millisecond), false, "leg0", 10 * time.Millisecond, ""},
		{"attempt wins against its hedge", 1, delays(80*time.Millisecond, time.Second), false, "leg0", 80 * time.Millisecond, ",2"},
		{"second hedge wins", 2, delays(time.Second, time.Second, 20*time.Millisecond), false, "leg2", 120 * time.Millisecond, ",2,3"},
		{"hedge answers after the winner (deaf base)", 1, delays(80*time.Millisecond, time.Second), true, "leg0", 80 * time.Millisecond, ",2"},
		// The first copy runs on the caller's goroutine: the hedge's answer
		// comes back when the canceled first copy returns, at once over a
		// base that honours the request's context, when it answers over one
		// that does not; its answer is then closed.
		{"first copy answers after the winner (deaf base)", 1, delays(100*time.Millisecond, 40*time.Millisecond), true, "leg1", 100 * time.Millisecond, ",2"},
		{"failed hedge, attempt still wins", 1, func(i int) (time.Duration, int) {
			if i == 1 {
				return time.Millisecond, http.StatusBadGateway
			}
			return 200 * time.Millisecond, http.StatusOK
		}, false, "leg0", 200 * time.Millisecond, ",2"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				base := &legBase{answer: tt.answer, deaf: tt.deaf}
				tr, err := httpretry.NewTransport(base, httpretry.WithHedging(50*time.Millisecond, 0, tt.max))
				if err != nil {
					t.Fatal(err)
				}
				body, took, err := hedgeGet(t, tr, context.Background())
				if err != nil || body != tt.wantBody || took != tt.wantTook {
					t.Errorf("GET = %q after %v, %v; want %q after %v", body, took, err, tt.wantBody, tt.wantTook)
				}
				if got := strings.Join(attemptHeaders(base.sent()), ","); got != tt.wantHdrs {
					t.Errorf("attempt headers %q, want %q", got, tt.wantHdrs)
				}
				hedges := strings.Count(tt.wantHdrs, ",")
				if r := tr.Hosts()["example.test"].Budget.(*budget.Budget).Stats().Retries; r != hedges {
					t.Errorf("budget withdrawals %d, want %d (one per hedge)", r, hedges)
				}
				base.settle(t)
			})
		})
	}
}

// refuser is a retry budget that refuses every withdrawal, counting them.
type refuser struct{ asked atomic.Int64 }

func (r *refuser) Deposit()       {}
func (r *refuser) Withdraw() bool { r.asked.Add(1); return false }

func TestHedgeHeldBack(t *testing.T) {
	tests := []struct {
		name  string
		opts  func(t *testing.T) []httpretry.Option
		setup func(t *testing.T, tr *httpretry.Transport, base *legBase)
	}{
		{"no budget", func(*testing.T) []httpretry.Option { return []httpretry.Option{httpretry.WithBudget(nil)} }, nil},
		{"supplied nil *budget.Budget", func(*testing.T) []httpretry.Option {
			return []httpretry.Option{httpretry.WithGuards(func(string) (retry.Guards, error) {
				return retry.Guards{Budget: (*budget.Budget)(nil)}, nil // a typed nil counts as none, as in retry.WithGuards
			})}
		}, nil},
		{"budget refuses", func(t *testing.T) []httpretry.Option {
			r := &refuser{}
			t.Cleanup(func() {
				if r.asked.Load() != 1 {
					t.Errorf("budget asked %d times, want 1", r.asked.Load())
				}
			})
			return []httpretry.Option{httpretry.WithGuards(func(string) (retry.Guards, error) { return retry.Guards{Budget: r}, nil })}
		}, nil},
		{"breaker half-open", func(t *testing.T) []httpretry.Option {
			return []httpretry.Option{httpretry.WithBreaker(&breaker.Config{MinCalls: 1, OpenFor: time.Second, MaxOpenFor: time.Second})}
		}, func(t *testing.T, tr *httpretry.Transport, base *legBase) {
			// One 502 trips it; a second later it is half-open.
			base.answer = func(i int) (time.Duration, int) {
				if i == 0 {
					return time.Millisecond, http.StatusBadGateway
				}
				return delays(time.Second, 10*time.Millisecond)(i - 1)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
			defer cancel()
			hedgeGet(t, tr, ctx)
			if s := tr.Hosts()["example.test"].Breaker.State(); s != breaker.Open {
				t.Fatalf("breaker %v after a 502, want open", s)
			}
			time.Sleep(2 * time.Second)
		}},
		{"limiter at its limit", func(*testing.T) []httpretry.Option {
			return []httpretry.Option{httpretry.WithLimit(&limit.Config{Max: 1})}
		}, nil},
		{"a 502 with a Retry-After", nil, pushedBackBy(http.StatusBadGateway, http.Header{"Retry-After": {"2"}})},
		{"a 500 with a don't-retry mark", nil, pushedBackBy(http.StatusInternalServerError, http.Header{"Stormguard-Retry": {"no"}})},
		{"a 504 with a don't-retry mark", nil, pushedBackBy(http.StatusGatewayTimeout, http.Header{"Stormguard-Retry": {"no"}})},
		{"host pushed back", nil, func(t *testing.T, tr *httpretry.Transport, base *legBase) {
			base.answer = func(i int) (time.Duration, int) {
				if i == 0 {
					return time.Millisecond, http.StatusServiceUnavailable // Retry-After: 2
				}
				return delays(time.Second, 10*time.Millisecond)(i - 1)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
			defer cancel()
			hedgeGet(t, tr, ctx)
			time.Sleep(4 * time.Second) // within the 5 s hold
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				base := &legBase{answer: delays(time.Second, 10*time.Millisecond)}
				opts := []httpretry.Option{httpretry.WithHedging(50*time.Millisecond, 0, 1)}
				if tt.opts != nil {
					opts = append(opts, tt.opts(t)...)
				}
				tr, err := httpretry.NewTransport(base, opts...)
				if err != nil {
					t.Fatal(err)
				}
				before := 0
				if tt.setup != nil {
					tt.setup(t, tr, base)
					before = len(base.sent())
				}
				body, took, err := hedgeGet(t, tr, context.Background())
				if err != nil || took != time.Second || len(base.sent())-before != 1 {
					t.Errorf("GET = %q after %v, %v, %d requests; want the attempt's answer after 1s, no hedge", body, took, err, len(base.sent())-before)
				}
				base.settle(t)
			})
		})
	}
}

// pushedBackBy is a TestHedgeHeldBack setup: the host's first answer is
// code with header h, and the GET under test comes 4 s later, within the
// 5 s hold.
func pushedBackBy(code int, h http.Header) func(t *testing.T, tr *httpretry.Transport, base *legBase) {
	return func(t *testing.T, tr *httpretry.Transport, base *legBase) {
		base.answer = func(i int) (time.Duration, int) {
			if i == 0 {
				return time.Millisecond, code
			}
			return delays(time.Second, 10*time.Millisecond)(i - 1)
		}
		base.header = func(i int) http.Header {
			if i == 0 {
				return h
			}
			return nil
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
		defer cancel()
		hedgeGet(t, tr, ctx)
		// The call may have retried within its 10 ms (a 502's backoff can
		// draw less): the GET under test gets the next answer whatever the
		// setup sent (it once got the hedge's, and the test flaked).
		off := len(base.sent())
		base.answer = func(i int) (time.Duration, int) { return delays(time.Second, 10*time.Millisecond)(i - off) }
		time.Sleep(4 * time.Second)
	}
}

// strictBudget is a caller's Budget type whose methods read their
// receiver: a nil one panics in them.
type strictBudget struct{ n int }

func (b *strictBudget) Deposit()       { b.n++ }
func (b *strictBudget) Withdraw() bool { b.n--; return true }

// TestHedgeTypedNilBudgetOfAnotherType: a supplied nil pointer of a type
// other than *budget.Budget is a budget like any value (its methods are
// called, as retry.Guards says): one that reads its receiver panics on the
// caller's goroutine at the call's deposit, before any copy is sent, never
// on a goroutine of the transport's.
func TestHedgeTypedNilBudgetOfAnotherType(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		base := &legBase{answer: delays(time.Second, 10*time.Millisecond)}
		tr, err := httpretry.NewTransport(base, httpretry.WithHedging(50*time.Millisecond, 0, 1),
			httpretry.WithGuards(func(string) (retry.Guards, error) { return retry.Guards{Budget: (*strictBudget)(nil)}, nil }))
		if err != nil {
			t.Fatal(err)
		}
		func() {
			defer func() {
				if recover() == nil {
					t.Error("RoundTrip with a nil *strictBudget did not panic")
				}
			}()
			hedgeGet(t, tr, context.Background())
		}()
		if n := len(base.sent()); n != 0 {
			t.Errorf("%d requests sent before the panic, want 0", n)
		}
		base.settle(t)
	})
}

// TestHedgeAfterPushbackHold: 5 s after a 503, hedges go again.
func TestHedgeAfterPushbackHold(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		base := &legBase{answer: func(i int) (time.Duration, int) {
			if i == 0 {
				return time.Millisecond, http.StatusServiceUnavailable
			}
			return delays(time.Second, 10*time.Millisecond)(i - 1)
		}}
		tr, err := httpretry.NewTransport(base, httpretry.WithHedging(50*time.Millisecond, 0, 1), httpretry.WithRetry(retry.WithMaxAttempts(1)))
		if err != nil {
			t.Fatal(err)
		}
		hedgeGet(t, tr, context.Background())
		time.Sleep(5 * time.Second)
		if body, took, err := hedgeGet(t, tr, context.Background()); err != nil || body != "leg2" || took != 60*time.Millisecond {
			t.Errorf("GET 5 s after a 503 = %q after %v, %v; want the hedge's answer after 60ms", body, took, err)
		}
		base.settle(t)
	})
}

// TestHedgeNotForWrites: a POST with a key, retryable, is never hedged.
func TestHedgeNotForWrites(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		base := &legBase{answer: delays(time.Second, 10*time.Millisecond)}
		tr, _ := httpretry.NewTransport(base, httpretry.WithHedging(50*time.Millisecond, 0, 1))
		req, _ := http.NewRequest(http.MethodPost, "http://example.test/x", strings.NewReader("x"))
		req.Header.Set("Idempotency-Key", "k1")
		resp, err := tr.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if n := len(base.sent()); n != 1 {
			t.Errorf("POST sent %d times, want 1", n)
		}
		base.settle(t)
	})
}

// TestHedgeLearnedDelay: with delay 0 the hedge goes at the p95 of the
// host's recent answers (here all 10ms: within a bucket, 12.5%).
func TestHedgeLearnedDelay(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		base := &legBase{answer: delays(10 * time.Millisecond)}
		tr, _ := httpretry.NewTransport(base, httpretry.WithHedging(0, 0.95, 1))
		for range 19 {
			hedgeGet(t, tr, context.Background())
		}
		n := len(base.sent())
		base.answer = delays(time.Second)
		// Too few samples: no hedge.
		if _, took, _ := hedgeGet(t, tr, context.Background()); took != time.Second || len(base.sent()) != n+1 {
			t.Fatalf("with 19 samples: took %v, %d requests; want 1s, no hedge", took, len(base.sent())-n)
		}
		base.answer = delays(10 * time.Millisecond)
		for range 80 {
			hedgeGet(t, tr, context.Background())
		}
		time.Sleep(time.Second) // the cached quantile refreshes
		n = len(base.sent())
		base.answer = func(i int) (time.Duration, int) {
			if i == n {
				return time.Second, http.StatusOK
			}
			return 10 * time.Millisecond, http.StatusOK
		}
		_, took, err := hedgeGet(t, tr, context.Background())
		if err != nil || len(base.sent()) != n+2 || took < 20*time.Millisecond || took > 22*time.Millisecond {
			t.Errorf("slow attempt: took %v with %d requests, %v; want a hedge at about 10ms answering 10ms later", took, len(base.sent())-n, err)
		}
		base.settle(t)
	})
}

// TestHedgeCallerCancels: the caller's cancel ends every leg.
func TestHedgeCallerCancels(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		base := &legBase{answer: delays(time.Hour)}
		tr, _ := httpretry.NewTransport(base, httpretry.WithHedging(50*time.Millisecond, 0, 2))
		ctx, cancel := context.WithCancel(context.Background())
		time.AfterFunc(120*time.Millisecond, cancel)
		_, took, err := hedgeGet(t, tr, ctx)
		if !errors.Is(err, context.Canceled) || took != 120*time.Millisecond || len(base.sent()) != 3 {
			t.Errorf("canceled GET = %v after %v with %d requests; want canceled after 120ms, 3 requests", err, took, len(base.sent()))
		}
		base.settle(t)
	})
}

func TestHedgeObserved(t *testing.T) {
	for _, deaf := range []bool{false, true} {
		t.Run("deaf="+strconv.FormatBool(deaf), func(t *testing.T) { testHedgeObserved(t, deaf) })
	}
}

// testHedgeObserved: the first copy answers at 100 ms and wins; the hedge,
// sent at 50 ms, is canceled. A deaf base answers the hedge anyway, 200
// at 1.05 s: it lost the race all the same, and ends "canceled" too.
func testHedgeObserved(t *testing.T, deaf bool) {
	synctest.Test(t, func(t *testing.T) {
		var mu sync.Mutex
		var got []string
		obs := observe.Func(func(ctx context.Context, e observe.Event) {
			if e.Kind == observe.AttemptStart || e.Kind == observe.AttemptEnd {
				mu.Lock()
				got = append(got, string(e.Kind)+" "+strconv.Itoa(e.Attempt)+" "+strconv.FormatBool(e.Hedge)+" "+e.Outcome)
				mu.Unlock()
			}
		})
		base := &legBase{answer: delays(100*time.Millisecond, time.Second), deaf: deaf}
		tr, _ := httpretry.NewTransport(base, httpretry.WithHedging(50*time.Millisecond, 0, 1), httpretry.WithObserver(obs))
		hedgeGet(t, tr, context.Background())
		base.settle(t)
		synctest.Wait()
		// The loser's end and the race's run on different goroutines: in
		// either order.
		slices.Sort(got)
		want := "attempt-end 1 false success|attempt-end 2 true canceled|attempt-start 1 false |attempt-start 2 true "
		if s := strings.Join(got, "|"); s != want {
			t.Errorf("events\n%s\nwant\n%s", s, want)
		}
	})
}

func TestWithHedgingBadValues(t *testing.T) {
	for _, o := range []httpretry.Option{
		httpretry.WithHedging(-time.Second, 0, 1),
		httpretry.WithHedging(0, 1, 1),
		httpretry.WithHedging(0, -0.5, 1),
		httpretry.WithHedging(0, 0, 9),
		httpretry.WithHedging(0, 0, -1),
	} {
		if _, err := httpretry.NewTransport(nil, o); err == nil || !strings.Contains(err.Error(), "hedge") {
			t.Errorf("NewTransport with a bad hedging option = %v, want an error naming hedging", err)
		}
	}
}

// TestHedgeConcurrent: many callers racing at once through one transport
// leave nothing in flight and no body open, and hedges stay within the
// budget.
func TestHedgeConcurrent(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		base := &legBase{answer: func(i int) (time.Duration, int) {
			switch i % 10 {
			case 0:
				return time.Second, http.StatusOK
			case 7:
				return 30 * time.Millisecond, http.StatusBadGateway
			}
			return time.Duration(i%7+1) * 10 * time.Millisecond, http.StatusOK
		}}
		tr, _ := httpretry.NewTransport(base, httpretry.WithHedging(0, 0.9, 2), httpretry.WithRetry(retry.WithBackoff(smallBackoff(t))))
		var wg sync.WaitGroup
		var failed atomic.Int64
		for g := range 20 {
			wg.Go(func() {
				for range 25 {
					if _, _, err := hedgeGet(t, tr, context.Background()); err != nil {
						failed.Add(1)
					}
					time.Sleep(time.Duration(g) * time.Millisecond)
				}
			})
		}
		wg.Wait()
		st := tr.Hosts()["example.test"].Budget.(*budget.Budget).Stats()
		if float64(st.Retries) > st.Limit {
			t.Errorf("budget: %d retries and hedges over a limit of %.1f", st.Retries, st.Limit)
		}
		t.Logf("500 GETs: %d requests sent, %d failed, budget %+v", len(base.sent()), failed.Load(), st)
		base.settle(t)
	})
}

// TestHedgeTakesALimiterSlot: with room under the limit a hedge goes, and
// every slot comes back (the limiter admits a full limit afterwards).
func TestHedgeTakesALimiterSlot(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		base := &legBase{answer: delays(time.Second, 10*time.Millisecond)}
		tr, _ := httpretry.NewTransport(base, httpretry.WithHedging(50*time.Millisecond, 0, 1), httpretry.WithLimit(&limit.Config{Max: 2}))
		if body, took, err := hedgeGet(t, tr, context.Background()); err != nil || body != "leg1" || took != 60*time.Millisecond {
			t.Errorf("GET = %q after %v, %v; want the hedge's answer after 60ms", body, took, err)
		}
		base.settle(t)
		lim := tr.Hosts()["example.test"].Limiter
		var ps []limit.Permit
		for range lim.Limit() {
			p, err := lim.Acquire(context.Background())
			if err != nil {
				t.Fatalf("after the race the limiter refuses a slot within its limit %d: %v", lim.Limit(), err)
			}
			ps = append(ps, p)
		}
		for _, p := range ps {
			lim.Release(p, false)
		}
	})
}

// TestHedgeBodyOpenAcrossRaces: a response whose first copy answered
// before the delay stays readable while later races of the same transport
// (reusing its race state) cancel their first copies, over a base whose
// bodies fail once their request's context ends.
func TestHedgeBodyOpenAcrossRaces(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		// Request 0 answers in 10 ms; then each race's first copy (odd)
		// in 1 s, its hedge (even) in 10 ms.
		base := &legBase{answer: func(i int) (time.Duration, int) {
			if i%2 == 1 {
				return time.Second, http.StatusOK
			}
			return 10 * time.Millisecond, http.StatusOK
		}, watch: true}
		tr, _ := httpretry.NewTransport(base, httpretry.WithHedging(50*time.Millisecond, 0, 1))
		req, _ := http.NewRequest(http.MethodGet, "http://example.test/x", nil)
		held, err := tr.RoundTrip(req) // leg0, before the delay: no race
		if err != nil {
			t.Fatal(err)
		}
		for range 5 { // each: the first copy (1 s) loses to its hedge (10 ms)
			if body, took, err := hedgeGet(t, tr, context.Background()); err != nil || !strings.HasPrefix(body, "leg") || body == "leg0" || took != 60*time.Millisecond {
				t.Errorf("race = %q after %v, %v; want a hedge's answer after 60ms", body, took, err)
			}
		}
		b, err := io.ReadAll(held.Body)
		held.Body.Close()
		if err != nil || string(b) != "leg0" {
			t.Errorf("body held open across 5 races = %q, %v; want \"leg0\"", b, err)
		}
		base.settle(t)
	})
}

// TestHedgeBasePanics: a base that panics on the first copy ends the race
// as the panic leaves RoundTrip: no hedge after it, and one already sent
// is canceled and closed.
func TestHedgeBasePanics(t *testing.T) {
	for _, tt := range []struct {
		name     string
		at       time.Duration
		wantSent int64
	}{
		{"before the delay", 10 * time.Millisecond, 1},
		{"after a hedge went", 100 * time.Millisecond, 2},
	} {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				base := &legBase{answer: delays(time.Second)}
				var n atomic.Int64
				rt := roundTripperFunc(func(r *http.Request) (*http.Response, error) {
					if n.Add(1) == 1 {
						time.Sleep(tt.at)
						panic("base")
					}
					return base.RoundTrip(r)
				})
				tr, _ := httpretry.NewTransport(rt, httpretry.WithHedging(50*time.Millisecond, 0, 1))
				func() {
					defer func() {
						if recover() == nil {
							t.Error("RoundTrip did not panic")
						}
					}()
					hedgeGet(t, tr, context.Background())
				}()
				base.settle(t)
				if got := n.Load(); got != tt.wantSent {
					t.Errorf("%d requests sent, want %d", got, tt.wantSent)
				}
			})
		})
	}
}

// hedgeSlowBase answers a race's first copy in 60 ms and its hedge (the
// request numbered 2 on the wire) in 1 s; a canceled request takes a
// millisecond to return, as a transport closing a connection does.
type hedgeSlowBase struct {
	sent, inflight atomic.Int64
}

func (b *hedgeSlowBase) RoundTrip(r *http.Request) (*http.Response, error) {
	b.sent.Add(1)
	b.inflight.Add(1)
	defer b.inflight.Add(-1)
	d := 60 * time.Millisecond
	if r.Header.Get(wire.AttemptHeader) == "2" {
		d = time.Second
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-r.Context().Done():
		time.Sleep(time.Millisecond)
		return nil, r.Context().Err()
	}
	return &http.Response{StatusCode: http.StatusOK, Header: http.Header{}, Request: r, Body: io.NopCloser(strings.NewReader("first"))}, nil
}

// TestHedgeLoserIsNoDrop: a hedge that loses the race is released to the
// destination's limiter as no drop, also when its cancellation lands after
// the caller has gone (the caller cancels its context as it returns, as
// callers with a deadline do). On the code before, such a loser counted as
// a drop, and each one cut a hedging client's limit: live, in the tail
// scenario at 50% load, the limit fell to 5 and requests to half the
// offered rate for seconds.
func TestHedgeLoserIsNoDrop(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		base := &hedgeSlowBase{}
		tr, _ := httpretry.NewTransport(base, httpretry.WithHedging(50*time.Millisecond, 0, 1), httpretry.WithLimit(&limit.Config{Max: 100}))
		for i := range 40 {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			body, took, err := hedgeGet(t, tr, ctx)
			cancel()
			if err != nil || body != "first" || took != 60*time.Millisecond {
				t.Fatalf("race %d = %q after %v, %v; want the first copy's answer after 60ms", i, body, took, err)
			}
			time.Sleep(10 * time.Millisecond) // the hedge's cancellation lands
		}
		if got := tr.Hosts()["example.test"].Limiter.Limit(); got < 10 {
			t.Errorf("after 40 races whose hedges lost, the limit is %d, below the cold limit of 10: losers counted as drops", got)
		}
		if n := base.sent.Load(); n < 45 {
			t.Errorf("%d requests sent, want at least 45: 40 first copies and 5 hedges (the due-share bound's floor)", n)
		}
		if n := base.inflight.Load(); n != 0 {
			t.Errorf("%d requests still in flight", n)
		}
	})
}
