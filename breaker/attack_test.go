// Black-box tests of the package against its documentation, from attacks
// on it from outside: each names the sentence it checks.

package breaker_test

import (
	"context"
	"errors"
	"math"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stormguard/stormguard/breaker"
)

func atkMust(t *testing.T, c breaker.Config) *breaker.Breaker {
	t.Helper()
	b, err := breaker.New(c)
	if err != nil {
		t.Fatalf("New(%+v): %v", c, err)
	}
	return b
}

func atkHalf() float64 { return 0.5 }

// Validation: errors iff the documented conditions, text prefix, naming the field.
func TestAttackConfigValidation(t *testing.T) {
	bad := []struct {
		name  string
		field string
		c     breaker.Config
	}{
		{"ratio>1", "FailureRatio", breaker.Config{FailureRatio: 1.0001}},
		{"ratio<0", "FailureRatio", breaker.Config{FailureRatio: -0.1}},
		{"ratioNaN", "FailureRatio", breaker.Config{FailureRatio: math.NaN()}},
		{"ratioInf", "FailureRatio", breaker.Config{FailureRatio: math.Inf(1)}},
		{"ratio-Inf", "FailureRatio", breaker.Config{FailureRatio: math.Inf(-1)}},
		{"window<0", "Window", breaker.Config{Window: -1}},
		{"buckets<0", "Buckets", breaker.Config{Buckets: -1}},
		{"mincalls<0", "MinCalls", breaker.Config{MinCalls: -1}},
		{"consec<0", "ConsecutiveFailures", breaker.Config{ConsecutiveFailures: -1}},
		{"consec>2^32-1", "ConsecutiveFailures", breaker.Config{ConsecutiveFailures: math.MaxUint32 + 1}}, // a run counted in 32 bits never reaches it
		{"openfor<0", "OpenFor", breaker.Config{OpenFor: -1}},
		{"probes<0", "Probes", breaker.Config{Probes: -1}},
		{"buckets>3600", "Buckets", breaker.Config{Buckets: 3601, Window: 3601 * time.Millisecond}},
		{"notmultiple", "Window", breaker.Config{Window: 10*time.Second + 1}},
		{"bucket<1ms", "Window", breaker.Config{Window: 5 * time.Millisecond}},
		{"bucket<1ms-b", "Window", breaker.Config{Window: 999 * time.Microsecond, Buckets: 1}},
		{"defaultwindow/7", "Window", breaker.Config{Buckets: 7}},
		{"maxopen<openfor", "MaxOpenFor", breaker.Config{OpenFor: 2 * time.Second, MaxOpenFor: time.Second}},
		{"maxopen<defaultopenfor", "MaxOpenFor", breaker.Config{MaxOpenFor: 500 * time.Millisecond}},
		{"maxopen<0", "MaxOpenFor", breaker.Config{MaxOpenFor: -1}},
		{"slow<0", "SlowCall", breaker.Config{SlowCall: -1}},
		{"releaseNaN", "ReleaseRate", breaker.Config{ReleaseRate: math.NaN()}},
	}
	for _, tc := range bad {
		b, err := breaker.New(tc.c)
		if err == nil {
			t.Errorf("%s: New accepted %+v (got %v)", tc.name, tc.c, b != nil)
			continue
		}
		if !strings.HasPrefix(err.Error(), "breaker: invalid config: ") {
			t.Errorf("%s: error %q lacks prefix", tc.name, err)
		}
		if !strings.Contains(strings.ReplaceAll(strings.ToLower(err.Error()), " ", ""), strings.ToLower(tc.field)) {
			t.Errorf("%s: error %q does not name %s", tc.name, err, tc.field)
		}
	}
	good := []breaker.Config{
		{},
		{FailureRatio: 1},
		{FailureRatio: math.SmallestNonzeroFloat64},
		{Buckets: 3600, Window: 3600 * time.Millisecond},
		{Window: time.Millisecond, Buckets: 1},
		{Window: 10 * time.Millisecond}, // 10 buckets of 1 ms
		{MaxOpenFor: time.Second},
		{OpenFor: 2 * time.Second, MaxOpenFor: 2 * time.Second},
		{MaxWaiters: -5},
		{ReleaseRate: -1},
		{ReleaseRate: math.Inf(1)},
		{ReleaseRate: math.Inf(-1)},
		{ReleaseRate: 1e-300},
		{ReleaseRate: math.MaxFloat64},
		{OpenFor: math.MaxInt64},
		{OpenFor: math.MaxInt64, MaxOpenFor: math.MaxInt64},
		{SlowCall: math.MaxInt64},
		{MinCalls: math.MaxInt},
		{Probes: 1},
		{ConsecutiveFailures: math.MaxUint32}, // the largest a 32-bit run reaches
		{Window: time.Duration(math.MaxInt64 / 3600 * 3600), Buckets: 3600},
		{Window: math.MaxInt64, Buckets: 1},
	}
	for _, c := range good {
		if _, err := breaker.New(c); err != nil {
			t.Errorf("New(%+v) = %v, want nil", c, err)
		}
	}
}

// Float rounding: failures >= FailureRatio·calls with ratio 0.3 and 3 of 10.
func TestAttackRatioExactBoundary(t *testing.T) {
	for _, tc := range []struct {
		ratio    float64
		calls    int
		failures int
	}{
		{0.3, 10, 3}, {0.7, 10, 7}, {0.1, 10, 1}, {0.6, 5, 3}, {0.9, 10, 9}, {0.35, 20, 7}, {0.45, 20, 9}, {0.15, 20, 3}, {0.55, 20, 11},
	} {
		synctest.Test(t, func(t *testing.T) {
			b := atkMust(t, breaker.Config{FailureRatio: tc.ratio, MinCalls: tc.calls, Rand: atkHalf})
			for i := 0; i < tc.calls-tc.failures; i++ {
				p, err := b.Allow()
				if err != nil {
					t.Fatal(err)
				}
				b.Done(p, true)
			}
			for i := 0; i < tc.failures; i++ {
				p, err := b.Allow()
				if err != nil {
					t.Fatalf("ratio %v: tripped early at failure %d", tc.ratio, i)
				}
				b.Done(p, false)
			}
			if s := b.State(); s != breaker.Open {
				t.Errorf("ratio %v: %d failures of %d calls: state %v, want open (failures >= ratio*calls)", tc.ratio, tc.failures, tc.calls, s)
			}
		})
	}
}

func TestAttackMinCallsHolds(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := atkMust(t, breaker.Config{MinCalls: 5, Rand: atkHalf})
		for i := 0; i < 4; i++ {
			p, _ := b.Allow()
			b.Done(p, false)
		}
		if b.State() != breaker.Closed {
			t.Fatalf("tripped below MinCalls")
		}
		p, _ := b.Allow()
		b.Done(p, false)
		if b.State() != breaker.Open {
			t.Fatalf("not tripped at MinCalls")
		}
	})
}

// A success that brings the ratio up never trips ("After a failure").
func TestAttackSuccessNeverTrips(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := atkMust(t, breaker.Config{MinCalls: 4, Rand: atkHalf})
		for i := 0; i < 3; i++ {
			p, _ := b.Allow()
			b.Done(p, false)
		}
		// only 3 calls; success gets to 4 calls, 3 failures (75%)
		p, _ := b.Allow()
		b.Done(p, true)
		if b.State() != breaker.Closed {
			t.Fatalf("a success tripped")
		}
		p, _ = b.Allow()
		b.Done(p, false)
		if b.State() != breaker.Open {
			t.Fatalf("not open after failure")
		}
	})
}

func TestAttackWindowSlides(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := atkMust(t, breaker.Config{MinCalls: 4, Window: 4 * time.Second, Buckets: 4, Rand: atkHalf})
		for i := 0; i < 3; i++ {
			p, _ := b.Allow()
			b.Done(p, false)
		}
		if s := b.Snapshot(); s.Calls != 3 || s.Failures != 3 {
			t.Fatalf("snapshot %+v", s)
		}
		time.Sleep(4 * time.Second)
		if s := b.Snapshot(); s.Calls != 0 || s.Failures != 0 {
			t.Errorf("after a window, snapshot %+v, want empty", s)
		}
		p, _ := b.Allow()
		b.Done(p, false)
		if b.State() != breaker.Closed {
			t.Errorf("tripped on outcomes that left the window")
		}
		// still within window: 3 seconds later calls count
		time.Sleep(3 * time.Second)
		for i := 0; i < 3; i++ {
			p, _ := b.Allow()
			b.Done(p, false)
		}
		if b.State() != breaker.Open {
			t.Errorf("4 failures within 4 buckets did not trip: %+v", b.Snapshot())
		}
	})
}

func TestAttackOpenPeriodAndError(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var rv float64 = 0.5
		var mu sync.Mutex
		r := func() float64 { mu.Lock(); defer mu.Unlock(); return rv }
		b := atkMust(t, breaker.Config{ConsecutiveFailures: 1, OpenFor: 10 * time.Second, Rand: r})
		p, _ := b.Allow()
		b.Done(p, false)
		_, err := b.Allow()
		var oe *breaker.OpenError
		if !errors.As(err, &oe) || !errors.Is(err, breaker.ErrOpen) {
			t.Fatalf("err %v", err)
		}
		if oe.State != breaker.Open || oe.Wait != 10*time.Second || oe.RetryAfter() != 10*time.Second {
			t.Errorf("oe %+v", oe)
		}
		if got := oe.Error(); got != "breaker: open, half-open in 10s" {
			t.Errorf("msg %q", got)
		}
		if s := b.Snapshot(); s.State != breaker.Open || s.HalfOpenIn != 10*time.Second {
			t.Errorf("snap %+v", s)
		}
		time.Sleep(10*time.Second - 1)
		if s := b.State(); s != breaker.Open {
			t.Errorf("half-open early: %v", s)
		}
		time.Sleep(time.Nanosecond)
		if s := b.State(); s != breaker.HalfOpen {
			t.Errorf("not half-open at OpenFor: %v", s)
		}
		// three probes
		var ps []breaker.Permit
		for i := 0; i < 3; i++ {
			p, err := b.Allow()
			if err != nil || !p.Probe() {
				t.Fatalf("probe %d: %v %v", i, err, p.Probe())
			}
			ps = append(ps, p)
		}
		_, err = b.Allow()
		if !errors.As(err, &oe) || oe.State != breaker.HalfOpen || oe.Wait != 0 {
			t.Errorf("4th in half-open: %v %+v", err, oe)
		}
		// Jitter bounds: fail the first probe with rand = 0 -> 8s
		mu.Lock()
		rv = 0
		mu.Unlock()
		b.Done(ps[0], false)
		if s := b.Snapshot(); s.State != breaker.Open || s.HalfOpenIn != 8*time.Second {
			t.Errorf("rand 0: snap %+v want 8s", s)
		}
		b.Done(ps[1], true) // stale
		b.Done(ps[2], true)
		if b.State() != breaker.Open {
			t.Errorf("stale probes changed state")
		}
	})
}

func TestAttackJitterUpper(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := func() float64 { return math.Nextafter(1, 0) }
		b := atkMust(t, breaker.Config{ConsecutiveFailures: 1, OpenFor: 10 * time.Second, Rand: r})
		p, _ := b.Allow()
		b.Done(p, false)
		s := b.Snapshot()
		if s.HalfOpenIn > 12*time.Second || s.HalfOpenIn < 11900*time.Millisecond {
			t.Errorf("HalfOpenIn %v, want about 12s", s.HalfOpenIn)
		}
	})
}

func TestAttackStateString(t *testing.T) {
	for s, want := range map[breaker.State]string{breaker.Closed: "closed", breaker.HalfOpen: "half-open", breaker.Open: "open", 3: "State(3)", 255: "State(255)"} {
		if s.String() != want {
			t.Errorf("%d: %q want %q", uint8(s), s.String(), want)
		}
	}
}

// Wait: maxWait <= 0 rejects at once; ctx end returns an OpenError.
func TestAttackWaitRejections(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := atkMust(t, breaker.Config{ConsecutiveFailures: 1, OpenFor: time.Second, Rand: atkHalf})
		p, _ := b.Allow()
		b.Done(p, false)
		for _, mw := range []time.Duration{0, -1, math.MinInt64, 500 * time.Millisecond} {
			start := time.Now()
			_, err := b.Wait(context.Background(), mw)
			var oe *breaker.OpenError
			if !errors.As(err, &oe) || oe.State != breaker.Open {
				t.Errorf("maxWait %v: %v", mw, err)
			}
			if time.Since(start) != 0 {
				t.Errorf("maxWait %v waited %v", mw, time.Since(start))
			}
		}
		ctx, cancel := context.WithCancel(context.Background())
		go func() { time.Sleep(300 * time.Millisecond); cancel() }()
		start := time.Now()
		_, err := b.Wait(ctx, 5*time.Second)
		var oe *breaker.OpenError
		if !errors.As(err, &oe) {
			t.Errorf("ctx cancel: %v, want *OpenError", err)
		} else if oe.State != breaker.Open || oe.Wait != 700*time.Millisecond {
			t.Errorf("ctx cancel: %+v, want open, 700ms", oe)
		}
		if time.Since(start) != 300*time.Millisecond {
			t.Errorf("returned after %v", time.Since(start))
		}
		if s := b.Snapshot(); s.Waiters != 0 {
			t.Errorf("waiters %d after cancel", s.Waiters)
		}
	})
}

func TestAttackWaitCanceledCtxBefore(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := atkMust(t, breaker.Config{ConsecutiveFailures: 1, OpenFor: time.Second, Rand: atkHalf})
		p, _ := b.Allow()
		b.Done(p, false)
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		_, err := b.Wait(ctx, 5*time.Second)
		if !errors.Is(err, breaker.ErrOpen) {
			t.Errorf("canceled ctx: %v", err)
		}
		if s := b.Snapshot(); s.Waiters != 0 {
			t.Errorf("waiters %d", s.Waiters)
		}
	})
}

// MaxWaiters bound and negative turns it off.
func TestAttackMaxWaiters(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := atkMust(t, breaker.Config{ConsecutiveFailures: 1, OpenFor: time.Second, MaxWaiters: 2, Rand: atkHalf, Probes: 1})
		p, _ := b.Allow()
		b.Done(p, false)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		var wg sync.WaitGroup
		for i := 0; i < 2; i++ {
			wg.Add(1)
			go func() { defer wg.Done(); b.Wait(ctx, 5*time.Second) }()
		}
		synctest.Wait()
		if s := b.Snapshot(); s.Waiters != 2 {
			t.Errorf("waiters %d", s.Waiters)
		}
		start := time.Now()
		_, err := b.Wait(ctx, 5*time.Second)
		if !errors.Is(err, breaker.ErrOpen) || time.Since(start) != 0 {
			t.Errorf("third waiter: %v after %v", err, time.Since(start))
		}
		cancel()
		wg.Wait()

		b2 := atkMust(t, breaker.Config{ConsecutiveFailures: 1, OpenFor: time.Second, MaxWaiters: -1, Rand: atkHalf})
		p, _ = b2.Allow()
		b2.Done(p, false)
		start = time.Now()
		_, err = b2.Wait(context.Background(), 5*time.Second)
		if !errors.Is(err, breaker.ErrOpen) || time.Since(start) != 0 {
			t.Errorf("waiting off: %v after %v", err, time.Since(start))
		}
	})
}

// Probes go to the waiters with the most time left (Wait: "the calls with
// the most time left first"); a canceled probe's slot to the next of them.
func TestAttackProbesMostTimeLeft(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := atkMust(t, breaker.Config{ConsecutiveFailures: 1, OpenFor: time.Second, Probes: 1, Rand: atkHalf})
		p, _ := b.Allow()
		b.Done(p, false)
		type res struct {
			id int
			p  breaker.Permit
			at time.Duration
		}
		start := time.Now()
		ch := make(chan res, 3)
		for i, mw := range []time.Duration{9 * time.Second, 3 * time.Second, 6 * time.Second} {
			go func() {
				p, err := b.Wait(context.Background(), mw)
				if err != nil {
					ch <- res{id: -i - 1, at: time.Since(start)}
					return
				}
				ch <- res{id: i, p: p, at: time.Since(start)}
			}()
			synctest.Wait()
		}
		r := <-ch
		if r.id != 0 || !r.p.Probe() || r.at != time.Second {
			t.Errorf("first admitted %+v, want id 0 (9 s) probe at 1s", r)
		}
		select {
		case r2 := <-ch:
			t.Errorf("second admitted while probe in flight: %+v", r2)
		default:
		}
		b.Cancel(r.p) // free slot goes to waiting call first
		synctest.Wait()
		select {
		case r2 := <-ch:
			if r2.id != 2 || !r2.p.Probe() {
				t.Errorf("after Cancel: %+v, want id 2 (6 s) probe", r2)
			}
			b.Done(r2.p, true)
		default:
			t.Errorf("Cancel did not pass the probe slot to a waiter")
		}
		synctest.Wait()
		if b.State() != breaker.Closed {
			t.Errorf("state %v after probe success", b.State())
		}
		r3 := <-ch
		if r3.id != 1 || r3.p.Probe() {
			t.Errorf("third %+v, want id 1 released", r3)
		}
		b.Done(r3.p, true)
	})
}
