// Black-box attack (AREA=observe): the observer seam (package observe) as
// a contract, checked from outside through the public APIs that take an
// observer: retry.WithObserver, httpretry.WithObserver (hedged races,
// stale-cache serving, breaker states), admission.Config.Observer and
// idempotency.WithObserver. Every documented event emitted when the doc
// says, exactly once, with the documented fields, in order; and an
// observer that panics.

package httpretry_test

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stormguard/stormguard/admission"
	"github.com/stormguard/stormguard/backoff"
	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/budget"
	"github.com/stormguard/stormguard/httpretry"
	"github.com/stormguard/stormguard/idempotency"
	"github.com/stormguard/stormguard/idempotency/store"
	"github.com/stormguard/stormguard/limit"
	"github.com/stormguard/stormguard/observe"
	"github.com/stormguard/stormguard/retry"
)

// ---- shared helpers and retry.WithObserver ----

// obsRec records events in order. panicOn, if set, is asked before each
// event is recorded; it panics (with its own value) when it returns true.
type obsRec struct {
	mu      sync.Mutex
	ev      []observe.Event
	panicOn func(e observe.Event, seen []observe.Event) bool
	slow    time.Duration
}

func (r *obsRec) Observe(_ context.Context, e observe.Event) {
	r.mu.Lock()
	r.ev = append(r.ev, e)
	seen := append([]observe.Event(nil), r.ev...)
	r.mu.Unlock()
	if r.slow > 0 {
		time.Sleep(r.slow)
	}
	if r.panicOn != nil && r.panicOn(e, seen) {
		panic(fmt.Sprintf("obs observer panics on %s %d hedge=%v", e.Kind, e.Attempt, e.Hedge))
	}
}

func (r *obsRec) events() []observe.Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]observe.Event(nil), r.ev...)
}

func obsFmt(ev []observe.Event) string {
	var b strings.Builder
	for _, e := range ev {
		fmt.Fprintf(&b, "  %s name=%q n=%d hedge=%v outcome=%q reason=%q from=%q to=%q delay=%v elapsed=%v err=%v\n",
			e.Kind, e.Name, e.Attempt, e.Hedge, e.Outcome, e.Reason, e.From, e.To, e.Delay, e.Elapsed, e.Err)
	}
	return b.String()
}

func obsCount(ev []observe.Event, k observe.Kind, n int) int {
	c := 0
	for _, e := range ev {
		if e.Kind == k && (n == 0 || e.Attempt == n) {
			c++
		}
	}
	return c
}

// obsTemp is a retryable error.
type obsTemp struct{}

func (obsTemp) Error() string   { return "temporary" }
func (obsTemp) Temporary() bool { return true }

func obsFixedBackoff(t *testing.T, d time.Duration) *backoff.Backoff {
	t.Helper()
	b, err := backoff.New(backoff.Config{Strategy: backoff.NoJitter, Base: d, Cap: d})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// obsCall runs p.Do and returns what it returned and what it panicked with.
func obsCall(ctx context.Context, p *retry.Policy, op func(context.Context, int) error) (v any, err error) {
	defer func() { v = recover() }()
	return nil, p.Do(ctx, op)
}

// An observer that panics on an attempt's AttemptEnd: the loop's deferred
// recovery reports the attempt's end again. observe.AttemptEnd: "attempt
// Attempt ended after Elapsed"; each attempt ends once, and the loop's
// own doc (Policy.Do) has the observer hear "of the attempt's end" once,
// then of the call's (GiveUp). The observer that panicked once on the
// AttemptEnd of attempt 1 hears a second AttemptEnd of attempt 1, this
// one a "failure" with a panic error while the attempt had succeeded.
func TestAttackObserveObserverPanicOnAttemptEndReportsItTwice(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rec := &obsRec{panicOn: func(e observe.Event, seen []observe.Event) bool {
			return e.Kind == observe.AttemptEnd && obsCount(seen, observe.AttemptEnd, 0) == 1
		}}
		p, err := retry.New(retry.WithObserver(rec), retry.WithName("dep"))
		if err != nil {
			t.Fatal(err)
		}
		v, _ := obsCall(context.Background(), p, func(context.Context, int) error { return nil })
		if v == nil {
			t.Fatal("the observer's panic did not go on")
		}
		ev := rec.events()
		if n := obsCount(ev, observe.AttemptStart, 1); n != 1 {
			t.Errorf("%d AttemptStart for attempt 1, want 1", n)
		}
		if n := obsCount(ev, observe.AttemptEnd, 1); n != 1 {
			t.Errorf("%d AttemptEnd for attempt 1, want exactly 1 (one attempt ran, once)\n%s", n, obsFmt(ev))
		}
	})
}

// The same with a failed attempt that the loop would retry: the
// AttemptEnd of attempt 1 ("failure") is followed by a second AttemptEnd
// of attempt 1.
func TestAttackObserveObserverPanicOnFailedAttemptEndReportsItTwice(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rec := &obsRec{panicOn: func(e observe.Event, seen []observe.Event) bool {
			return e.Kind == observe.AttemptEnd && obsCount(seen, observe.AttemptEnd, 0) == 1
		}}
		p, err := retry.New(retry.WithObserver(rec), retry.WithBackoff(obsFixedBackoff(t, 10*time.Millisecond)))
		if err != nil {
			t.Fatal(err)
		}
		v, _ := obsCall(context.Background(), p, func(context.Context, int) error { return obsTemp{} })
		if v == nil {
			t.Fatal("the observer's panic did not go on")
		}
		ev := rec.events()
		if n := obsCount(ev, observe.AttemptEnd, 1); n != 1 {
			t.Errorf("%d AttemptEnd for attempt 1, want exactly 1\n%s", n, obsFmt(ev))
		}
	})
}

// obsSeq renders events compactly: kind/attempt[:outcome|reason][@elapsed|+delay].
func obsSeq(ev []observe.Event) string {
	var s []string
	for _, e := range ev {
		x := fmt.Sprintf("%s/%d", e.Kind, e.Attempt)
		switch e.Kind {
		case observe.AttemptEnd, observe.BreakerWait:
			x += ":" + e.Outcome + "@" + e.Elapsed.String()
		case observe.Retry:
			x += ":" + e.Outcome + "+" + e.Delay.String()
		case observe.GiveUp:
			x += ":" + e.Reason
			if e.Delay != 0 {
				x += "+" + e.Delay.String()
			}
		}
		s = append(s, x)
	}
	return strings.Join(s, " ")
}

type obsHint time.Duration

func (h obsHint) Error() string             { return "busy" }
func (h obsHint) RetryAfter() time.Duration { return time.Duration(h) }

// obsLim refuses every Wait.
type obsLim struct{}

func (obsLim) Wait(context.Context) error { return errors.New("rate: would exceed") }

// Scenarios through retry.WithObserver, each with the event sequence the
// docs imply (observe's Kind constants, retry.Policy.Do).
func TestAttackObserveRetryEventSequences(t *testing.T) {
	type sc struct {
		name string
		run  func(t *testing.T, rec *obsRec) (err error)
		want string
	}
	temp := func(context.Context, int) error { return obsTemp{} }
	cases := []sc{
		{"exhausted", func(t *testing.T, rec *obsRec) error {
			p, _ := retry.New(retry.WithObserver(rec), retry.WithMaxAttempts(2), retry.WithBackoff(obsFixedBackoff(t, 100*time.Millisecond)))
			return p.Do(context.Background(), func(context.Context, int) error { time.Sleep(10 * time.Millisecond); return obsTemp{} })
		}, "attempt-start/1 attempt-end/1:failure@10ms retry/1:backoff+100ms attempt-start/2 attempt-end/2:failure@10ms give-up/2:attempts-exhausted"},
		{"hint", func(t *testing.T, rec *obsRec) error {
			b, _ := backoff.New(backoff.Config{Strategy: backoff.NoJitter, Base: 100 * time.Millisecond, Cap: 100 * time.Millisecond, Rand: func() float64 { return 0 }})
			p, _ := retry.New(retry.WithObserver(rec), retry.WithMaxAttempts(2), retry.WithBackoff(b))
			return p.Do(context.Background(), func(context.Context, int) error { return obsHint(time.Second) })
		}, "attempt-start/1 attempt-end/1:failure@0s retry/1:hint+1s attempt-start/2 attempt-end/2:failure@0s give-up/2:attempts-exhausted"},
		{"hint-over-max", func(t *testing.T, rec *obsRec) error {
			p, _ := retry.New(retry.WithObserver(rec), retry.WithMaxRetryAfter(time.Second))
			return p.Do(context.Background(), func(context.Context, int) error { return obsHint(5 * time.Second) })
		}, "attempt-start/1 attempt-end/1:failure@0s give-up/1:deadline+5s"},
		{"sleep-past-deadline", func(t *testing.T, rec *obsRec) error {
			p, _ := retry.New(retry.WithObserver(rec), retry.WithBackoff(obsFixedBackoff(t, time.Second)))
			ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
			defer cancel()
			return p.Do(ctx, temp)
		}, "attempt-start/1 attempt-end/1:failure@0s give-up/1:deadline+1s"},
		{"cancel-in-sleep", func(t *testing.T, rec *obsRec) error {
			p, _ := retry.New(retry.WithObserver(rec), retry.WithBackoff(obsFixedBackoff(t, time.Second)))
			ctx, cancel := context.WithCancel(context.Background())
			time.AfterFunc(500*time.Millisecond, cancel)
			return p.Do(ctx, temp)
		}, "attempt-start/1 attempt-end/1:failure@0s retry/1:backoff+1s give-up/1:canceled"},
		{"cancel-in-attempt", func(t *testing.T, rec *obsRec) error {
			p, _ := retry.New(retry.WithObserver(rec))
			ctx, cancel := context.WithCancel(context.Background())
			time.AfterFunc(500*time.Millisecond, cancel)
			return p.Do(ctx, func(ctx context.Context, _ int) error { <-ctx.Done(); return ctx.Err() })
		}, "attempt-start/1 attempt-end/1:canceled@500ms give-up/1:canceled"},
		{"not-retryable", func(t *testing.T, rec *obsRec) error {
			p, _ := retry.New(retry.WithObserver(rec))
			return p.Do(context.Background(), func(context.Context, int) error { return retry.Permanent(errors.New("no")) })
		}, "attempt-start/1 attempt-end/1:rejected@0s give-up/1:not-retryable"},
		{"budget", func(t *testing.T, rec *obsRec) error {
			b, _ := budget.New(budget.Config{Ratio: -1, MinPerSecond: -1})
			p, _ := retry.New(retry.WithObserver(rec), retry.WithGuards(retry.Guards{Budget: b}))
			return p.Do(context.Background(), temp)
		}, "attempt-start/1 attempt-end/1:failure@0s give-up/1:budget-exhausted"},
		{"rate-limit-first", func(t *testing.T, rec *obsRec) error {
			p, _ := retry.New(retry.WithObserver(rec), retry.WithRateLimit(obsLim{}))
			return p.Do(context.Background(), temp)
		}, "give-up/0:deadline"},
		{"breaker-open-no-deadline", func(t *testing.T, rec *obsRec) error {
			brk, _ := breaker.New(breaker.Config{})
			brk.Trip(0)
			p, _ := retry.New(retry.WithObserver(rec), retry.WithGuards(retry.Guards{Breaker: brk}))
			return p.Do(context.Background(), temp)
		}, "give-up/0:circuit-open"},
		{"breaker-wait-admitted", func(t *testing.T, rec *obsRec) error {
			brk, _ := breaker.New(breaker.Config{OpenFor: time.Second, Rand: func() float64 { return 0.5 }})
			brk.Trip(0)
			p, _ := retry.New(retry.WithObserver(rec), retry.WithGuards(retry.Guards{Breaker: brk}))
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			return p.Do(ctx, func(context.Context, int) error { return nil })
		}, "breaker-wait/0:admitted@1s attempt-start/1 attempt-end/1:success@0s"},
		{"breaker-wait-deadline", func(t *testing.T, rec *obsRec) error {
			brk, _ := breaker.New(breaker.Config{OpenFor: time.Second, Probes: 1, Rand: func() float64 { return 0.5 }})
			brk.Trip(0)
			p, _ := retry.New(retry.WithObserver(rec), retry.WithGuards(retry.Guards{Breaker: brk}))
			ctx, cancel := context.WithTimeout(context.Background(), 1500*time.Millisecond)
			defer cancel()
			return p.Do(ctx, temp)
		}, "breaker-wait/0:admitted@1s attempt-start/1 attempt-end/1:failure@0s give-up/1:circuit-open"}, // reopened for 1s, 500ms left: rejected at once, no wait
		{"breaker-wait-canceled", func(t *testing.T, rec *obsRec) error {
			brk, _ := breaker.New(breaker.Config{OpenFor: time.Second, Rand: func() float64 { return 0.5 }})
			brk.Trip(0)
			p, _ := retry.New(retry.WithObserver(rec), retry.WithGuards(retry.Guards{Breaker: brk}))
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			time.AfterFunc(300*time.Millisecond, cancel)
			return p.Do(ctx, temp)
		}, "breaker-wait/0:rejected@300ms give-up/0:canceled"},
		{"limiter-refused-retry", func(t *testing.T, rec *obsRec) error {
			lim, _ := limit.New(limit.Config{Max: 1, Waiting: -1})
			p, _ := retry.New(retry.WithObserver(rec), retry.WithGuards(retry.Guards{Limiter: lim}), retry.WithBackoff(obsFixedBackoff(t, 10*time.Millisecond)))
			first := true
			return p.Do(context.Background(), func(context.Context, int) error {
				if first {
					first = false
					// Another call takes the slot this one gives back.
					go func() { time.Sleep(time.Millisecond); s, err := lim.Acquire(context.Background()); _ = s; _ = err }()
				}
				return obsTemp{}
			})
		}, "attempt-start/1 attempt-end/1:failure@0s retry/1:backoff+10ms give-up/1:limited"},
		{"panic", func(t *testing.T, rec *obsRec) error {
			p, _ := retry.New(retry.WithObserver(rec), retry.WithBackoff(obsFixedBackoff(t, 10*time.Millisecond)))
			n := 0
			v, _ := obsCall(context.Background(), p, func(context.Context, int) error {
				n++
				if n == 2 {
					time.Sleep(5 * time.Millisecond)
					panic("boom")
				}
				return obsTemp{}
			})
			if v == nil {
				t.Error("the panic did not go on")
			}
			return nil
		}, "attempt-start/1 attempt-end/1:failure@0s retry/1:backoff+10ms attempt-start/2 attempt-end/2:failure@5ms give-up/2:panic"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				rec := &obsRec{}
				err := c.run(t, rec)
				synctest.Wait()
				ev := rec.events()
				if got := obsSeq(ev); got != c.want {
					t.Errorf("events\n got  %s\n want %s\n(err %v)\n%s", got, c.want, err, obsFmt(ev))
				}
				for _, e := range ev {
					if e.Kind == observe.GiveUp && e.Reason != "panic" {
						var re *retry.Error
						if errors.As(err, &re) && (re.Attempts != e.Attempt || re.Err != e.Err && !errors.Is(e.Err, re.Err)) {
							t.Errorf("GiveUp Attempt %d Err %v; the returned error: Attempts %d Err %v", e.Attempt, e.Err, re.Attempts, re.Err)
						}
					}
				}
			})
		})
	}
}

// ---- httpretry.WithObserver ----

func obsOf(ev []observe.Event, k observe.Kind) []observe.Event {
	var out []observe.Event
	for _, e := range ev {
		if e.Kind == k {
			out = append(out, e)
		}
	}
	return out
}

// obsRT adapts a function to http.RoundTripper.
type obsRT func(*http.Request) (*http.Response, error)

func (f obsRT) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

func obsResp(r *http.Request, code int, hdr ...string) *http.Response {
	rec := httptest.NewRecorder()
	for i := 0; i+1 < len(hdr); i += 2 {
		rec.Header().Set(hdr[i], hdr[i+1])
	}
	rec.WriteHeader(code)
	_, _ = io.WriteString(rec, "body")
	resp := rec.Result()
	resp.Request = r
	return resp
}

func obsNoJitter(t *testing.T) *backoff.Backoff {
	t.Helper()
	b, err := backoff.New(backoff.Config{Strategy: backoff.NoJitter, Base: 100 * time.Millisecond, Cap: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func obsGet(ctx context.Context, t *testing.T, rt http.RoundTripper, url string) (*http.Response, error) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := rt.RoundTrip(req)
	if err == nil {
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	return resp, err
}

// WithStaleCache: "A request the cache can answer that finds the host's
// breaker open as it starts gets the kept response at once ... (its
// Stormguard-Stale says circuit-open;attempts=0)": the transport gave up
// on it for the open breaker. WithObserver: the transport reports "every
// attempt, retry and give-up"; observe.GiveUp: "the call ended without
// success after Attempt attempts, for Reason (... "circuit-open" ...)".
// The observer hears nothing of this give-up: no GiveUp event at all
// (without the cache the same request's give-up is reported).
func TestAttackObserveStaleServedAtOnceReportsNoGiveUp(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var down atomic.Bool
		base := obsRT(func(r *http.Request) (*http.Response, error) {
			if down.Load() {
				return obsResp(r, 503), nil
			}
			return obsResp(r, 200, "Cache-Control", "max-age=1"), nil
		})
		rec := &obsRec{}
		rt, err := httpretry.NewTransport(base, httpretry.WithObserver(rec),
			httpretry.WithStaleCache(1<<20, time.Hour, false), httpretry.WithRetry(retry.WithBackoff(obsNoJitter(t))))
		if err != nil {
			t.Fatal(err)
		}
		const url = "http://api.example:8080/x"
		if _, err := obsGet(context.Background(), t, rt, url); err != nil {
			t.Fatal(err)
		}
		down.Store(true)
		time.Sleep(2 * time.Second) // stale now
		rt.Hosts()["api.example:8080"].Breaker.Trip(0)
		before := len(rec.events())

		resp, err := obsGet(context.Background(), t, rt, url)
		if err != nil {
			t.Fatal(err)
		}
		stale := resp.Header.Get("Stormguard-Stale")
		if !strings.HasPrefix(stale, "circuit-open;attempts=0") {
			t.Fatalf("Stormguard-Stale %q, want circuit-open;attempts=0...: the setup did not serve stale at once", stale)
		}
		ev := rec.events()[before:]
		gu := obsOf(ev, observe.GiveUp)
		if len(gu) != 1 || gu[0].Reason != "circuit-open" || gu[0].Attempt != 0 {
			t.Errorf("the transport gave up (Stormguard-Stale %q) and served the kept response; observer heard %d GiveUp, want 1 with Reason circuit-open after 0 attempts\n%s",
				stale, len(gu), obsFmt(ev))
		}

		// The same request without a cache, for comparison: the give-up is reported.
		rec2 := &obsRec{}
		rt2, _ := httpretry.NewTransport(base, httpretry.WithObserver(rec2))
		_, _ = obsGet(context.Background(), t, rt2, url) // makes the host
		rt2.Hosts()["api.example:8080"].Breaker.Trip(0)
		before = len(rec2.events())
		_, _ = obsGet(context.Background(), t, rt2, url)
		if gu := obsOf(rec2.events()[before:], observe.GiveUp); len(gu) != 1 || gu[0].Reason != "circuit-open" {
			t.Errorf("without the cache: %d GiveUp %v", len(gu), gu)
		}
	})
}

// A hedge runs on the race's timer goroutine, and its AttemptStart and
// AttemptEnd are reported there. hedging.md: "A base transport that
// panics (or calls runtime.Goexit) there ends the race as a panic of the
// first copy does: ... the panic goes on in the caller's goroutine";
// docs/limit.md counts "a panic ... of the observer" like the
// operation's. An observer that panics on the first copy's AttemptStart
// panics in the caller's goroutine (the caller can recover it); the same
// observer panicking on a hedge's AttemptStart (or AttemptEnd) ends the
// whole program, from the timer's goroutine. Run in a child process.
func TestAttackObserveHedgeObserverPanicEndsProgram(t *testing.T) {
	for _, on := range []string{"start", "end", "first-start"} {
		t.Run(on, func(t *testing.T) {
			if os.Getenv("ZZ_HEDGE_PANIC_CHILD") != "" {
				t.Skip("child")
			}
			cmd := exec.Command(os.Args[0], "-test.run=^TestAttackObserveHedgeObserverPanicChild$", "-test.count=1", "-test.v")
			cmd.Env = append(os.Environ(), "ZZ_HEDGE_PANIC_CHILD="+on)
			out, err := cmd.CombinedOutput()
			if err != nil {
				t.Errorf("observer panicking on a hedge's %s: the test process died (%v); want the panic in the caller's goroutine, as for the first copy\n%s",
					on, err, obsTail(string(out), 30))
			}
		})
	}
}

func obsTail(s string, n int) string {
	lines := strings.Split(s, "\n")
	if len(lines) > n {
		lines = lines[:n]
	}
	return strings.Join(lines, "\n")
}

// TestAttackObserveHedgeObserverPanicChild is the child of
// TestAttackObserveHedgeObserverPanicEndsProgram: the caller recovers the observer's
// panic, or the process dies.
func TestAttackObserveHedgeObserverPanicChild(t *testing.T) {
	on := os.Getenv("ZZ_HEDGE_PANIC_CHILD")
	if on == "" {
		t.Skip("run by TestAttackObserveHedgeObserverPanicEndsProgram")
	}
	synctest.Test(t, func(t *testing.T) {
		var n atomic.Int64
		base := obsRT(func(r *http.Request) (*http.Response, error) {
			d := 10 * time.Millisecond
			if n.Add(1) == 1 {
				d = time.Second
			}
			select {
			case <-time.After(d):
				return obsResp(r, 200), nil
			case <-r.Context().Done():
				return nil, r.Context().Err()
			}
		})
		rec := &obsRec{panicOn: func(e observe.Event, _ []observe.Event) bool {
			switch on {
			case "start":
				return e.Hedge && e.Kind == observe.AttemptStart
			case "end":
				return e.Hedge && e.Kind == observe.AttemptEnd
			default:
				return !e.Hedge && e.Kind == observe.AttemptStart
			}
		}}
		rt, err := httpretry.NewTransport(base, httpretry.WithObserver(rec), httpretry.WithHedging(50*time.Millisecond, 0, 1))
		if err != nil {
			t.Fatal(err)
		}
		var got any
		done := make(chan struct{})
		go func() {
			defer close(done)
			defer func() { got = recover() }()
			_, _ = obsGet(context.Background(), t, rt, "http://api.example:8080/x")
		}()
		<-done
		time.Sleep(5 * time.Second)
		synctest.Wait()
		t.Logf("caller recovered %v", got)
	})
}

// BreakerState through httpretry.WithBreaker: "The transport's logger and
// observer hear of its state changes, with the host"; observe.BreakerState:
// From and To ("closed", "open", "half-open"), one event per change, in
// order. A full cycle closed→open→half-open→closed by failing calls and a
// successful probe.
func TestAttackObserveBreakerStateEvents(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var down atomic.Bool
		down.Store(true)
		base := obsRT(func(r *http.Request) (*http.Response, error) {
			if down.Load() {
				return obsResp(r, 503), nil
			}
			return obsResp(r, 200), nil
		})
		rec := &obsRec{}
		rt, err := httpretry.NewTransport(base, httpretry.WithObserver(rec),
			httpretry.WithBreaker(&breaker.Config{MinCalls: 4, OpenFor: time.Second, Probes: 1, Rand: func() float64 { return 0.5 }}),
			httpretry.WithBudget(nil), httpretry.WithRetry(retry.WithMaxAttempts(1)))
		if err != nil {
			t.Fatal(err)
		}
		const url = "http://api.example:8080/x"
		for range 4 {
			_, _ = obsGet(context.Background(), t, rt, url)
		}
		down.Store(false)
		time.Sleep(2 * time.Second)
		if _, err := obsGet(context.Background(), t, rt, url); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		var got []string
		for _, e := range obsOf(rec.events(), observe.BreakerState) {
			if e.Name != "api.example:8080" {
				t.Errorf("BreakerState Name %q, want the host", e.Name)
			}
			got = append(got, e.From+">"+e.To)
		}
		if want := "[closed>open open>half-open half-open>closed]"; fmt.Sprint(got) != want {
			t.Errorf("breaker states %v, want %s\n%s", got, want, obsFmt(rec.events()))
		}
	})
}

// obsPairs checks, per (Attempt, Hedge), one AttemptStart then one
// AttemptEnd with a documented Outcome.
func obsPairs(t *testing.T, ev []observe.Event) {
	t.Helper()
	type key struct {
		n int
		h bool
	}
	state := map[key]int{}
	for _, e := range ev {
		k := key{e.Attempt, e.Hedge}
		switch e.Kind {
		case observe.AttemptStart:
			if state[k] != 0 {
				t.Errorf("AttemptStart n=%d hedge=%v again", e.Attempt, e.Hedge)
			}
			state[k] = 1
		case observe.AttemptEnd:
			if state[k] != 1 {
				t.Errorf("AttemptEnd n=%d hedge=%v without its AttemptStart, or twice", e.Attempt, e.Hedge)
			}
			state[k] = 2
			switch e.Outcome {
			case "success", "failure", "rejected", "canceled":
			default:
				t.Errorf("AttemptEnd n=%d hedge=%v Outcome %q", e.Attempt, e.Hedge, e.Outcome)
			}
		}
	}
	for k, s := range state {
		if s != 2 {
			t.Errorf("attempt n=%d hedge=%v: started, never ended", k.n, k.h)
		}
	}
}

// A hedged race that fails, then a retry: print the events to judge.
func TestAttackObserveHedgeRetrySequence(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		base := obsRT(func(r *http.Request) (*http.Response, error) {
			d := 10 * time.Millisecond
			if r.Header.Get("Stormguard-Attempt") == "" || r.Header.Get("Stormguard-Attempt") == "1" || r.Header.Get("Stormguard-Attempt") == "3" {
				d = 100 * time.Millisecond
			}
			select {
			case <-time.After(d):
				return obsResp(r, 503), nil
			case <-r.Context().Done():
				return nil, r.Context().Err()
			}
		})
		rec := &obsRec{}
		rt, err := httpretry.NewTransport(base, httpretry.WithObserver(rec), httpretry.WithHedging(50*time.Millisecond, 0, 1),
			httpretry.WithRetry(retry.WithMaxAttempts(2), retry.WithBackoff(obsNoJitter(t))), httpretry.WithAttemptTimeout(time.Second))
		if err != nil {
			t.Fatal(err)
		}
		_, _ = obsGet(context.Background(), t, rt, "http://api.example:8080/x")
		synctest.Wait()
		ev := rec.events()
		obsPairs(t, ev)
		t.Logf("\n%s", obsFmt(ev))
	})
}

// ---- idempotency.WithObserver ----

// obsSlowStore delays every call of the store it wraps by d.
type obsSlowStore struct {
	store.Store
	d time.Duration
}

func (s obsSlowStore) Begin(ctx context.Context, id store.ID, fp store.Fingerprint, ttl time.Duration) (store.Result, error) {
	time.Sleep(s.d)
	return s.Store.Begin(ctx, id, fp, ttl)
}

func (s obsSlowStore) Complete(ctx context.Context, id store.ID, o store.Owner, rec store.Record, ret time.Duration) error {
	time.Sleep(s.d)
	return s.Store.Complete(ctx, id, o, rec, ret)
}

func (s obsSlowStore) Extend(ctx context.Context, id store.ID, o store.Owner, ttl time.Duration) error {
	time.Sleep(s.d)
	return s.Store.Extend(ctx, id, o, ttl)
}

func (s obsSlowStore) Release(ctx context.Context, id store.ID, o store.Owner) error {
	time.Sleep(s.d)
	return s.Store.Release(ctx, id, o)
}

func obsFP() store.Fingerprint {
	return store.NewFingerprint("POST", "/pay", sha256.Sum256([]byte("body")))
}

func obsIdemFmt(ev []observe.Event) string {
	s := ""
	for _, e := range ev {
		s += fmt.Sprintf("  %s name=%q outcome=%q elapsed=%v err=%v\n", e.Kind, e.Name, e.Outcome, e.Elapsed, e.Err)
	}
	return s
}

// Guard.Run: "A record that no store takes (... a Status outside 200-999
// ...) is fn's misuse: it is not stored, and the key is released as for
// !keep, at once." WithObserver: Outcome "new" (the key was claimed for
// this request ... the handler ran) or "store-error" ("a store call
// failed"); Err: "the store's error for store-error ..., nil otherwise".
// No store call failed here: the release succeeded (a retry claims the key
// anew), yet the event is a "store-error" whose Err is no store's error.
func TestAttackObserveUnstorableRecordReportedAsStoreError(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		mem, err := idempotency.NewMemoryStore(idempotency.MemoryConfig{})
		if err != nil {
			t.Fatal(err)
		}
		rec := &obsRec{}
		g, err := idempotency.NewGuard(mem, idempotency.WithObserver(rec), idempotency.WithName("pay"))
		if err != nil {
			t.Fatal(err)
		}
		ran := 0
		fn := func(context.Context) (store.Record, bool) { ran++; return store.Record{Status: 100}, true }
		out, _, err := g.Run(context.Background(), "s", "k1", obsFP(), fn)
		if out != store.Claimed || err != nil {
			t.Fatalf("Run: %q %v", out, err)
		}
		// The key was released: a second Run claims it and runs fn again.
		out2, _, _ := g.Run(context.Background(), "s", "k1", obsFP(), fn)
		if out2 != store.Claimed || ran != 2 {
			t.Fatalf("second Run %q, fn ran %d times: the key was not released", out2, ran)
		}
		ev := rec.events()
		if len(ev) != 2 {
			t.Fatalf("%d events, want 2\n%s", len(ev), obsIdemFmt(ev))
		}
		for _, e := range ev {
			if e.Kind != observe.Idempotency || e.Name != "pay" {
				t.Errorf("event %s %q", e.Kind, e.Name)
			}
			if e.Outcome != "new" || e.Err != nil {
				t.Errorf("Outcome %q Err %v; want \"new\" and no error: no store call failed (the key was released as for !keep)", e.Outcome, e.Err)
			}
		}
	})
}

// WithObserver: "Elapsed: the time spent in store calls for the request
// (claim, renewals, completion or release)". A store that takes 100 ms
// per call, a handler of 1 s, a lock timeout of 900 ms (a renewal every
// 300 ms: 3 while the handler runs): claim + 3 renewals + completion.
func TestAttackObserveElapsedIsStoreTime(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		mem, _ := idempotency.NewMemoryStore(idempotency.MemoryConfig{})
		rec := &obsRec{}
		g, err := idempotency.NewGuard(obsSlowStore{mem, 100 * time.Millisecond}, idempotency.WithObserver(rec), idempotency.WithLockTimeout(900*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		_, _, err = g.Run(context.Background(), "s", "k1", obsFP(), func(context.Context) (store.Record, bool) {
			time.Sleep(time.Second)
			return store.Record{Status: 201}, true
		})
		if err != nil {
			t.Fatal(err)
		}
		out, _, _ := g.Run(context.Background(), "s", "k1", obsFP(), func(context.Context) (store.Record, bool) { return store.Record{}, false })
		if out != store.Completed {
			t.Fatalf("second run %q", out)
		}
		ev := rec.events()
		if len(ev) != 2 || ev[0].Outcome != "new" || ev[1].Outcome != "replay" {
			t.Fatalf("events:\n%s", obsIdemFmt(ev))
		}
		if ev[1].Elapsed != 100*time.Millisecond {
			t.Errorf("replay Elapsed %v, want the claim's 100ms", ev[1].Elapsed)
		}
		// The claim, the completion and the renewals (each 100 ms).
		if e := ev[0].Elapsed; e < 200*time.Millisecond || e%(100*time.Millisecond) != 0 || e > 600*time.Millisecond {
			t.Errorf("new Elapsed %v, want whole store calls of 100 ms: the claim, the renewals, the completion\n%s", e, obsIdemFmt(ev))
		}
		t.Logf("\n%s", obsIdemFmt(ev))
	})
}

// ---- admission.Config.Observer ----

func obsStr(e observe.Event) string {
	return fmt.Sprintf("%s/%d:%s:%s@%v+%v", e.Kind, e.Attempt, e.Outcome, e.Reason, e.Elapsed, e.Delay)
}

// Config.Observer: one event per request ("admitted", "shed-retry",
// "shed-busy" with the controller's outcome name as Reason, "deadline" for
// a deadline drop), one more ("queued") first if it queued; Attempt the
// request's attempt number, Delay the Retry-After of a refusal, Elapsed
// the time queued.
func TestAttackObserveAdmissionEvents(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rec := &obsRec{}
		c, err := admission.New(admission.Config{MaxInFlight: 1, MaxQueue: 1, MaxQueueWait: 200 * time.Millisecond,
			RetryAfterSpread: -1, RetryAfterBase: 2 * time.Second, Observer: rec, Name: "svc", MinRetriesPerSecond: -1})
		if err != nil {
			t.Fatal(err)
		}
		p1, d := c.Acquire(context.Background(), 1) // admitted
		if d.Outcome != admission.Admitted {
			t.Fatal(d.Outcome)
		}
		// queued, then timed out after 200ms
		var wg sync.WaitGroup
		wg.Go(func() {
			_, d := c.Acquire(context.Background(), 1)
			if d.Outcome != admission.QueueTimeout {
				t.Errorf("second: %v", d.Outcome)
			}
		})
		synctest.Wait()
		// queue full now
		_, d = c.Acquire(context.Background(), 1)
		if d.Outcome != admission.QueueFull {
			t.Errorf("third: %v", d.Outcome)
		}
		wg.Wait()
		// a retry beyond the ratio
		_, d = c.Acquire(context.Background(), 2)
		if d.Outcome != admission.RetryRefused {
			t.Errorf("retry: %v", d.Outcome)
		}
		// a deadline already passed
		ctx, cancel := context.WithTimeout(context.Background(), -time.Second)
		defer cancel()
		_, d = c.Acquire(ctx, 1)
		if d.Outcome != admission.Canceled {
			t.Errorf("past deadline: %v", d.Outcome)
		}
		// queued, then admitted when the first releases after 100 ms
		wg.Go(func() {
			p, d := c.Acquire(context.Background(), 1)
			if d.Outcome == admission.Admitted {
				p.Release()
			}
		})
		synctest.Wait()
		time.Sleep(100 * time.Millisecond)
		p1.Release()
		wg.Wait()
		var got []string
		for _, e := range rec.events() {
			if e.Kind != observe.Admission || e.Name != "svc" {
				t.Errorf("event %s %q", e.Kind, e.Name)
			}
			got = append(got, obsStr(e))
		}
		want := []string{
			"admission/1:admitted:@0s+0s",
			"admission/1:queued:@0s+0s",
			"admission/1:shed-busy:queue-full@0s+2s",
			"admission/1:shed-busy:queue-timeout@200ms+2s",
			"admission/2:shed-retry:retry-refused@0s+2s",
			"admission/1:shed-busy:deadline@0s+2s",
			"admission/1:queued:@0s+0s",
			"admission/1:admitted:@100ms+0s",
		}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("events\n got  %v\n want %v", got, want)
		}
	})
}
