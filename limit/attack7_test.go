// Black-box attacks on package limit (AREA lim2026), against limit/doc.go,
// the exported doc comments of limit/*.go and docs/metastability.md.

package limit_test

import (
	"context"
	"errors"
	"math"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stormguard/stormguard/limit"
)

func lim26New(t *testing.T, c limit.Config) *limit.Limiter {
	t.Helper()
	l, err := limit.New(c)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

type lim26Result struct {
	p   limit.Permit
	err error
	at  time.Duration
}

// lim26Go starts Acquire(ctx) in a goroutine and returns the channel of its
// result (with the bubble time it came at, from t0).
func lim26Go(l *limit.Limiter, ctx context.Context, t0 time.Time) <-chan lim26Result {
	ch := make(chan lim26Result, 1)
	go func() {
		p, err := l.Acquire(ctx)
		ch <- lim26Result{p, err, time.Since(t0)}
	}()
	return ch
}

// doc.go: "Calls that cannot make their deadline fail fast with ErrLimited
// and the reason, not at their deadline: ... and while waiting when the
// deadline comes within the baseline latency (a slot granted later could
// not be answered in time)"; Acquire: "while waiting, when its deadline
// comes within the fastest answer (with no latency measured yet: at its
// deadline)"; "a call that waited never gets a slot it has no time to
// use". A call that began to wait before any latency was measured, and is
// still waiting when the baseline (100 ms) is known, must not be handed a
// slot 50 ms before its deadline.
func TestAttackLimWaiterBeforeBaselineFailsInTime(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		t0 := time.Now()
		l := lim26New(t, limit.Config{Max: 2})
		p1, err := l.Acquire(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		p2, err := l.Acquire(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		// Two calls with deadlines wait; no latency is known yet.
		ctxA, cancelA := context.WithTimeout(context.Background(), 500*time.Millisecond)
		defer cancelA()
		ctxW, cancelW := context.WithTimeout(context.Background(), time.Second)
		defer cancelW()
		a := lim26Go(l, ctxA, t0)
		synctest.Wait()
		w := lim26Go(l, ctxW, t0)
		synctest.Wait()

		// At 100 ms the first answer comes: the baseline is 100 ms. Its
		// slot goes to A (earliest deadline); W waits on.
		time.Sleep(100 * time.Millisecond)
		l.Release(p1, false)
		synctest.Wait()
		ra := <-a
		if ra.err != nil {
			t.Fatalf("A: %v", ra.err)
		}
		// W's deadline comes within the baseline at 900 ms. A slot freed
		// at 950 ms (50 ms left, half the fastest answer) must not be W's.
		time.Sleep(850 * time.Millisecond) // now 950 ms
		select {
		case r := <-w:
			if r.err == nil {
				t.Fatalf("W got a slot at %v", r.at)
			}
			t.Logf("W failed at %v: %v (as documented)", r.at, r.err)
			return
		default:
		}
		l.Release(p2, false)
		synctest.Wait()
		var r lim26Result
		select {
		case r = <-w:
		default:
			time.Sleep(time.Second)
			r = <-w
		}
		if r.err == nil {
			l.Release(r.p, false)
			t.Errorf("a call that waited from before the first latency sample got a slot at %v with %v left of its deadline, the baseline being 100 ms; want it failed by 900 ms (deadline within the baseline) with ErrLimited", r.at, time.Second-r.at)
		} else if r.at > 900*time.Millisecond {
			t.Errorf("W failed at %v (%v), want by 900 ms", r.at, r.err)
		}
		l.Release(ra.p, false)
	})
}

// The same with a baseline that falls while the call waits: a call that
// arrived when the baseline was 100 ms, whose deadline is 2 s away, is
// refused 100 ms before it ("the deadline leaves less than the
// destination's fastest answer") after the fastest answer became 10 ms:
// it could still be served at 1.95 s.
func TestAttackLimWaiterFollowsFallingBaseline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		t0 := time.Now()
		l := lim26New(t, limit.Config{Max: 2})
		// Baseline 100 ms.
		p, err := l.Acquire(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(100 * time.Millisecond)
		l.Release(p, false)
		// Fill the limit (2) and queue W (deadline 2 s from now, 1.9 s
		// before its timer at the old baseline) behind soakers with earlier
		// deadlines that take the slots and answer in 10 ms.
		hold1, err := l.Acquire(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		hold2, err := l.Acquire(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		start := time.Since(t0)
		ctxW, cancelW := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancelW()
		w := lim26Go(l, ctxW, t0)
		synctest.Wait()
		// The soakers: one at a time, each 10 ms, while hold2 stays in
		// flight; the next one waits before the current one releases, so
		// that every freed slot goes to a soaker (earlier deadline than W).
		const soakers = 20
		ctxS, cancelS := context.WithTimeout(context.Background(), 1500*time.Millisecond)
		defer cancelS()
		next := lim26Go(l, ctxS, t0)
		synctest.Wait()
		time.Sleep(100 * time.Millisecond)
		l.Release(hold1, false)
		synctest.Wait()
		var busy limit.Permit
		for i := range soakers {
			var r lim26Result
			select {
			case r = <-next:
			default:
				t.Fatal("soaker not granted")
			}
			if r.err != nil {
				t.Fatalf("soaker %d: %v", i, r.err)
			}
			time.Sleep(10 * time.Millisecond)
			if i == soakers-1 {
				busy = r.p // keep the slot: W waits on
				break
			}
			next = lim26Go(l, ctxS, t0)
			synctest.Wait()
			l.Release(r.p, false)
			synctest.Wait()
			select {
			case r := <-w:
				t.Fatalf("W ended early at %v: %v", r.at, r.err)
			default:
			}
			time.Sleep(50 * time.Millisecond)
		}
		// The baseline is 10 ms now: a new call with 50 ms left is not
		// refused at once as too close (it was at a 100 ms baseline).
		ctxP, cancelP := context.WithTimeout(context.Background(), 50*time.Millisecond)
		probe := lim26Go(l, ctxP, t0)
		synctest.Wait()
		select {
		case r := <-probe:
			t.Fatalf("setup: a call with 50 ms left refused at once (%v): the baseline did not fall", r.err)
		default:
		}
		cancelP()
		synctest.Wait()
		<-probe
		// W's deadline is start+2s.
		until := start + 1950*time.Millisecond - time.Since(t0)
		if until <= 0 {
			t.Fatalf("setup took too long: %v", time.Since(t0)-start)
		}
		time.Sleep(until)
		select {
		case r := <-w:
			t.Errorf("W (deadline 2 s) refused at %v after its arrival, with the fastest answer now 10 ms: %v; want it to wait on (its deadline is not within the fastest answer)", r.at-start, r.err)
			l.Release(busy, false)
			l.Release(hold2, false)
			return
		default:
		}
		l.Release(busy, false)
		synctest.Wait()
		r := <-w
		if r.err != nil {
			t.Errorf("W at %v: %v", r.at-start, r.err)
		} else {
			l.Release(r.p, false)
		}
		l.Release(hold2, false)
	})
}

// Acquire: "Every refusal wraps ErrLimited and says why"; SetRate reports
// "the calls refused ("no token", on arrival or while waiting ...) since
// the previous SetRate call". With the limit far from reached (1 in flight
// of 10) and the one waiting place taken by a call waiting for a token, a
// new call is refused for want of a token: the refusal must not say the
// limit was reached, and SetRate must count it.
func TestAttackLimFullOfTokenWaitersSaysNoToken(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		t0 := time.Now()
		l := lim26New(t, limit.Config{Max: 10, Waiting: 1})
		l.SetRate(1, 1)
		a, err := l.Acquire(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		b := lim26Go(l, context.Background(), t0) // waits for the next token
		synctest.Wait()
		_, err = l.Acquire(context.Background())
		inFlight, waiting, refused, _, _, _ := l.SetRate(1, 1)
		t.Logf("in flight %d, waiting %d, limit %d, refused %d, err %v", inFlight, waiting, l.Limit(), refused, err)
		if !errors.Is(err, limit.ErrLimited) {
			t.Fatalf("err %v, want ErrLimited", err)
		}
		var bad []string
		if strings.Contains(err.Error(), "limit reached") {
			bad = append(bad, "the refusal says \"limit reached\" with "+itoa(inFlight)+" in flight of a limit of "+itoa(l.Limit()))
		}
		if !strings.Contains(err.Error(), "no token") {
			bad = append(bad, "the refusal does not say \"no token\"")
		}
		if refused != 1 {
			bad = append(bad, "SetRate's refused is "+itoa(refused)+", want 1")
		}
		if len(bad) > 0 {
			t.Errorf("%s", strings.Join(bad, "; "))
		}
		l.SetRate(0, 0)
		synctest.Wait()
		rb := <-b
		if rb.err != nil {
			t.Fatalf("b: %v", rb.err)
		}
		l.Release(rb.p, false)
		l.Release(a, false)
	})
}

func itoa(n int) string {
	if n == 0 {
		return "0"
	}
	neg := n < 0
	if neg {
		n = -n
	}
	var b []byte
	for n > 0 {
		b = append([]byte{byte('0' + n%10)}, b...)
		n /= 10
	}
	if neg {
		b = append([]byte{'-'}, b...)
	}
	return string(b)
}

// doc.go: "Latency is measured on a sample of the attempts ...: every
// attempt while the limit is under 64 and at least half of it is in
// flight, about 32 to 64 per round trip above, and one in 16 when less
// than half is in flight"; SetRate: samples are "the limiter's own sample
// of about one in 16 calls, or of 32 to 64 per round trip when loaded".
// One caller at a time (1 in flight of a limit of 10) makes 320 calls:
// about 20 samples, with or without Config.Throttle.
func TestAttackLimThrottleSamplesAsDocumented(t *testing.T) {
	for _, k := range []float64{0, 2} {
		synctest.Test(t, func(t *testing.T) {
			l := lim26New(t, limit.Config{Max: 1000, Throttle: k})
			const n = 320
			for range n {
				p, err := l.Acquire(context.Background())
				if err != nil {
					t.Fatal(err)
				}
				time.Sleep(10 * time.Millisecond)
				l.Release(p, false)
			}
			_, _, _, _, _, samples := l.SetRate(0, 0)
			t.Logf("Throttle %v: %d samples of %d calls at 1 in flight (limit %d)", k, samples, n, l.Limit())
			if samples > n/4 {
				t.Errorf("Throttle %v: %d latency samples of %d calls with 1 in flight of a limit of %d; the docs say one in 16 below half the limit (about %d)", k, samples, n, l.Limit(), n/16)
			}
		})
	}
}

// Config.Timeout: "Half of it is the latency ceiling: an attempt released
// after Timeout/2 or later counts as a drop, not as a latency sample";
// doc.go: "a dropped attempt is never a latency sample". Attempts of
// Timeout/2 exactly never set the baseline nor the fastest latency, and
// lower the limit.
func TestAttackLim7CeilingExactHalf(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := lim26New(t, limit.Config{Max: 4, Timeout: 200 * time.Millisecond})
		start := l.Limit()
		for range 20 {
			var ps []limit.Permit
			for range l.Limit() {
				p, err := l.Acquire(context.Background())
				if err != nil {
					t.Fatal(err)
				}
				ps = append(ps, p)
			}
			time.Sleep(100 * time.Millisecond)
			for _, p := range ps {
				l.Release(p, false)
			}
		}
		if l.Limit() >= start {
			t.Errorf("limit %d after 20 round trips at the ceiling, started at %d; want lower", l.Limit(), start)
		}
		// No waiting call is refused as too close for a 100 ms "baseline":
		// a call with 50 ms left and a free slot goes.
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		defer cancel()
		p, err := l.Acquire(ctx)
		if err != nil {
			t.Fatalf("free slot: %v", err)
		}
		l.Release(p, true)
	})
}

// Release: "dropped reports that the attempt timed out, was cancelled ...
// : such an attempt is never a latency sample". A limiter whose attempts
// are all released as dropped reports no latency sample and no fastest
// answer to SetRate, however fast they were released.
func TestAttackLim7DropsAreNoSamples(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := lim26New(t, limit.Config{Max: 100, Throttle: 2})
		l.SetRate(0, 0)
		for range 200 {
			p, err := l.Acquire(context.Background())
			if err != nil {
				if errors.Is(err, limit.ErrLimited) {
					time.Sleep(time.Millisecond)
					continue
				}
				t.Fatal(err)
			}
			time.Sleep(time.Millisecond)
			l.Release(p, true)
		}
		_, _, _, sum, fastest, samples := l.SetRate(0, 0)
		if sum != 0 || fastest != 0 || samples != 0 {
			t.Errorf("after only dropped attempts: latency sum %v, fastest %v, samples %d; want all 0", sum, fastest, samples)
		}
	})
}

// SetRate edges: 0, negative, NaN, +Inf, -Inf, tiny, huge: none panics;
// 0, negative and +Inf turn the gate off (calls go at once), NaN leaves it
// as it is.
func TestAttackLim7SetRateEdges(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := lim26New(t, limit.Config{Max: 1000, Waiting: -1})
		take := func() error {
			p, err := l.Acquire(context.Background())
			if err == nil {
				l.Release(p, false)
			}
			return err
		}
		for _, off := range []float64{0, -1, math.Inf(1), math.Inf(-1), -math.MaxFloat64} {
			l.SetRate(1e-9, 1) // one token in ~31 years
			if err := take(); err != nil {
				t.Fatalf("first token: %v", err)
			}
			if err := take(); err == nil {
				t.Fatal("second token within a century")
			}
			l.SetRate(math.NaN(), 5) // leaves the gate as it is
			if err := take(); err == nil {
				t.Fatal("NaN turned the gate off or refilled it")
			}
			l.SetRate(off, 1)
			for range 100 {
				if err := take(); err != nil {
					t.Fatalf("SetRate(%v) did not turn the gate off: %v", off, err)
				}
			}
		}
		// Huge: 1e300 per second with a large burst: every call goes (at one
		// instant a bucket of burst 1 holds one token, whatever the rate).
		for _, burst := range []float64{math.NaN(), -1, 0, 0.5, 1, 1e300, math.Inf(1)} {
			l.SetRate(1e300, burst)
			for range 50 {
				if err := take(); err != nil && burst >= 2 {
					t.Fatalf("SetRate(1e300, %v): %v", burst, err)
				}
			}
			time.Sleep(time.Microsecond)
		}
		// Tiny rates: denormals count as a token a century.
		for _, r := range []float64{math.SmallestNonzeroFloat64, 1e-300, 3e-10} {
			l.SetRate(0, 0)
			l.SetRate(r, 1)
			if err := take(); err != nil {
				t.Fatalf("SetRate(%v): first token: %v", r, err)
			}
			time.Sleep(24 * time.Hour)
			if err := take(); err == nil {
				t.Fatalf("SetRate(%v): a second token within a day", r)
			}
		}
		l.SetRate(0, 0)
	})
}

// Permit misuse: a Permit released twice while others are in flight lets
// at most one more attempt than the limit run ("one more attempt than the
// limit may then run"), and the count never goes below zero.
func TestAttackLim7DoubleReleaseBound(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := lim26New(t, limit.Config{Max: 4, Waiting: -1})
		var ps []limit.Permit
		for range 4 {
			p, err := l.Acquire(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			ps = append(ps, p)
		}
		l.Release(ps[0], false)
		l.Release(ps[0], false) // misuse
		got := 0
		for range 10 {
			p, err := l.Acquire(context.Background())
			if err != nil {
				break
			}
			ps = append(ps, p)
			got++
		}
		if got > 2 {
			t.Errorf("after a double Release, %d more attempts started; want at most 2 (the freed slot and one more)", got)
		}
		inFlight, _ := l.SetCap(-1)
		if inFlight < 0 || inFlight > 5 {
			t.Errorf("in flight %d", inFlight)
		}
		for _, p := range ps[1:] {
			l.Release(p, false)
		}
		if in, _ := l.SetCap(-1); in != 0 {
			t.Errorf("in flight %d after releasing all, want 0", in)
		}
	})
}

// Cancellation while waiting, concurrently with releases and SetRate/SetCap
// changes (-race): every call ends, every error wraps ErrLimited, and at
// the end nothing is in flight or waiting.
func TestAttackLim7ConcurrentCancelStorm(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := lim26New(t, limit.Config{Max: 8, Waiting: 64, Throttle: 2, Timeout: 100 * time.Millisecond})
		var wg, cwg sync.WaitGroup
		for i := range 64 {
			wg.Go(func() {
				for j := range 40 {
					var ctx context.Context
					var cancel context.CancelFunc
					switch (i + j) % 3 {
					case 0:
						ctx, cancel = context.WithTimeout(context.Background(), time.Duration(1+j%7)*7*time.Millisecond)
					case 1:
						ctx, cancel = context.WithCancel(context.Background())
						cwg.Go(func() { time.Sleep(time.Duration(j%5) * 3 * time.Millisecond); cancel() })
					default:
						ctx, cancel = context.WithTimeout(context.Background(), time.Hour)
					}
					p, err := l.Acquire(ctx)
					if err != nil {
						if !errors.Is(err, limit.ErrLimited) {
							t.Errorf("err %v does not wrap ErrLimited", err)
						}
						cancel()
						time.Sleep(time.Millisecond)
						continue
					}
					time.Sleep(time.Duration(1+(i*j)%9) * time.Millisecond)
					l.Release(p, ctx.Err() != nil)
					cancel()
				}
			})
		}
		wg.Go(func() {
			for k := range 50 {
				switch k % 4 {
				case 0:
					l.SetRate(2000, 4)
				case 1:
					l.SetCap(k % 5)
				case 2:
					l.SetRate(math.NaN(), 0.5)
				default:
					l.SetCap(-1)
					l.SetRate(0, 0)
				}
				time.Sleep(5 * time.Millisecond)
			}
			l.SetCap(-1)
			l.SetRate(0, 0)
		})
		wg.Wait()
		cwg.Wait()
		if in, waiting := l.SetCap(-1); in != 0 || waiting != 0 {
			t.Errorf("at the end: %d in flight, %d waiting; want 0, 0", in, waiting)
		}
	})
}

// doc.go: the baseline "holds through an incident instead of drifting up
// to its latency; it rises only as healthy buckets age out, or after 5
// minutes of continuous incident (then the incident's latency is the new
// normal; time without traffic does not count towards them)". Seen from
// outside through the too-close refusal: with no slot free, a call with
// 50 ms left is refused at once ("fastest answer") only when the baseline
// is 50 ms or more. 60 s at 10 ms, then a 10x slower destination: at 4 min
// into it the baseline is still 10 ms; by 5m40s (5 min, a bucket and
// slack) it must be the incident's 100 ms. One caller keeps one attempt always in flight: no
// time without traffic.
func TestAttackLimBaselineResetUnderContinuousTraffic(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := lim26New(t, limit.Config{Max: 4})
		var mu sync.Mutex
		lat := 10 * time.Millisecond
		stop := make(chan struct{})
		var wg sync.WaitGroup
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				p, err := l.Acquire(context.Background())
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				d := lat
				mu.Unlock()
				time.Sleep(d)
				l.Release(p, false)
			}
		})
		tooClose := func() bool {
			l.SetCap(0)
			ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
			defer cancel()
			t0 := time.Now()
			_, err := l.Acquire(ctx)
			l.SetCap(-1)
			return err != nil && strings.Contains(err.Error(), "fastest answer") && time.Since(t0) == 0
		}
		time.Sleep(60 * time.Second)
		if tooClose() {
			t.Error("healthy: a call with 50 ms left refused as too close at a 10 ms destination")
		}
		mu.Lock()
		lat = 100 * time.Millisecond
		mu.Unlock()
		time.Sleep(4 * time.Minute)
		if tooClose() {
			t.Error("4 min into the incident: the baseline drifted up to the incident's latency")
		}
		// 5 min, plus a 10 s bucket (the reset is decided when a bucket
		// ends), plus 30 s of slack: the traffic never stopped.
		time.Sleep(100 * time.Second) // 5m40s into the incident
		if !tooClose() {
			flipped := time.Duration(0)
			for m := 5*time.Minute + 45*time.Second; m <= 12*time.Minute; m += 5 * time.Second {
				time.Sleep(5 * time.Second)
				if tooClose() {
					flipped = m
					break
				}
			}
			t.Errorf("5m40s into an incident with one attempt always in flight, the baseline is still the healthy 10 ms (a call with 50 ms left is not refused at once as too close); the incident's 100 ms became the baseline only %v into it; want it after 5 minutes of continuous incident", flipped)
		}
		close(stop)
		wg.Wait()
	})
}
