package httpretry_test

import (
	"context"
	"net/http"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/budget"
	"github.com/stormguard/stormguard/httpretry"
	"github.com/stormguard/stormguard/limit"
	"github.com/stormguard/stormguard/retry"
	"github.com/stormguard/stormguard/wire"
)

type rhGrant struct{ withdrawals atomic.Int64 }

func (*rhGrant) Deposit() {}
func (g *rhGrant) Withdraw() bool {
	g.withdrawals.Add(1)
	return true
}

// rhBase: a first copy (no attempt header) hangs until its context ends; a
// hedge answers 200 at once. It records when each hedge came (since t0).
type rhBase struct {
	t0     time.Time
	mu     sync.Mutex
	hedges []time.Duration
	nums   []string
}

func (b *rhBase) RoundTrip(r *http.Request) (*http.Response, error) {
	if n := r.Header.Get(wire.AttemptHeader); n != "" {
		b.mu.Lock()
		b.hedges = append(b.hedges, time.Since(b.t0))
		b.nums = append(b.nums, n)
		b.mu.Unlock()
		return &http.Response{StatusCode: 200, Header: http.Header{}, Body: http.NoBody, Request: r}, nil
	}
	<-r.Context().Done()
	return nil, r.Context().Err()
}

// sixRaces starts 6 GETs at once through tr (fixed delay): at the delay
// the first 5 get their hedge (the bound's floor) and win; the sixth is
// held by the due-share bound (6 races in flight past their delay, 6 of 6
// due in the second). It returns the hedges' times, sorted.
func sixRaces(t *testing.T, delay time.Duration) ([]time.Duration, *rhGrant) {
	t.Helper()
	b := &rhBase{t0: time.Now()}
	g := &rhGrant{}
	tr, err := httpretry.NewTransport(b, httpretry.WithHedging(delay, 0.95, 1), httpretry.WithLimit(nil),
		httpretry.WithGuards(func(string) (retry.Guards, error) { return retry.Guards{Budget: g}, nil }))
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for range 6 {
		wg.Go(func() {
			req, _ := http.NewRequestWithContext(context.Background(), http.MethodGet, "http://rh.test/x", nil)
			resp, err := tr.RoundTrip(req)
			if err != nil {
				t.Errorf("GET: %v", err)
				return
			}
			resp.Body.Close()
		})
	}
	wg.Wait()
	b.mu.Lock()
	defer b.mu.Unlock()
	h := append([]time.Duration(nil), b.hedges...)
	sort.Slice(h, func(i, j int) bool { return h[i] < h[j] })
	return h, g
}

// WithHedging: "a race held back looks again every half delay for three
// delays, then after one delay, doubling, while its first copy is
// unanswered and a hedge could go but for the bound, and its hedge goes
// once the bound allows". Delay 100 ms: the held race looks at 150, 200,
// ..., 400 ms (half delays), then 500, 700, 1100, 1900 ms. The per-second
// share (6 of 6 due at 100 ms) allows again from about 1.17 s: the first
// look after that is 1.9 s.
func TestAttackRehedgeHeldLookSchedule(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h, g := sixRaces(t, 100*time.Millisecond)
		if len(h) != 6 {
			t.Fatalf("hedges at %v, want 6", h)
		}
		for _, d := range h[:5] {
			if d != 100*time.Millisecond {
				t.Errorf("first 5 hedges at %v, want 100ms", h[:5])
				break
			}
		}
		if h[5] != 1900*time.Millisecond {
			t.Errorf("held race's hedge at %v, want 1.9s (the first look of the documented schedule once the bound allows)", h[5])
		}
		if w := g.withdrawals.Load(); w != 6 {
			t.Errorf("%d withdrawals for 6 hedges", w)
		}
	})
}

// The same with a fixed delay of 4 minutes: the held race looks again a
// minute later (half a delay, at most a minute apart), at 5 min: the bound
// allows by then.
func TestAttackRehedgeHeldLookLongDelay(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h, _ := sixRaces(t, 4*time.Minute)
		if len(h) != 6 {
			t.Fatalf("hedges at %v, want 6", h)
		}
		if h[5] != 5*time.Minute {
			t.Errorf("held race's hedge at %v, want 5m0s: its first look is half a delay after its delay, at most a minute", h[5])
		}
	})
}

// rhPushBase is rhBase with a POST answered 503 at once (a push-back).
type rhPushBase struct{ rhBase }

func (b *rhPushBase) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.Method == http.MethodPost {
		return &http.Response{StatusCode: 503, Header: http.Header{}, Body: http.NoBody, Request: r}, nil
	}
	return b.rhBase.RoundTrip(r)
}

// WithHedging: "a held race that finds its hedge held for another reason
// as well (a push-back, ...) stops looking, as a race not held gets no
// hedge then". A push-back (a 503 to a POST, at 120 ms) holds every hedge
// for 5 s while one race is held: it gets no hedge, also after the
// push-back, and its first copy's 30 s run out.
func TestAttackRehedgeHeldRaceAfterPushback(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := &rhPushBase{rhBase{t0: time.Now()}}
		g := &rhGrant{}
		tr, err := httpretry.NewTransport(b, httpretry.WithHedging(100*time.Millisecond, 0.95, 1), httpretry.WithLimit(nil),
			httpretry.WithGuards(func(string) (retry.Guards, error) { return retry.Guards{Budget: g}, nil }))
		if err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		var failed atomic.Int64
		for range 6 {
			wg.Go(func() {
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				defer cancel()
				req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://rh.test/x", nil)
				resp, err := tr.RoundTrip(req)
				if err != nil {
					failed.Add(1)
					return
				}
				resp.Body.Close()
			})
		}
		wg.Go(func() {
			time.Sleep(120 * time.Millisecond)
			req, _ := http.NewRequest(http.MethodPost, "http://rh.test/push", nil)
			resp, err := tr.RoundTrip(req)
			if err == nil {
				resp.Body.Close()
			}
		})
		wg.Wait()
		b.mu.Lock()
		defer b.mu.Unlock()
		if len(b.hedges) != 5 || failed.Load() != 1 {
			t.Errorf("hedges at %v, %d GETs ran out of time; want the floor's 5 and the held race's GET (it stopped looking at the push-back)", b.hedges, failed.Load())
		}
	})
}

type rhSlowBase struct{}

func (rhSlowBase) RoundTrip(r *http.Request) (*http.Response, error) {
	time.Sleep(900 * time.Millisecond)
	return &http.Response{StatusCode: 200, Header: http.Header{}, Body: http.NoBody, Request: r}, nil
}

// The transport's breaker and limiter (retry.WithGuards: "success (nil
// error) is a success (unless it took the breaker's SlowCall or longer)";
// budget: "Each call deposits once, just before its first attempt runs").
// Three GETs at once, a limiter of one slot, answers of 900 ms (SlowCall
// 1 s): every answer is a 200 within SlowCall.
func TestAttackRehedgeTransportLimiterQueueTripsBreaker(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr, err := httpretry.NewTransport(rhSlowBase{}, httpretry.WithLimit(&limit.Config{Max: 1}),
			httpretry.WithBreaker(&breaker.Config{SlowCall: time.Second, ConsecutiveFailures: 2}), httpretry.WithTimeout(time.Minute))
		if err != nil {
			t.Fatal(err)
		}
		getAtOnce(t, tr, "http://slow.test/x", 3)
		s := tr.Hosts()["slow.test"].Breaker.Snapshot()
		if s.State != breaker.Closed {
			t.Errorf("three 200s of 900 ms each (SlowCall 1 s): breaker %v (the wait for the limiter's slot counted in each call's time)", s.State)
		}
	})
}

type rhGate struct{}

func (b rhGate) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.URL.Path == "/hold" {
		time.Sleep(12 * time.Second)
	}
	return &http.Response{StatusCode: 200, Header: http.Header{}, Body: http.NoBody, Request: r}, nil
}

// The transport's budget (retry.Guards: "each call deposits once, just
// before its first attempt runs"): a GET that waited 12 s for the only
// limiter slot must be in the budget's 10 s window once it has been sent.
func TestAttackRehedgeTransportDepositAfterLimiterWait(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr, err := httpretry.NewTransport(rhGate{}, httpretry.WithLimit(&limit.Config{Max: 1}), httpretry.WithTimeout(time.Minute))
		if err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		get := func(path string) {
			req, _ := http.NewRequest(http.MethodGet, "http://dep.test"+path, nil)
			resp, err := tr.RoundTrip(req)
			if err != nil {
				t.Errorf("GET: %v", err)
				return
			}
			resp.Body.Close()
		}
		wg.Go(func() { get("/hold") })
		synctest.Wait()
		wg.Go(func() { get("/after") })
		wg.Wait() // both done at 12 s
		st := tr.Hosts()["dep.test"].Budget.(interface{ Stats() budget.Stats }).Stats()
		if st.Requests != 1 {
			t.Errorf("at 12 s the window holds %d requests, want 1 (the GET sent at 12 s after waiting for a slot)", st.Requests)
		}
	})
}

// The held race of sixRaces through the transport's own budget (default):
// every hedge is one withdrawal ("Every hedge is a withdrawal from the
// host's retry budget"), each carries attempt number 2, and the held race's
// look does not withdraw while the bound refuses.
func TestAttackRehedgeHeldRaceBudgetAndNumbers(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := &rhBase{t0: time.Now()}
		tr, err := httpretry.NewTransport(b, httpretry.WithHedging(100*time.Millisecond, 0.95, 1), httpretry.WithLimit(nil))
		if err != nil {
			t.Fatal(err)
		}
		getAtOnce(t, tr, "http://rh.test/x", 6)
		st := tr.Hosts()["rh.test"].Budget.(interface{ Stats() budget.Stats }).Stats()
		b.mu.Lock()
		defer b.mu.Unlock()
		if len(b.hedges) != 6 || st.Retries != 6 || st.Requests != 6 {
			t.Errorf("hedges %v, budget %+v: want 6 hedges, 6 retries, 6 requests", b.hedges, st)
		}
		for _, n := range b.nums {
			if n != "2" {
				t.Errorf("hedge numbers %v, want all 2", b.nums)
				break
			}
		}
	})
}

type rhMem struct{ resp http.Response }

func (m *rhMem) RoundTrip(r *http.Request) (*http.Response, error) {
	return &http.Response{StatusCode: 200, Header: m.resp.Header, Body: http.NoBody, Request: r}, nil
}

// WithHedging: "A race whose first copy answers before the delay allocates
// nothing beyond the same attempt without hedging when WithAttemptTimeout
// is set". Several shapes of GET, each through a transport with and one
// without hedging.
func TestAttackRehedgeNoHedgeNeededAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts differ under the race detector")
	}
	type shape struct {
		name string
		mk   func() (*http.Request, context.CancelFunc)
	}
	shapes := []shape{
		{"background", func() (*http.Request, context.CancelFunc) {
			r, _ := http.NewRequest(http.MethodGet, "http://mem.test/x", nil)
			return r, func() {}
		}},
		{"deadline", func() (*http.Request, context.CancelFunc) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
			r, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://mem.test/x", nil)
			return r, cancel
		}},
		{"keyed", func() (*http.Request, context.CancelFunc) {
			r, _ := http.NewRequest(http.MethodGet, "http://mem.test/x", nil)
			r.Header.Set("Idempotency-Key", "k1")
			return r, func() {}
		}},
		{"caller-attempt-mark", func() (*http.Request, context.CancelFunc) {
			r, _ := http.NewRequest(http.MethodGet, "http://mem.test/x", nil)
			r.Header.Set(wire.AttemptHeader, "3")
			return r, func() {}
		}},
		{"head", func() (*http.Request, context.CancelFunc) {
			r, _ := http.NewRequest(http.MethodHead, "http://mem.test/x", nil)
			return r, func() {}
		}},
	}
	for _, s := range shapes {
		t.Run(s.name, func(t *testing.T) {
			var allocs [2]float64
			for i, hedge := range []bool{false, true} {
				opts := []httpretry.Option{httpretry.WithAttemptTimeout(time.Minute)}
				if hedge {
					opts = append(opts, httpretry.WithHedging(time.Second, 0.95, 1))
				}
				tr, err := httpretry.NewTransport(&rhMem{resp: http.Response{Header: http.Header{}}}, opts...)
				if err != nil {
					t.Fatal(err)
				}
				do := func() {
					r, cancel := s.mk()
					resp, err := tr.RoundTrip(r)
					if err != nil {
						t.Fatal(err)
					}
					resp.Body.Close()
					cancel()
				}
				for range 50 {
					do()
				}
				allocs[i] = testing.AllocsPerRun(500, do)
			}
			if allocs[1] > allocs[0] {
				t.Errorf("%s: %v allocs without hedging, %v with (a race its first copy wins)", s.name, allocs[0], allocs[1])
			}
		})
	}
}

// WithHedging: "without it [WithAttemptTimeout], 3 allocations more (4 on
// a cancelable request context, and 3 more on one no context was derived
// from yet)": a fresh context per request, as a server handler gets.
func TestAttackRehedgeNoHedgeNeededAllocsNoAttemptTimeout(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts differ under the race detector")
	}
	for _, c := range []struct {
		name string
		ctx  func() (context.Context, context.CancelFunc)
		max  float64
	}{
		{"background", func() (context.Context, context.CancelFunc) { return context.Background(), func() {} }, 3},
		{"cancelable", func() (context.Context, context.CancelFunc) { return context.WithCancel(context.Background()) }, 7},
		{"deadline", func() (context.Context, context.CancelFunc) {
			return context.WithTimeout(context.Background(), time.Hour)
		}, 7},
	} {
		var allocs [2]float64
		for i, hedge := range []bool{false, true} {
			var opts []httpretry.Option
			if hedge {
				opts = append(opts, httpretry.WithHedging(time.Second, 0.95, 1))
			}
			tr, _ := httpretry.NewTransport(&rhMem{resp: http.Response{Header: http.Header{}}}, opts...)
			do := func() {
				ctx, cancel := c.ctx()
				r, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://mem.test/x", nil)
				resp, err := tr.RoundTrip(r)
				if err != nil {
					t.Fatal(err)
				}
				resp.Body.Close()
				cancel()
			}
			for range 50 {
				do()
			}
			allocs[i] = testing.AllocsPerRun(500, do)
		}
		t.Logf("%s: %v without hedging, %v with", c.name, allocs[0], allocs[1])
		if allocs[1]-allocs[0] > c.max {
			t.Errorf("%s: %v allocs without hedging, %v with: more than %v added", c.name, allocs[0], allocs[1], c.max)
		}
	}
}

// The same with a fixed delay of 1 ms: looks every half delay, at least 1
// ms apart, up to 7 ms, then 8, 10, 14, ..., 1030, 2054 ms: the bound
// allows again from about 1.17 s, so the held race's hedge is due at 2054
// ms.
func TestAttackRehedgeHeldLookShortDelay(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h, _ := sixRaces(t, time.Millisecond)
		if len(h) != 6 {
			t.Fatalf("hedges at %v, want 6", h)
		}
		if h[5] != 2054*time.Millisecond {
			t.Errorf("held race's hedge at %v, want 2.054s (looks 1 ms apart, then 1, 2, 4, ... ms)", h[5])
		}
	})
}
