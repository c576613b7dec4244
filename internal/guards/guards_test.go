package guards_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stormguard/stormguard/backoff"
	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/budget"
	"github.com/stormguard/stormguard/internal/guards"
	"github.com/stormguard/stormguard/limit"
	"github.com/stormguard/stormguard/observe"
	"github.com/stormguard/stormguard/retry"
)

func TestTableBoundedFIFO(t *testing.T) {
	made := 0
	tb := guards.NewTable(2, func(name string) (*int, error) { made++; v := made; return &v, nil })
	a1, _ := tb.Get("a")
	if a2, _ := tb.Get("a"); a2 != a1 {
		t.Errorf("second Get(a) built a new state")
	}
	tb.Get("b")
	tb.Get("c") // evicts a, the oldest
	if n := tb.Len(); n != 2 {
		t.Errorf("Len = %d after 3 names in a table of 2, want 2", n)
	}
	if a3, _ := tb.Get("a"); a3 == a1 {
		t.Errorf("Get(a) after its eviction returned the old state")
	}
	if made != 4 {
		t.Errorf("built %d states, want 4 (a, b, c, a again)", made)
	}
	if all := tb.All(); len(all) != 2 || all["a"] == nil || all["c"] == nil {
		t.Errorf("All() = %v, want a and c", all)
	}
}

func TestTableConcurrent(t *testing.T) {
	tb := guards.NewTable(8, func(name string) (string, error) { return name, nil })
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 500 {
				name := fmt.Sprintf("h%d", (g*7+i)%20)
				if v, err := tb.Get(name); err != nil || v != name {
					t.Errorf("Get(%s) = %q, %v", name, v, err)
				}
			}
		})
	}
	wg.Wait()
	if n := tb.Len(); n > 8 {
		t.Errorf("Len = %d, above the bound 8", n)
	}
}

func TestTableMakeError(t *testing.T) {
	boom := errors.New("boom")
	tb := guards.NewTable(2, func(name string) (int, error) { return 0, boom })
	if _, err := tb.Get("x"); err != boom {
		t.Errorf("Get = %v, want the builder's error", err)
	}
	if tb.Len() != 0 {
		t.Errorf("a failed build was kept")
	}
}

func TestTableGetAllocatesNothing(t *testing.T) {
	tb := guards.NewTable(4, func(name string) (int, error) { return len(name), nil })
	tb.Get("a")
	tb.Get("bb")
	if n := testing.AllocsPerRun(100, func() { tb.Get("a") }); n != 0 {
		t.Errorf("Get of a held name allocates %v times", n)
	}
}

func TestLayerBuildsGuardsAndPolicy(t *testing.T) {
	var logs bytes.Buffer
	logger := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	var events []observe.Event
	var user []string
	l := &guards.Layer{
		Component: "httpretry", Label: "host",
		Schedule: []retry.ScheduleOption{retry.WithMaxAttempts(2), retry.WithBackoff(zeroDelays(t))},
		Classify: func(err error) bool { return err != nil },
		Budget:   &budget.Config{},
		Breaker:  &breaker.Config{MinCalls: 2, OnStateChange: func(from, to breaker.State) { user = append(user, to.String()) }},
		Logger:   logger,
		Observer: observe.Func(func(ctx context.Context, e observe.Event) {
			events = append(events, e)
		}),
	}
	d, err := l.New("h.example")
	if err != nil || d.Guards.Budget == nil || d.Guards.Breaker == nil || d.Policy == nil || d.Name != "h.example" {
		t.Fatalf("New = %+v, %v; want guards and a policy", d, err)
	}
	// The policy runs on the guards, with the layer's classifier and the
	// user's schedule: two attempts, both failures (which trip the
	// breaker), and the attempts are exhausted.
	calls := 0
	err = d.Policy.Do(context.Background(), func(ctx context.Context, attempt int) error {
		calls++
		return errors.New("down")
	})
	if !errors.Is(err, retry.AttemptsExhausted) || calls != 2 || d.Guards.Breaker.State() != breaker.Open {
		t.Errorf("Do = %v after %d calls, breaker %v; want the attempts exhausted after 2, the breaker open", err, calls, d.Guards.Breaker.State())
	}
	kinds := map[observe.Kind]int{}
	for _, e := range events {
		kinds[e.Kind]++
		if e.Name != "h.example" {
			t.Errorf("event %+v not named with the destination", e)
		}
	}
	if kinds[observe.BreakerState] != 1 || kinds[observe.AttemptEnd] != 2 || kinds[observe.Retry] != 1 || kinds[observe.GiveUp] != 1 {
		t.Errorf("events %v; want 2 attempts, 1 retry, 1 give-up, 1 breaker state change", kinds)
	}
	if len(user) != 1 || user[0] != "open" {
		t.Errorf("the configured OnStateChange heard %v, want [open]", user)
	}
	for _, want := range []string{
		`level=WARN msg="httpretry: circuit breaker state change" host=h.example from=closed to=open`,
		`level=DEBUG msg="retry: retrying" host=h.example retry.attempt=1 retry.delay=0s retry.error=down`,
		`level=DEBUG msg="retry: giving up" host=h.example retry.reason=attempts-exhausted retry.attempts=2 retry.error=down`,
	} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("log lacks %q:\n%s", want, logs.String())
		}
	}
}

// TestLayerPassesTagging: with a logger, the policy's observer is the
// layer's own (it logs), and it still lets the user's observer tag each
// attempt's context.
func TestLayerPassesTagging(t *testing.T) {
	tg := &tagger{}
	l := &guards.Layer{Component: "httpretry", Label: "host", Classify: retry.IsRetryable, Observer: tg,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
	d, err := l.New("h")
	if err != nil {
		t.Fatal(err)
	}
	var got any
	if err := d.Policy.Do(context.Background(), func(ctx context.Context, attempt int) error {
		got = ctx.Value(tagKey{})
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if got != 1 || tg.ends.Load() != 1 {
		t.Errorf("attempt ran with tag %v, the observer heard %d attempt ends; want tag 1 and 1 end", got, tg.ends.Load())
	}
}

// tagger is an observer that tags each attempt's context with its number.
type tagger struct{ ends atomic.Int64 }

type tagKey struct{}

func (tg *tagger) Observe(ctx context.Context, e observe.Event) {
	if e.Kind == observe.AttemptEnd && ctx.Value(tagKey{}) == e.Attempt {
		tg.ends.Add(1)
	}
}

func (tg *tagger) TagAttempt(ctx context.Context, e observe.Event) context.Context {
	return context.WithValue(ctx, tagKey{}, e.Attempt)
}

func TestLayerErrors(t *testing.T) {
	bad := &guards.Layer{Component: "httpretry", Label: "host", Classify: retry.IsRetryable, Breaker: &breaker.Config{FailureRatio: 2}}
	if _, err := bad.New("h"); !strings.Contains(err.Error(), `httpretry: guards for host "h": breaker: invalid config: `) {
		t.Errorf("New(bad breaker) = %v", err)
	}
	none := &guards.Layer{Classify: retry.IsRetryable}
	if d, err := none.New("h"); err != nil || d.Guards != (retry.Guards{}) {
		t.Errorf("New(no guards) = %+v, %v; want no guards", d, err)
	}
	boom := errors.New("boom")
	supplied := &guards.Layer{Component: "grpcretry", Label: "target", Classify: retry.IsRetryable,
		Supply: func(string) (retry.Guards, error) { return retry.Guards{}, boom }}
	if _, err := supplied.New("t"); !errors.Is(err, boom) {
		t.Errorf("New with a failing Supply = %v, want its error", err)
	}
	badSchedule := &guards.Layer{Classify: retry.IsRetryable, Schedule: []retry.ScheduleOption{retry.WithMaxAttempts(0)}}
	if _, err := badSchedule.New("h"); err == nil {
		t.Errorf("New with a bad schedule option = nil error")
	}
	// Check reports a bad option without asking Supply for guards.
	asked := 0
	badSchedule.Supply = func(string) (retry.Guards, error) { asked++; return retry.Guards{}, nil }
	if err := badSchedule.Check(); err == nil || asked != 0 {
		t.Errorf("Check with a bad schedule option = %v, Supply asked %d times; want an error and no ask", err, asked)
	}
	if err := supplied.Check(); err != nil {
		t.Errorf("Check of a layer whose Supply fails = %v; want nil (Supply is not asked)", err)
	}
}

// zeroDelays is a backoff whose delays are all 0.
func zeroDelays(t *testing.T) *backoff.Backoff {
	t.Helper()
	b, err := backoff.New(backoff.Config{Rand: func() float64 { return 0 }})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestLayerLimiter: with Limit, each destination gets a limiter of its
// own, supplied guards without one get one too, and a breaker the layer
// builds releases its waiting calls at once (the limiter paces them) when
// LimitPaces says so, unless its ReleaseRate is set; a bad Limit is an
// error naming the field.
func TestLayerLimiter(t *testing.T) {
	own, err := limit.New(limit.Config{})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name        string
		layer       guards.Layer
		wantLimiter bool
		wantOwn     bool    // the supplied limiter is kept
		wantRelease float64 // the breaker's ReleaseRate (NaN: no breaker)
	}{
		{"no limit", guards.Layer{Breaker: &breaker.Config{}}, false, false, 0},
		{"limit that paces and breaker", guards.Layer{Limit: &limit.Config{}, LimitPaces: true, Breaker: &breaker.Config{}}, true, false, -1},
		{"limit that does not pace and breaker", guards.Layer{Limit: &limit.Config{}, Breaker: &breaker.Config{}}, true, false, 0},
		{"limit that paces and breaker with a release rate", guards.Layer{Limit: &limit.Config{}, LimitPaces: true, Breaker: &breaker.Config{ReleaseRate: 50}}, true, false, 50},
		{"limit alone", guards.Layer{Limit: &limit.Config{}}, true, false, math.NaN()},
		{"supplied without a limiter", guards.Layer{Limit: &limit.Config{},
			Supply: func(string) (retry.Guards, error) { return retry.Guards{}, nil }}, true, false, math.NaN()},
		{"supplied with a limiter", guards.Layer{Limit: &limit.Config{},
			Supply: func(string) (retry.Guards, error) { return retry.Guards{Limiter: own}, nil }}, true, true, math.NaN()},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l := tt.layer
			l.Classify = retry.IsRetryable
			a, err := l.New("a")
			if err != nil {
				t.Fatal(err)
			}
			b, err := l.New("b")
			if err != nil {
				t.Fatal(err)
			}
			if got := a.Guards.Limiter != nil; got != tt.wantLimiter {
				t.Fatalf("limiter built: %v, want %v", got, tt.wantLimiter)
			}
			if tt.wantLimiter && (a.Guards.Limiter == own) != tt.wantOwn {
				t.Errorf("the supplied limiter kept: %v, want %v", a.Guards.Limiter == own, tt.wantOwn)
			}
			if tt.wantLimiter && !tt.wantOwn && a.Guards.Limiter == b.Guards.Limiter {
				t.Errorf("two destinations share one limiter")
			}
			if brk := a.Guards.Breaker; brk != nil {
				if got := brk.Config().ReleaseRate; got != tt.wantRelease {
					t.Errorf("breaker's ReleaseRate = %v, want %v", got, tt.wantRelease)
				}
			} else if !math.IsNaN(tt.wantRelease) {
				t.Errorf("no breaker built")
			}
		})
	}
	bad := &guards.Layer{Component: "httpretry", Label: "host", Classify: retry.IsRetryable, Limit: &limit.Config{Max: -1}}
	if err := bad.Check(); err == nil || !strings.Contains(err.Error(), "Config.Max") || !strings.Contains(err.Error(), `httpretry: guards for host`) {
		t.Errorf("Check(bad limit) = %v, want an error naming Config.Max", err)
	}
}

// TestLayerLimitTimeout: a zero Limit.Timeout takes the layer's attempt
// timeout, whose half is the limiter's latency ceiling: attempts of 80 ms
// under a 100 ms attempt timeout are drops and bring the limit down, while
// under an explicit 10 s Timeout they are samples and leave it. Run on
// synctest's clock.
func TestLayerLimitTimeout(t *testing.T) {
	tests := []struct {
		name    string
		timeout time.Duration // Limit.Timeout
		lowered bool
	}{
		{"timeout from the attempt timeout", 0, true},
		{"timeout set", 10 * time.Second, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				l := &guards.Layer{Classify: retry.IsRetryable, AttemptTimeout: 100 * time.Millisecond,
					Limit: &limit.Config{Max: 8, Timeout: tt.timeout}}
				d, err := l.New("h")
				if err != nil {
					t.Fatal(err)
				}
				var wg sync.WaitGroup
				for range 8 {
					wg.Go(func() {
						for range 50 {
							ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
							_ = d.Policy.Do(ctx, func(context.Context, int) error {
								time.Sleep(80 * time.Millisecond)
								return nil
							})
							cancel()
						}
					})
				}
				wg.Wait()
				if got := d.Guards.Limiter.Limit(); (got < 8) != tt.lowered {
					t.Errorf("limit after 80 ms attempts = %d of 8; want it lowered: %v", got, tt.lowered)
				}
			})
		})
	}
}

// TestForget: a table full to its bound hands the state it evicts to
// Forget (once, with the evicted value); a destination forgotten tells its
// layer's observer its breaker is gone (To "", Reason "forgotten", From its
// state) and tells none of the breaker's later changes; a supplied breaker
// is not the layer's to forget.
func TestForget(t *testing.T) {
	var forgot []int
	tb := guards.NewTable(1, func(name string) (int, error) { return len(name), nil })
	tb.Forget = func(v int) { forgot = append(forgot, v) }
	for _, n := range []string{"a", "a", "bb", "ccc"} {
		if _, err := tb.Get(n); err != nil {
			t.Fatal(err)
		}
	}
	if fmt.Sprint(forgot) != "[1 2]" {
		t.Errorf("forgotten %v, want [1 2]", forgot)
	}

	var mu sync.Mutex
	var events []string
	obs := observe.Func(func(_ context.Context, e observe.Event) {
		if e.Kind == observe.BreakerState {
			mu.Lock()
			events = append(events, e.From+">"+e.To+" "+e.Reason)
			mu.Unlock()
		}
	})
	l := guards.Layer{Component: "t", Label: "host", Classify: retry.IsRetryable, Breaker: &breaker.Config{}, Observer: obs}
	d, err := l.New("a")
	if err != nil {
		t.Fatal(err)
	}
	d.Guards.Breaker.Trip(0)
	d.Forget()
	d.Forget()
	d.Guards.Breaker.Reset()
	if got := strings.Join(events, ","); got != "closed>open ,open> forgotten" {
		t.Errorf("events %q, want the trip, then the forgetting, and nothing after", got)
	}

	events = nil
	b, _ := breaker.New(breaker.Config{})
	sl := guards.Layer{Component: "t", Label: "host", Classify: retry.IsRetryable, Observer: obs,
		Supply: func(string) (retry.Guards, error) { return retry.Guards{Breaker: b}, nil }}
	sd, err := sl.New("a")
	if err != nil {
		t.Fatal(err)
	}
	b.Trip(0)
	sd.Forget()
	if len(events) != 0 {
		t.Errorf("a supplied breaker told %q", events)
	}
}
