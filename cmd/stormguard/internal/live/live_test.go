package live_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stormguard/stormguard/cmd/stormguard/internal/live"
)

func TestProviderSchedule(t *testing.T) {
	p, err := live.NewProvider(live.ProviderConfig{FailAt: time.Hour, FailFor: time.Hour, RetryAfter: 1500 * time.Millisecond, Window: time.Second, Horizon: 3 * time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		at   time.Duration
		want bool
	}{{0, false}, {time.Hour - 1, false}, {time.Hour, true}, {2*time.Hour - 1, true}, {2 * time.Hour, false}} {
		if got := p.Failing(tt.at); got != tt.want {
			t.Errorf("Failing(%v) = %v, want %v", tt.at, got, tt.want)
		}
	}
	// Before Start, and an hour before the outage: healthy.
	rec := httptest.NewRecorder()
	p.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/", nil))
	if rec.Code != http.StatusOK {
		t.Errorf("healthy provider answered %d", rec.Code)
	}
	// An outage from t=0: 503 with Retry-After rounded up to whole seconds.
	q, _ := live.NewProvider(live.ProviderConfig{FailFor: time.Hour, RetryAfter: 1500 * time.Millisecond, Window: time.Second, Horizon: time.Minute})
	q.Start()
	rec = httptest.NewRecorder()
	q.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/", nil))
	if rec.Code != http.StatusServiceUnavailable || rec.Header().Get("Retry-After") != "2" {
		t.Errorf("failing provider answered %d with Retry-After %q, want 503 and 2", rec.Code, rec.Header().Get("Retry-After"))
	}
	w := q.Windows()
	if len(w) != 60 || w[0].Attempts != 1 || w[0].Failed != 1 {
		t.Errorf("Windows() = %d windows, first %+v; want 60 and one failed attempt", len(w), w[0])
	}
}

func TestConfigErrors(t *testing.T) {
	for _, c := range []live.ProviderConfig{
		{Window: 0, Horizon: time.Second},
		{Window: time.Second, Horizon: 0},
		{Window: time.Nanosecond, Horizon: time.Hour},
		{Window: time.Second, Horizon: time.Second, FailFor: -1},
	} {
		if _, err := live.NewProvider(c); !errors.Is(err, live.ErrInvalidConfig) {
			t.Errorf("NewProvider(%+v) = %v, want ErrInvalidConfig", c, err)
		}
	}
	if _, err := live.RunFleet(context.Background(), live.FleetConfig{Clients: 0, Every: time.Second, Duration: time.Second}, nil); !errors.Is(err, live.ErrInvalidConfig) {
		t.Errorf("RunFleet with no clients = %v, want ErrInvalidConfig", err)
	}
}

// answered is a [live.Counter] that also counts the requests that got a
// response. A request a client sent reaches the provider, and is counted
// there, unless its call's deadline cancels it on the way, which a loaded
// machine makes happen at random; one that got a response surely did. So
// the provider's count lies between the answered and the sent requests.
type answered struct {
	live.Counter
	answered atomic.Int64
}

func (a *answered) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := a.Counter.RoundTrip(r)
	if err == nil {
		a.answered.Add(1)
	}
	return resp, err
}

// agrees reports whether the provider's count of attempts, counted, is
// within the requests answered and sent, with at least one answered.
func (a *answered) agrees(counted int64) bool {
	n := a.answered.Load()
	return n > 0 && n <= counted && counted <= a.N()
}

// TestRunAccounting runs a tiny real fleet on loopback and checks that what
// the provider counted equals what the clients sent. Nothing here depends
// on timing: the outage may catch more or fewer requests on a slow machine.
func TestRunAccounting(t *testing.T) {
	attempts := &answered{}
	pc := live.ProviderConfig{FailAt: 40 * time.Millisecond, FailFor: 60 * time.Millisecond, RetryAfter: time.Second, Window: 10 * time.Millisecond, Horizon: 2 * time.Second}
	fc := live.FleetConfig{Clients: 8, Every: 20 * time.Millisecond, Duration: 200 * time.Millisecond, Deadline: 2 * time.Second}
	client := &http.Client{Transport: attempts}
	r, err := live.Run(context.Background(), "naive", pc, fc, func(url string, _ int) live.Call {
		return live.Naive(client, url, 10*time.Millisecond, 3)
	})
	if err != nil {
		t.Fatal(err)
	}
	st := r.Stats
	// 8 clients, one request per 20 ms each, for 200 ms: exactly 80.
	if st.Offered != 80 || st.Offered != st.Succeeded+st.Failed {
		t.Errorf("stats %+v: offered must be 80 and equal succeeded+failed", st)
	}
	var sum int64
	for _, w := range r.Windows {
		if w.Attempts != w.OK+w.Failed+w.Shed {
			t.Errorf("window %+v does not add up", w)
		}
		sum += w.Attempts
	}
	if !attempts.agrees(sum) || r.Summary.Attempts != sum {
		t.Errorf("provider counted %d (summary %d), clients sent %d, %d of them answered", sum, r.Summary.Attempts, attempts.N(), attempts.answered.Load())
	}
	if r.Summary.Peak <= 0 || r.Summary.Amplification < 1 {
		t.Errorf("summary %+v: want a positive peak and amplification >= 1", r.Summary)
	}
}

// Random phases are seeded, within the interval, and not the even spread.
func TestRandomPhase(t *testing.T) {
	c := live.FleetConfig{Clients: 50, Every: 2 * time.Second, Duration: 2 * time.Second, RandomPhase: true, Seed: 7}
	starts := func(c live.FleetConfig) []time.Duration {
		// A fleet whose calls return at once: each record's start is its
		// client's phase.
		st, err := live.RunFleet(context.Background(), c, func(context.Context) error { return nil })
		if err != nil {
			t.Fatal(err)
		}
		var xs []time.Duration
		for _, r := range st.Calls {
			xs = append(xs, r.Start)
		}
		slices.Sort(xs)
		return xs
	}
	a := starts(c)
	if len(a) != c.Clients {
		t.Fatalf("%d calls recorded, want %d", len(a), c.Clients)
	}
	if a[len(a)-1] >= c.Every+time.Second/2 { // generous: the machine may be slow
		t.Errorf("last client started at %v, want within the first interval %v", a[len(a)-1], c.Every)
	}
	// Evenly spread clients are 40 ms apart; 50 uniform draws in 2 s have
	// a gap under 20 ms almost surely (the chance of none is below 1e-9).
	minGap := c.Every
	for i := 1; i < len(a); i++ {
		minGap = min(minGap, a[i]-a[i-1])
	}
	if minGap >= 20*time.Millisecond {
		t.Errorf("random phases: smallest gap %v, want the clustering of uniform draws (< 20ms)", minGap)
	}
}

// The fleet records every call, and a middleware's refusals are counted at
// the provider.
func TestRunScenarioAccounting(t *testing.T) {
	var refusedByMW atomic.Int64
	attempts := &answered{}
	pc := live.ProviderConfig{FailAt: 40 * time.Millisecond, FailFor: 60 * time.Millisecond, RetryAfter: time.Second,
		Capacity: 4, Queue: 8, Work: time.Millisecond, Window: 10 * time.Millisecond, Horizon: 2 * time.Second}
	fc := live.FleetConfig{Clients: 8, Every: 20 * time.Millisecond, Duration: 200 * time.Millisecond, Deadline: time.Second, RandomPhase: true, Seed: 1}
	client := &http.Client{Transport: attempts}
	keys := live.NewKeys()
	var n atomic.Int64
	r, err := live.RunScenario(context.Background(), live.Scenario{
		Name: "every third refused", Provider: pc, Fleet: fc,
		Classify: func(err error) string {
			var se *live.StatusError
			if errors.As(err, &se) && se.Header.Get("Content-Type") != "" {
				return strconv.Itoa(se.Code)
			}
			return "other"
		},
		NewCall: func(url string, _ int) live.Call {
			return live.Loop(func() func(context.Context) error {
				key := keys.Next()
				return func(ctx context.Context) error {
					req, err := live.NewPayment(ctx, url, key)
					if err != nil {
						return err
					}
					return live.Do(client, req)
				}
			}, 5*time.Millisecond, 3)
		},
		Wrap: func(next http.Handler) http.Handler {
			return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if n.Add(1)%3 == 0 {
					refusedByMW.Add(1)
					http.Error(w, "refused", http.StatusServiceUnavailable)
					return
				}
				next.ServeHTTP(w, r)
			})
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	st := r.Stats
	if st.Offered != 80 || st.Offered != st.Succeeded+st.Failed || int64(len(st.Calls)) != st.Offered {
		t.Errorf("stats %+v with %d records: want 80 offered = succeeded + failed = records", st, len(st.Calls))
	}
	var ok int64
	for _, c := range st.Calls {
		if c.OK {
			ok++
		}
		if c.Took <= 0 || c.Took > fc.Deadline+time.Second || c.Late < 0 {
			t.Errorf("record %+v: took must be positive and bounded by the deadline, late not negative", c)
		}
	}
	if ok != st.Succeeded {
		t.Errorf("%d records succeeded, stats say %d", ok, st.Succeeded)
	}
	var sum, outcomes, refused int64
	for _, w := range r.Windows {
		sum += w.Attempts
		outcomes += w.OK + w.Failed + w.Shed + w.Refused
		refused += w.Refused
	}
	if !attempts.agrees(sum) || outcomes != sum || refused != refusedByMW.Load() || refused == 0 {
		t.Errorf("provider counted %d attempts (%d outcomes, %d refused); clients sent %d, %d of them answered, the middleware refused %d",
			sum, outcomes, refused, attempts.N(), attempts.answered.Load(), refusedByMW.Load())
	}
	var classified int64
	for _, n := range r.Failures {
		classified += n
	}
	if classified != st.Failed || r.Failures["503"] == 0 {
		t.Errorf("failures by cause %v add up to %d, want every failure (%d) and some 503s", r.Failures, classified, st.Failed)
	}
	s := r.Summary
	if s.OutageStarted == 0 || s.OutageSucceeded > s.OutageStarted || s.P50 <= 0 || s.P99 < s.P50 || s.ShedAfter == 0 || s.LateMax < s.LateP99 {
		t.Errorf("summary %+v: want calls started in the outage, p50 <= p99, refusals after it", s)
	}
}

func TestNewPaymentAndKeys(t *testing.T) {
	keys := live.NewKeys()
	seen := map[string]bool{}
	for range 1000 {
		k := keys.Next()
		if seen[k] || k == "" {
			t.Fatalf("key %q repeated or empty", k)
		}
		seen[k] = true
	}
	if a, b := live.NewKeys().Next(), live.NewKeys().Next(); a == b {
		t.Errorf("two key sources both started with %q", a)
	}
	req, err := live.NewPayment(context.Background(), "http://127.0.0.1:1/pay", "k1")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := req.GetBody()
	b, _ := io.ReadAll(body)
	if req.Method != http.MethodPost || req.Header.Get("Idempotency-Key") != "k1" || string(b) != live.PaymentBody {
		t.Errorf("NewPayment = %s with key %q and body %q", req.Method, req.Header.Get("Idempotency-Key"), b)
	}
}

// Loop retries a failing attempt at its interval, with the same state per
// call, until it succeeds, the attempts run out or the context ends.
func TestLoop(t *testing.T) {
	var fails atomic.Int64
	fails.Store(2)
	var begun atomic.Int64
	call := live.Loop(func() func(context.Context) error {
		begun.Add(1)
		return func(context.Context) error {
			if fails.Add(-1) >= 0 {
				return errors.New("503")
			}
			return nil
		}
	}, time.Millisecond, 0)
	if err := call(context.Background()); err != nil || begun.Load() != 1 || fails.Load() != -1 {
		t.Errorf("Loop = %v after %d begins, %d fails left; want success on the third try of one call", err, begun.Load(), fails.Load())
	}
	fails.Store(100)
	if err := live.Loop(func() func(context.Context) error {
		return func(context.Context) error { fails.Add(-1); return errors.New("503") }
	}, time.Millisecond, 3)(context.Background()); err == nil || fails.Load() != 97 {
		t.Errorf("Loop(3 attempts) = %v with %d tries, want an error after 3", err, 100-fails.Load())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if err := live.Loop(func() func(context.Context) error {
		return func(context.Context) error { return errors.New("503") }
	}, time.Millisecond, 0)(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Loop(until the deadline) = %v, want the deadline", err)
	}
}

// A call that panics is counted, fails, and does not stop the fleet.
func TestRunFleetPanics(t *testing.T) {
	var n atomic.Int64
	st, err := live.RunFleet(context.Background(), live.FleetConfig{Clients: 4, Every: 10 * time.Millisecond, Duration: 50 * time.Millisecond},
		func(context.Context) error {
			if n.Add(1)%2 == 0 {
				panic("client bug")
			}
			return nil
		})
	if err != nil {
		t.Fatal(err)
	}
	if st.Offered != 20 || st.Panics != 10 || st.Failed != 10 || st.Succeeded != 10 || !strings.Contains(st.Panic, "client bug") {
		t.Errorf("RunFleet with a panicking call: %+v (panic %q); want 20 offered, 10 panics counted as failures", st, st.Panic)
	}
}

// Started hands the caller the running provider before the first call:
// read then, its windows are empty; read after the run, they are the
// result's.
func TestRunScenarioStarted(t *testing.T) {
	pc := live.ProviderConfig{Window: 10 * time.Millisecond, Horizon: time.Second}
	fc := live.FleetConfig{Clients: 4, Every: 20 * time.Millisecond, Duration: 100 * time.Millisecond, Deadline: time.Second}
	var (
		p       *live.Provider
		started time.Time
		before  int64
	)
	r, err := live.RunScenario(context.Background(), live.Scenario{
		Name: "watched", Provider: pc, Fleet: fc,
		NewCall: func(url string, _ int) live.Call { return live.Get(http.DefaultClient, url) },
		Started: func(q *live.Provider, at time.Time) {
			p, started = q, at
			for _, w := range q.Windows() {
				before += w.Attempts
			}
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	if p == nil || started.IsZero() || before != 0 {
		t.Fatalf("Started(%v, %v) saw %d attempts before the first call, want a provider, a time and 0", p, started, before)
	}
	if got := p.Windows(); !slices.Equal(got, r.Windows) || r.Summary.Attempts != 20 {
		t.Errorf("the started provider's Windows() after the run differ from the result's (%d attempts, want 20)", r.Summary.Attempts)
	}
}
