// Black-box attack (area: telemetry): what the producers emit, checked
// against what package observe documents each field to mean.

package observe_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
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
	"github.com/stormguard/stormguard/limit"
	"github.com/stormguard/stormguard/observe"
	"github.com/stormguard/stormguard/retry"
)

// telRec records events, in order, with the time each came.
type telRec struct {
	mu sync.Mutex
	ev []observe.Event
}

func (r *telRec) Observe(_ context.Context, e observe.Event) {
	r.mu.Lock()
	r.ev = append(r.ev, e)
	r.mu.Unlock()
}

func (r *telRec) events() []observe.Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]observe.Event(nil), r.ev...)
}

func telFmt(ev []observe.Event) string {
	var b strings.Builder
	for _, e := range ev {
		fmt.Fprintf(&b, "  %s attempt=%d hedge=%v outcome=%q reason=%q delay=%v elapsed=%v err=%v\n",
			e.Kind, e.Attempt, e.Hedge, e.Outcome, e.Reason, e.Delay, e.Elapsed, e.Err)
	}
	return b.String()
}

// telOutcomes are the AttemptEnd outcomes the Kind documentation lists.
var telOutcomes = map[string]bool{"success": true, "failure": true, "rejected": true, "canceled": true}

// telPairs checks that every AttemptStart has exactly one AttemptEnd with
// the same Attempt and Hedge, and that every AttemptEnd's Outcome is one
// of the documented values.
func telPairs(t *testing.T, ev []observe.Event) {
	t.Helper()
	type key struct {
		n int
		h bool
	}
	open := map[key]int{}
	for _, e := range ev {
		k := key{e.Attempt, e.Hedge}
		switch e.Kind {
		case observe.AttemptStart:
			open[k]++
		case observe.AttemptEnd:
			if !telOutcomes[e.Outcome] {
				t.Errorf("AttemptEnd attempt=%d hedge=%v Outcome %q: not one of success, failure, rejected, canceled", e.Attempt, e.Hedge, e.Outcome)
			}
			if open[k] == 0 {
				t.Errorf("AttemptEnd attempt=%d hedge=%v without its AttemptStart", e.Attempt, e.Hedge)
			}
			open[k]--
		}
	}
	for k, n := range open {
		if n != 0 {
			t.Errorf("attempt %d hedge=%v: %d AttemptStart without AttemptEnd", k.n, k.h, n)
		}
	}
}

func telNoJitter(t *testing.T) *backoff.Backoff {
	b, err := backoff.New(backoff.Config{Base: 100 * time.Millisecond, Rand: func() float64 { return 1 }})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// AttemptEnd: canceled is for "an attempt that failed after its call's
// context ended"; WithAttemptTimeout: "An attempt that fails because its
// own timeout fired, while the call still has time, is retried ... and
// counts as a failure of the dependency". Elapsed is the attempt's
// duration: the timeout.
func TestAttackTelAttemptTimeoutIsFailure(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rec := &telRec{}
		p, err := retry.New(retry.WithObserver(rec), retry.WithName("dep"),
			retry.WithAttemptTimeout(200*time.Millisecond), retry.WithMaxAttempts(2), retry.WithBackoff(telNoJitter(t)))
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		err = p.Do(ctx, func(ctx context.Context, _ int) error {
			<-ctx.Done()
			return ctx.Err()
		})
		ev := rec.events()
		telPairs(t, ev)
		var ends int
		for _, e := range ev {
			if e.Kind == observe.AttemptEnd {
				ends++
				if e.Outcome != "failure" || e.Elapsed != 200*time.Millisecond {
					t.Errorf("attempt %d: Outcome %q Elapsed %v; want failure after 200ms", e.Attempt, e.Outcome, e.Elapsed)
				}
			}
			if e.Kind == observe.GiveUp && (e.Reason != "attempts-exhausted" || e.Attempt != 2) {
				t.Errorf("GiveUp reason %q attempts %d, want attempts-exhausted after 2", e.Reason, e.Attempt)
			}
		}
		if ends != 2 {
			t.Errorf("%d AttemptEnd, want 2", ends)
		}
		if t.Failed() {
			t.Logf("err %v; events:\n%s", err, telFmt(ev))
		}
	})
}

// AttemptEnd: "an attempt that failed after its call's context ended (the
// caller's deadline ...)" ends "canceled"; GiveUp Reason "deadline",
// Attempt the attempts made; Elapsed the attempt's duration.
func TestAttackTelCallDeadlineMidAttempt(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rec := &telRec{}
		p, err := retry.New(retry.WithObserver(rec), retry.WithName("dep"), retry.WithBackoff(telNoJitter(t)))
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		defer cancel()
		_ = p.Do(ctx, func(ctx context.Context, _ int) error {
			<-ctx.Done()
			return ctx.Err()
		})
		ev := rec.events()
		telPairs(t, ev)
		want := []string{"attempt-start 1 ", "attempt-end 1 canceled 300ms", "give-up 1 deadline 0s"}
		var got []string
		for _, e := range ev {
			switch e.Kind {
			case observe.AttemptStart:
				got = append(got, fmt.Sprintf("%s %d ", e.Kind, e.Attempt))
			case observe.AttemptEnd:
				got = append(got, fmt.Sprintf("%s %d %s %v", e.Kind, e.Attempt, e.Outcome, e.Elapsed))
			case observe.GiveUp:
				got = append(got, fmt.Sprintf("%s %d %s %v", e.Kind, e.Attempt, e.Reason, e.Elapsed))
			default:
				got = append(got, string(e.Kind))
			}
		}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("events %q, want %q\n%s", got, want, telFmt(ev))
		}
	})
}

// Guards.Budget: "the loop withdraws before each retry, after every other
// check and before sleeping. A refusal ends the call at once with Reason
// BudgetExhausted, Attempts the attempts that ran"; Retry: "the loop will
// sleep Delay before the next one": no Retry event for a refused retry.
func TestAttackTelBudgetRefusalNoRetryEvent(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b, err := budget.New(budget.Config{Ratio: -1, MinPerSecond: -1})
		if err != nil {
			t.Fatal(err)
		}
		rec := &telRec{}
		p, err := retry.New(retry.WithObserver(rec), retry.WithGuards(retry.Guards{Budget: b}), retry.WithBackoff(telNoJitter(t)))
		if err != nil {
			t.Fatal(err)
		}
		_ = p.Do(context.Background(), func(context.Context, int) error { return atkTemp{} })
		ev := rec.events()
		telPairs(t, ev)
		var kinds []string
		for _, e := range ev {
			kinds = append(kinds, string(e.Kind))
			if e.Kind == observe.GiveUp && (e.Reason != "budget-exhausted" || e.Attempt != 1 || !errors.Is(e.Err, atkTemp{})) {
				t.Errorf("GiveUp %q after %d, err %v; want budget-exhausted after 1 with the last error", e.Reason, e.Attempt, e.Err)
			}
		}
		if want := "[attempt-start attempt-end give-up]"; fmt.Sprint(kinds) != want {
			t.Errorf("kinds %v, want %s\n%s", kinds, want, telFmt(ev))
		}
	})
}

// AttemptEnd: "rejected" is "the dependency answered, but no: a 404, a
// 400"; a plain error the default classifier does not retry is not the
// dependency's failure; a Permanent mark "does not change how a circuit
// breaker counts the attempt": a Permanent temporary error is a failure.
func TestAttackTelRejectedVsPermanentFailure(t *testing.T) {
	rec := &telRec{}
	p, err := retry.New(retry.WithObserver(rec))
	if err != nil {
		t.Fatal(err)
	}
	_ = p.Do(context.Background(), func(context.Context, int) error { return errors.New("bad request") })
	_ = p.Do(context.Background(), func(context.Context, int) error { return retry.Permanent(atkTemp{}) })
	var outs []string
	for _, e := range rec.events() {
		if e.Kind == observe.AttemptEnd {
			outs = append(outs, e.Outcome)
		}
		if e.Kind == observe.GiveUp && e.Reason != "not-retryable" {
			t.Errorf("GiveUp %q, want not-retryable", e.Reason)
		}
	}
	if fmt.Sprint(outs) != "[rejected failure]" {
		t.Errorf("outcomes %v, want [rejected failure]", outs)
	}
}

// DoValueIf: "true makes the attempt a retryable failure, ... counted by
// the breaker as a failure of the dependency": its AttemptEnd is a
// "failure" with an Err (AttemptEnd: "Err (nil on success)").
func TestAttackTelDoValueIfAgainIsFailure(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rec := &telRec{}
		p, err := retry.New(retry.WithObserver(rec), retry.WithMaxAttempts(2), retry.WithBackoff(telNoJitter(t)))
		if err != nil {
			t.Fatal(err)
		}
		_, _ = retry.DoValueIf(context.Background(), p, func(context.Context, int) (int, error) { return 1, nil },
			func(int) bool { return true })
		ev := rec.events()
		telPairs(t, ev)
		for _, e := range ev {
			if e.Kind == observe.AttemptEnd && (e.Outcome != "failure" || e.Err == nil) {
				t.Errorf("attempt %d: Outcome %q Err %v; want failure with an error", e.Attempt, e.Outcome, e.Err)
			}
			if e.Kind == observe.Retry && e.Err == nil {
				t.Errorf("Retry after attempt %d without Err (Retry: attempt Attempt failed with Err)", e.Attempt)
			}
		}
	})
}

// telResp builds a response of code for r.
func telResp(r *http.Request, code int, hdr ...string) *http.Response {
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

// telRace is a base whose first request hangs until canceled and whose
// second (the hedge) answers after 10 ms with the status and headers given.
type telRace struct {
	n    atomic.Int64
	code int
	hdr  []string
}

func (s *telRace) RoundTrip(r *http.Request) (*http.Response, error) {
	d := 10 * time.Millisecond
	if s.n.Add(1) == 1 {
		d = time.Hour
	}
	select {
	case <-time.After(d):
	case <-r.Context().Done():
		return nil, r.Context().Err()
	}
	return telResp(r, s.code, s.hdr...), nil
}

// A hedge is "a copy of an attempt": its AttemptEnd's Outcome is one of
// AttemptEnd's, and the same answer gets the same Outcome as on a first
// copy: over httpretry a 404 or a 400 is the call's answer, a "success".
func TestAttackTelHedgeAnswerOutcome(t *testing.T) {
	cases := []telHedgeCase{
		{"404", 404, nil, "success"},
		{"400", 400, nil, "success"},
		{"501", 501, nil, ""},
	}
	telHedgeAnswer(t, cases)
}

// AttemptEnd's Outcome is "success", "failure", "rejected" or "canceled":
// a hedge answered 409 with Retry-After (a keyed request's "still in
// progress": not an answer) ended with "" and now ends as a "failure".
func TestAttackTelHedge409OutcomeEmpty(t *testing.T) {
	telHedgeAnswer(t, []telHedgeCase{{"409-retry-after", 409, []string{"Retry-After", "1"}, "failure"}})
}

type telHedgeCase struct {
	name string
	code int
	hdr  []string
	want string
}

func telHedgeAnswer(t *testing.T, cases []telHedgeCase) {
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				rec := &telRec{}
				rt, err := httpretry.NewTransport(&telRace{code: c.code, hdr: c.hdr}, httpretry.WithHedging(50*time.Millisecond, 0, 1),
					httpretry.WithObserver(rec), httpretry.WithRetry(retry.WithMaxAttempts(1)))
				if err != nil {
					t.Fatal(err)
				}
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://127.0.0.1:8080/x", nil)
				req.Header.Set("Idempotency-Key", "k1")
				resp, err := rt.RoundTrip(req)
				if err == nil {
					resp.Body.Close()
				}
				synctest.Wait()
				ev := rec.events()
				telPairs(t, ev)
				var first, hedge string
				for _, e := range ev {
					if e.Kind == observe.AttemptEnd {
						if e.Hedge {
							hedge = e.Outcome
						} else {
							first = e.Outcome
						}
					}
				}
				want := c.want
				if want == "" {
					want = first // the same answer as the attempt the loop counted
				}
				if hedge != want {
					t.Errorf("hedge answering %d: Outcome %q, want %q (the loop's attempt: %q)\n%s", c.code, hedge, want, first, telFmt(ev))
				}
			})
		})
	}
}

// httpretry.WithAttemptTimeout: an attempt that times out while the call
// has time is a "failure" (AttemptEnd: "canceled" only after its call's
// context ended), and Elapsed is the attempt's duration.
func TestAttackTelHTTPAttemptTimeout(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rec := &telRec{}
		base := telRoundTripFunc(func(r *http.Request) (*http.Response, error) {
			<-r.Context().Done()
			return nil, r.Context().Err()
		})
		rt, err := httpretry.NewTransport(base, httpretry.WithAttemptTimeout(100*time.Millisecond),
			httpretry.WithObserver(rec), httpretry.WithRetry(retry.WithMaxAttempts(2), retry.WithBackoff(telNoJitter(t))))
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://127.0.0.1:8080/x", nil)
		if resp, err := rt.RoundTrip(req); err == nil {
			resp.Body.Close()
		}
		ev := rec.events()
		telPairs(t, ev)
		for _, e := range ev {
			if e.Kind == observe.AttemptEnd && (e.Outcome != "failure" || e.Elapsed != 100*time.Millisecond) {
				t.Errorf("attempt %d: Outcome %q Elapsed %v, want failure after 100ms", e.Attempt, e.Outcome, e.Elapsed)
			}
			if e.Kind == observe.GiveUp && (e.Reason != "attempts-exhausted" || e.Attempt != 2) {
				t.Errorf("GiveUp %q after %d, want attempts-exhausted after 2", e.Reason, e.Attempt)
			}
		}
		if t.Failed() {
			t.Logf("events:\n%s", telFmt(ev))
		}
	})
}

type telRoundTripFunc func(*http.Request) (*http.Response, error)

func (f telRoundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

type telSlowLimiter struct{ d time.Duration }

func (l telSlowLimiter) Wait(ctx context.Context) error {
	select {
	case <-time.After(l.d):
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// AttemptStart: "attempt Attempt ... is about to be sent"; AttemptEnd:
// "attempt Attempt ended after Elapsed"; Event.Elapsed: "the duration of
// what ended: an attempt". A client-side rate limit (WithRateLimit) that
// makes the attempt wait 500 ms before it is sent: the attempt itself
// takes 100 ms.
func TestAttackTelRateLimitWaitNotInElapsed(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rec := &telRec{}
		p, err := retry.New(retry.WithObserver(rec), retry.WithRateLimit(telSlowLimiter{500 * time.Millisecond}))
		if err != nil {
			t.Fatal(err)
		}
		var sent time.Time
		err = p.Do(context.Background(), func(context.Context, int) error {
			sent = time.Now()
			time.Sleep(100 * time.Millisecond)
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		_ = sent
		for _, e := range rec.events() {
			if e.Kind == observe.AttemptEnd && e.Elapsed != 100*time.Millisecond {
				t.Errorf("AttemptEnd Elapsed %v, want the attempt's 100ms (the rate limiter's 500ms wait is not the attempt)", e.Elapsed)
			}
		}
	})
}

// GiveUp: "An operation that panicked ends its attempt (AttemptEnd,
// Outcome "failure") and its call (GiveUp, Reason "panic"), Err saying with
// what, before the panic goes on." A hedge whose base transport panics
// (the panic reaches the caller): every AttemptStart, the hedge's
// included, has its AttemptEnd, the panicking copy's a "failure", and the
// call a GiveUp "panic", all before the panic reaches the caller.
func TestAttackTelHedgePanicEvents(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rec := &telRec{}
		var n atomic.Int64
		base := telRoundTripFunc(func(r *http.Request) (*http.Response, error) {
			if n.Add(1) == 1 {
				select {
				case <-time.After(time.Second):
				case <-r.Context().Done():
					return nil, r.Context().Err()
				}
				return telResp(r, 200), nil
			}
			time.Sleep(10 * time.Millisecond)
			panic("boom")
		})
		rt, err := httpretry.NewTransport(base, httpretry.WithHedging(50*time.Millisecond, 0, 1), httpretry.WithObserver(rec))
		if err != nil {
			t.Fatal(err)
		}
		var atPanic []observe.Event
		func() {
			defer func() {
				if recover() == nil {
					t.Error("no panic")
				}
				atPanic = rec.events()
			}()
			req, _ := http.NewRequest(http.MethodGet, "http://127.0.0.1:8080/x", nil)
			_, _ = rt.RoundTrip(req)
		}()
		time.Sleep(2 * time.Second)
		synctest.Wait()
		telPairs(t, atPanic)
		var hedgeEnd, giveUp bool
		for _, e := range atPanic {
			if e.Kind == observe.AttemptEnd && e.Hedge {
				hedgeEnd = true
				if e.Outcome != "failure" || e.Err == nil {
					t.Errorf("panicking hedge ended %q err %v, want failure with an error", e.Outcome, e.Err)
				}
			}
			if e.Kind == observe.GiveUp {
				giveUp = true
				if e.Reason != "panic" {
					t.Errorf("GiveUp %q, want panic", e.Reason)
				}
			}
		}
		if !hedgeEnd || !giveUp {
			t.Errorf("hedge AttemptEnd %v, GiveUp %v before the panic reached the caller; want both", hedgeEnd, giveUp)
		}
		if t.Failed() {
			t.Logf("events at the panic:\n%s\nall:\n%s", telFmt(atPanic), telFmt(rec.events()))
		}
	})
}

// Guards.Limiter: "A refusal ... sends nothing ... and ends the call with
// Reason Limited"; AttemptStart is for an attempt "about to be sent":
// none for a refused call, and GiveUp's Attempt is "the attempts made": 0.
// Likewise a breaker that rejects a call without a deadline.
func TestAttackTelRefusedBeforeSending(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		lim, err := limit.New(limit.Config{Max: 1, Waiting: -1})
		if err != nil {
			t.Fatal(err)
		}
		held, err := lim.Acquire(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		defer lim.Release(held, false)
		brk, err := breaker.New(breaker.Config{ConsecutiveFailures: 1})
		if err != nil {
			t.Fatal(err)
		}
		pm, err := brk.Allow()
		if err != nil {
			t.Fatal(err)
		}
		brk.Done(pm, false)
		for _, c := range []struct {
			reason string
			g      retry.Guards
		}{{"limited", retry.Guards{Limiter: lim}}, {"circuit-open", retry.Guards{Breaker: brk}}} {
			rec := &telRec{}
			p, err := retry.New(retry.WithObserver(rec), retry.WithGuards(c.g))
			if err != nil {
				t.Fatal(err)
			}
			ran := false
			_ = p.Do(context.Background(), func(context.Context, int) error { ran = true; return nil })
			ev := rec.events()
			if ran || len(ev) != 1 || ev[0].Kind != observe.GiveUp || ev[0].Reason != c.reason || ev[0].Attempt != 0 {
				t.Errorf("%s: ran %v, events\n%s", c.reason, ran, telFmt(ev))
			}
		}
	})
}

// Admission: Outcome "admitted", "queued", "shed-retry" or "shed-busy";
// Reason the controller's outcome name or "deadline"; "Delay is the
// Retry-After it answered with, if it shed; Elapsed is the time the
// request spent queued". A request canceled by its caller after 100 ms in
// the queue, and one whose deadline had passed on arrival. (Reported, not
// asserted beyond the documented sets.)
func TestAttackTelAdmissionCanceledEvents(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rec := &telRec{}
		c, err := admission.New(admission.Config{MaxInFlight: 1, Observer: rec, Name: "svc"})
		if err != nil {
			t.Fatal(err)
		}
		p1, d1 := c.Acquire(context.Background(), 1)
		if d1.Outcome != admission.Admitted {
			t.Fatal(d1)
		}
		defer p1.Release()
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan admission.Decision)
		go func() {
			_, d := c.Acquire(ctx, 1)
			done <- d
		}()
		time.Sleep(100 * time.Millisecond)
		cancel()
		d2 := <-done
		past, cancel2 := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
		defer cancel2()
		_, d3 := c.Acquire(past, 1)
		t.Logf("decisions %v %v", d2.Outcome, d3.Outcome)
		outcomes := map[string]bool{"admitted": true, "queued": true, "shed-retry": true, "shed-busy": true}
		reasons := map[string]bool{"": true, "retry-refused": true, "queue-full": true, "queue-timeout": true, "canceled": true, "deadline": true}
		ev := rec.events()
		for _, e := range ev {
			if !outcomes[e.Outcome] || !reasons[e.Reason] {
				t.Errorf("Admission event Outcome %q Reason %q: outside the documented sets (Outcome admitted, queued, shed-retry, shed-busy)", e.Outcome, e.Reason)
			}
		}
		t.Logf("events:\n%s", telFmt(ev))
	})
}

// Event.Attempt: "the attempt number (1 for the first), or for GiveUp the
// attempts made". A call that waits behind an open breaker and is handed
// probes that fail: its attempts are numbered 1, 2, ... and its GiveUp
// counts them all.
func TestAttackTelProbeNumbering(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		brk, err := breaker.New(breaker.Config{ConsecutiveFailures: 1, OpenFor: time.Second, Probes: 1})
		if err != nil {
			t.Fatal(err)
		}
		pm, err := brk.Allow()
		if err != nil {
			t.Fatal(err)
		}
		brk.Done(pm, false)
		rec := &telRec{}
		p, err := retry.New(retry.WithObserver(rec), retry.WithGuards(retry.Guards{Breaker: brk}),
			retry.WithMaxAttempts(2), retry.WithBackoff(telNoJitter(t)))
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		runs := 0
		err = p.Do(ctx, func(context.Context, int) error { runs++; return atkTemp{} })
		ev := rec.events()
		telPairs(t, ev)
		n := 0
		for _, e := range ev {
			if e.Kind == observe.AttemptStart {
				n++
				if e.Attempt != n {
					t.Errorf("AttemptStart #%d has Attempt %d", n, e.Attempt)
				}
			}
			if e.Kind == observe.GiveUp && e.Attempt != runs {
				t.Errorf("GiveUp Attempt %d, but %d attempts ran", e.Attempt, runs)
			}
		}
		if t.Failed() {
			t.Logf("err %v\n%s", err, telFmt(ev))
		}
	})
}
