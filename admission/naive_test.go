package admission_test

import (
	"context"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stormguard/stormguard/admission"
	"github.com/stormguard/stormguard/idempotency"
)

// naiveBackoff says how long a naive client waits after its nth attempt
// failed with the given Retry-After (maybe ""), and whether it tries again.
type naiveBackoff func(n int, retryAfter string) (time.Duration, bool)

// fixedLoop is the hand-rolled loop: 1 s after any failure, until the
// deadline.
func fixedLoop(int, string) (time.Duration, bool) { return time.Second, true }

// retryablehttpLike is go-retryablehttp's default policy: 4 retries,
// Retry-After honoured, else 1 s doubling up to 30 s.
func retryablehttpLike(n int, retryAfter string) (time.Duration, bool) {
	if s, err := strconv.Atoi(retryAfter); err == nil {
		return time.Duration(s) * time.Second, n <= 4
	}
	return min(time.Second<<(n-1), 30*time.Second), n <= 4
}

// failsafeLike is failsafe-go's retry policy as the live bench builds it
// (failsafehttp.NewRetryPolicyBuilder().Build()): 2 retries, at once
// unless the answer carries a Retry-After, then after it.
func failsafeLike(n int, retryAfter string) (time.Duration, bool) {
	if s, err := strconv.Atoi(retryAfter); err == nil {
		return time.Duration(s) * time.Second, n <= 2
	}
	return 0, n <= 2
}

// naiveRun is the outcome of runNaive: per second of the run, the payments
// started in it and those of them that succeeded before their deadline.
type naiveRun struct {
	started, ok []int
}

// goodput returns the share of the payments started in second s that
// succeeded (1 if none started).
func (r *naiveRun) goodput(s int) float64 {
	if r.started[s] == 0 {
		return 1
	}
	return float64(r.ok[s]) / float64(r.started[s])
}

// naiveTrigger is what the provider of runNaive does from cutAt for cutFor.
type naiveTrigger int

const (
	// slowdown multiplies the service time by 5 (the capacity cut by 80%)
	// for the requests that get a worker during the trigger.
	slowdown naiveTrigger = iota
	// hang stalls the workers: a request that gets one during the trigger
	// is served (its work begins) only when the trigger ends.
	hang
)

// runNaive runs, in a synctest bubble, a population of naive clients
// against a provider of `workers` workers whose service time is `work`,
// changed from cutAt for cutFor by the trigger (five times the service
// time, its capacity cut by 80%, or a hang), behind ctl. Payments start at rate/s (Poisson, seeded) for `run`; each has a
// new idempotency key and a deadline of 20 s, and its client is the fixed
// loop of a user who knows no protocol: POST with the key and no attempt
// header and no deadline field, give up on the attempt after 1 s (the
// request's context is canceled, as a client that hangs up, with no
// deadline the server could read), sleep 1 s after any failure and POST
// again with the same key, until the deadline. The provider serves the
// work it admitted even after its caller left.
func runNaive(t *testing.T, ctl *admission.Controller, workers int, work time.Duration, rate float64, trigger naiveTrigger, cutAt, cutFor, run time.Duration, backoff naiveBackoff) *naiveRun {
	t.Helper()
	const (
		attemptTimeout = time.Second
		deadline       = 20 * time.Second
	)
	start := time.Now()
	slots := make(chan struct{}, workers) // the provider's workers
	h := ctl.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		slots <- struct{}{}
		d := work
		if at := time.Since(start); at >= cutAt && at < cutAt+cutFor {
			switch trigger {
			case slowdown:
				d *= 5
			case hang:
				d += cutAt + cutFor - at
			}
		}
		time.Sleep(d)
		<-slots
	}))
	secs := int(run / time.Second)
	res := &naiveRun{started: make([]int, secs), ok: make([]int, secs)}
	var mu sync.Mutex
	var wg sync.WaitGroup
	rnd := rand.New(rand.NewPCG(20, 5))
	for n := 0; ; n++ {
		time.Sleep(time.Duration(rnd.ExpFloat64() / rate * float64(time.Second)))
		at := time.Since(start)
		if at >= run {
			break
		}
		key := "pay-" + strconv.Itoa(n)
		wg.Add(1)
		go func() {
			defer wg.Done()
			end := time.Now().Add(deadline)
			ok := false
			for n := 1; !ok && time.Now().Before(end); n++ {
				ctx, cancel := context.WithCancel(context.Background())
				timer := time.AfterFunc(attemptTimeout, cancel)
				r := httptest.NewRequestWithContext(ctx, http.MethodPost, "http://provider.test/pay", nil)
				r.Header.Set(idempotency.Header, key)
				rec := httptest.NewRecorder()
				h.ServeHTTP(rec, r)
				// The answer counts if it came within the attempt's timeout.
				ok = rec.Code == http.StatusOK && ctx.Err() == nil && time.Now().Before(end)
				timer.Stop()
				cancel()
				if !ok {
					pause, again := backoff(n, rec.Header().Get("Retry-After"))
					if !again {
						break
					}
					time.Sleep(pause)
				}
			}
			mu.Lock()
			s := int(at / time.Second)
			res.started[s]++
			if ok {
				res.ok[s]++
			}
			mu.Unlock()
		}()
	}
	wg.Wait()
	return res
}

// TestNaiveClientsRecover: with admission in front of a provider near its
// capacity (rho 0.9), a capacity cut of 10 s leaves a backlog of payments
// whose naive clients (no attempt header, no deadline field) keep resending
// after the cut ends. The payments started from 2 s after its end must
// succeed as if nothing had happened: the backlog's resends are retries
// (their keys were seen), and a retry never takes a slot or a place in the
// queue from an original. Three clients, each >= 95% of the payments
// started in each second: the fixed loop (a resend every second until the
// 20 s deadline; 75-99% before originals came first), go-retryablehttp's
// policy (4 retries, Retry-After honoured; 86-89% at worst where a resend
// after a 10 s Retry-After passed for an original), and failsafe-go's
// (2 retries, at once unless told to wait), after the slowdown and after
// a hang. Every row is at 96-99% in the first second after the cut's end
// and 100% from the next: where the live runs (docs/metastability.md)
// take longer, what differs is outside this model (real sockets and
// timers, and 1000 clients sharing the bench machine's CPU). Under the race detector the run is shorter (a 4 s cut at
// 2 s, 14 s in all: the same code, about 40% of the CPU); the full run
// goes without it (make test's pass without -race).
func TestNaiveClientsRecover(t *testing.T) {
	const (
		workers = 10
		work    = 20 * time.Millisecond // capacity 500/s, 100/s during the cut
		rate    = 450.0                 // rho 0.9
	)
	cutAt, cutFor, run := 5*time.Second, 10*time.Second, 35*time.Second
	if raceEnabled {
		cutAt, cutFor, run = 2*time.Second, 4*time.Second, 14*time.Second
	}
	for _, tc := range []struct {
		name    string
		backoff naiveBackoff
		trigger naiveTrigger
		min     float64
	}{
		{"fixed 1 s loop", fixedLoop, slowdown, 0.95},
		{"go-retryablehttp's policy", retryablehttpLike, slowdown, 0.95},
		{"failsafe-go's policy", failsafeLike, slowdown, 0.95},
		{"failsafe-go's policy, hang", failsafeLike, hang, 0.95},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				ctl := newController(t, admission.Config{MaxInFlight: workers, MaxQueue: 1000, LatencyCeiling: time.Second, Rand: seeded(7)})
				res := runNaive(t, ctl, workers, work, rate, tc.trigger, cutAt, cutFor, run, tc.backoff)
				var during, duringOK int
				for s := int(cutAt / time.Second); s < int((cutAt+cutFor)/time.Second); s++ {
					during += res.started[s]
					duringOK += res.ok[s]
				}
				// During a slowdown the provider serves 100/s: at least
				// 90% of that must be payments (the clients' work, not
				// abandoned attempts). A hang serves none.
				if min := 0.9 * 100 * cutFor.Seconds(); tc.trigger == slowdown && float64(duringOK) < min {
					t.Errorf("payments started during the cut that succeeded: %d of %d, want >= %.0f (90%% of the reduced capacity)", duringOK, during, min)
				}
				first := int((cutAt+cutFor)/time.Second) + 2
				for s := first; s < int(run/time.Second); s++ {
					if g := res.goodput(s); g < tc.min {
						t.Errorf("second %d (%v after the cut's end): goodput %.1f%% (%d of %d), want >= %.0f%%",
							s, time.Duration(s)*time.Second-cutAt-cutFor, 100*g, res.ok[s], res.started[s], 100*tc.min)
					}
				}
				t.Logf("goodput per second: %v", res.perSecond())
			})
		})
	}
}

// perSecond returns the goodput of each second, in percent.
func (r *naiveRun) perSecond() []int {
	out := make([]int, len(r.started))
	for s := range out {
		out[s] = int(100 * r.goodput(s))
	}
	return out
}
