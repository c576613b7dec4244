// Black-box attack (AREA=brk2026) on the breaker's waiting calls, probe
// rounds, trip rule, open-period doubling and paced release, against the
// documented sentences each test names.

package breaker_test

import (
	"context"
	"errors"
	"math"
	"runtime"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stormguard/stormguard/breaker"
)

type b26Clock struct {
	base time.Time
	ns   atomic.Int64
}

func newB26Clock() *b26Clock                { return &b26Clock{base: time.Unix(2_000_000, 0)} }
func (c *b26Clock) Now() time.Time          { return c.base.Add(time.Duration(c.ns.Load())) }
func (c *b26Clock) Advance(d time.Duration) { c.ns.Add(int64(d)) }
func b26Half() float64                      { return 0.5 }

func b26New(t *testing.T, c breaker.Config) *breaker.Breaker {
	t.Helper()
	b, err := breaker.New(c)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return b
}

type b26Res struct {
	id  int
	p   breaker.Permit
	err error
	at  time.Time
}

// doc.go: "Waiting calls get the next round's probes first, those with the
// most time left first"; Wait: "If the breaker reopens first, the call
// keeps waiting" ("the call may be handed one of the round's probes (the
// calls with the most time left first)"). A (10 h left) and B (1 h left)
// wait; round 1 hands its one probe to A; the round ends (Trip) and round 2
// starts before A's goroutine has run (fake clock, GOMAXPROCS 1). Round 2's
// probe must go to A, the call with the most time left.
func TestAttackBrkStaleGrantKeepsRankNextRound(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	synctest.Test(t, func(t *testing.T) {
		clk := newB26Clock()
		b := b26New(t, breaker.Config{Probes: 1, OpenFor: time.Second, ReleaseRate: -1, Now: clk.Now, Rand: b26Half})
		b.Trip(0)
		out := make(chan b26Res, 2)
		wait := func(id int, d time.Duration) {
			go func() {
				p, err := b.Wait(context.Background(), d)
				out <- b26Res{id: id, p: p, err: err}
			}()
			synctest.Wait()
		}
		wait('A', 10*time.Hour)
		wait('B', time.Hour)
		if n := b.Snapshot().Waiters; n != 2 {
			t.Fatalf("%d waiters, want 2", n)
		}
		// Round 1: its probe goes to A (most time left). Nothing below
		// blocks, so A's goroutine does not run.
		clk.Advance(time.Second)
		if s := b.State(); s != breaker.HalfOpen {
			t.Fatalf("round 1: %v", s)
		}
		b.Trip(0) // the round ends: half-open reopens
		clk.Advance(time.Second)
		if s := b.State(); s != breaker.HalfOpen {
			t.Fatalf("round 2: %v", s)
		}
		synctest.Wait()
		var first b26Res
		select {
		case first = <-out:
		default:
			t.Fatal("no waiting call was admitted in round 2")
		}
		if first.err != nil || !first.p.Probe() {
			t.Fatalf("call %c: %v (probe %v)", first.id, first.err, first.p.Probe())
		}
		if first.id != 'A' {
			t.Errorf("round 2's only probe went to B (1h left) while A (10h left, waiting since before round 1, granted round 1's probe that ended before it woke) was passed over: the calls with the most time left should get the probes first")
		}
		b.Done(first.p, true) // closes; ReleaseRate -1 lets the other go
		synctest.Wait()
		second := <-out
		if second.err != nil {
			t.Fatalf("call %c after the close: %v", second.id, second.err)
		}
		b.Done(second.p, true)
	})
}

// Config.Rand: "A Rand pinned at 0.5 makes every open period exactly
// OpenFor (to the nanosecond below 2^53 ns, about 104 days; within one
// above)." OpenFor values between 2^54 ns and half the largest Duration
// (where the doc's no-jitter rule begins), Rand pinned at 0.5.
func TestAttackBrkRandHalfLongOpenFor(t *testing.T) {
	var bad []string
	for _, openFor := range []time.Duration{
		1<<54 + 2,
		1<<55 + 6,
		1<<60 + 100,
		1<<61 + 255,
		1<<62 - 300,
	} {
		clk := newB26Clock()
		b := b26New(t, breaker.Config{OpenFor: openFor, Now: clk.Now, Rand: b26Half})
		b.Trip(0)
		_, err := b.Allow()
		var oe *breaker.OpenError
		if !errors.As(err, &oe) {
			t.Fatalf("OpenFor %d: %v", openFor, err)
		}
		if d := oe.Wait - openFor; d < -1 || d > 1 {
			bad = append(bad, time.Duration(openFor).String()+" ("+itoa(int64(openFor))+" ns): open for "+itoa(int64(oe.Wait))+" ns, off by "+itoa(int64(d)))
		}
	}
	for _, s := range bad {
		t.Errorf("Rand pinned at 0.5, OpenFor %s; the doc promises OpenFor within one nanosecond above 2^53 ns", s)
	}
}

func itoa(v int64) string {
	if v == 0 {
		return "0"
	}
	neg := v < 0
	var buf [24]byte
	i := len(buf)
	u := uint64(v)
	if neg {
		u = uint64(-v)
	}
	for u > 0 {
		i--
		buf[i] = byte('0' + u%10)
		u /= 10
	}
	if neg {
		i--
		buf[i] = '-'
	}
	return string(buf[i:])
}

// Config.FailureRatio: "the fraction of failed calls, in (0, 1], at or
// above which the breaker trips"; doc.go: "failures >= FailureRatio·calls".
// config.go: the ratio is compared within a relative 1e-12 (for the
// product's rounding): a FailureRatio of 0.5000000000001 trips at 5 of 10
// calls, and one 1e-9 above a fraction does not trip at it.
func TestAttackBrkRatioTolerance(t *testing.T) {
	for _, tc := range []struct {
		ratio    float64
		calls    int
		failures int
		open     bool
	}{
		{0.5000000000001, 10, 5, true},
		{0.2500000000001, 100, 25, true},
		{0.500000001, 10, 5, false},
		{0.250000001, 100, 25, false},
	} {
		clk := newB26Clock()
		b := b26New(t, breaker.Config{FailureRatio: tc.ratio, MinCalls: tc.calls, Now: clk.Now, Rand: b26Half})
		for range tc.calls - tc.failures {
			p, _ := b.Allow()
			b.Done(p, true)
		}
		for range tc.failures {
			p, err := b.Allow()
			if err != nil {
				t.Fatal(err)
			}
			b.Done(p, false)
		}
		if got := b.State() == breaker.Open; got != tc.open {
			t.Errorf("FailureRatio %.16g, MinCalls %d: %d failures of %d calls: open %v, want %v (state %v)",
				tc.ratio, tc.calls, tc.failures, tc.calls, got, tc.open, b.State())
		}
	}
}

// doc.go: "if the window holds at least MinCalls calls and failures >=
// FailureRatio·calls ... the breaker trips". Decimal ratios i/100 and
// fractions a/q, every call count n up to 120 with MinCalls n: n calls
// with k = ceil(ratio·n) failures trip at the k-th failure; n calls with
// k-1 failures do not.
func TestAttackBrk12RatioSweep(t *testing.T) {
	type rat struct {
		r    float64
		a, q int64 // r is a/q exactly
	}
	var rs []rat
	for i := int64(1); i <= 100; i++ {
		rs = append(rs, rat{float64(i) / 100, i, 100})
	}
	for q := int64(3); q <= 12; q++ {
		for a := int64(1); a < q; a++ {
			rs = append(rs, rat{float64(a) / float64(q), a, q})
		}
	}
	run := func(ratio float64, n, fails int) breaker.State {
		clk := newB26Clock()
		b, err := breaker.New(breaker.Config{FailureRatio: ratio, MinCalls: n, Now: clk.Now, Rand: b26Half})
		if err != nil {
			t.Fatal(err)
		}
		// Failures last, so that the window holds n calls at the last one.
		for range n - fails {
			p, _ := b.Allow()
			b.Done(p, true)
		}
		for range fails {
			p, err := b.Allow()
			if err != nil {
				return breaker.Open
			}
			b.Done(p, false)
		}
		return b.State()
	}
	errs := 0
	for _, r := range rs {
		for n := 1; n <= 120; n += 1 + n/40 {
			k := int((r.a*int64(n) + r.q - 1) / r.q) // ceil(a·n/q)
			if s := run(r.r, n, k); s != breaker.Open {
				errs++
				t.Errorf("ratio %d/%d, %d calls: %d failures (at the ratio) left it %v", r.a, r.q, n, k, s)
			}
			if k > 0 {
				if s := run(r.r, n, k-1); s != breaker.Closed {
					errs++
					t.Errorf("ratio %d/%d, %d calls: %d failures (below the ratio) made it %v", r.a, r.q, n, k-1, s)
				}
			}
			if errs > 10 {
				t.FailNow()
			}
		}
	}
}

// Config.MaxOpenFor: "each consecutive failed probe doubles the open
// period, up to MaxOpenFor"; Rand pinned at 0.5: exactly (below 2^53 ns).
// Odd and awkward OpenFor/MaxOpenFor pairs, MaxOpenFor == OpenFor too.
func TestAttackBrk12DoublingOddValues(t *testing.T) {
	pairs := [][2]time.Duration{
		{1, 1}, {1, 2}, {1, 3}, {3, 7}, {3, 12}, {3, 13}, {5, 5},
		{time.Second, time.Second}, {time.Second + 1, 4*time.Second + 3},
		{7 * time.Millisecond, 999 * time.Millisecond},
		{1_000_000_007, 30_000_000_011}, {(1 << 40) + 1, (1 << 52) - 1},
		{(1 << 51) + 1, (1 << 53) - 1},
	}
	for _, pr := range pairs {
		open, limit := pr[0], pr[1]
		clk := newB26Clock()
		b := b26New(t, breaker.Config{OpenFor: open, MaxOpenFor: limit, Probes: 1, Now: clk.Now, Rand: b26Half})
		b.Trip(0)
		want := open
		for i := range 70 {
			_, err := b.Allow()
			var oe *breaker.OpenError
			if !errors.As(err, &oe) {
				t.Fatalf("%v/%v step %d: %v", open, limit, i, err)
			}
			if oe.Wait != want {
				t.Fatalf("OpenFor %d MaxOpenFor %d: after %d failed probes open for %d ns, want %d", open, limit, i, oe.Wait, want)
			}
			clk.Advance(oe.Wait)
			p, err := b.Allow()
			if err != nil || !p.Probe() {
				t.Fatalf("%v/%v step %d: probe %v", open, limit, i, err)
			}
			b.Done(p, false)
			if want <= limit/2 {
				want *= 2
			} else {
				want = limit
			}
			want = min(want, limit)
		}
	}
}

// Wait: "Wait returns ... the [*OpenError] of the rejection when the call
// cannot wait (maxWait <= 0, the next round comes too late ...)"; "A
// maxWait near the largest Duration means no bound". maxWait 0, -1,
// MinInt64 are rejected at once with the open period's Wait; maxWait
// MaxInt64 waits even behind a Retry-After of centuries, and is let go
// by a Reset.
func TestAttackBrk12MaxWaitEdges(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := b26New(t, breaker.Config{OpenFor: time.Second, Rand: b26Half, ReleaseRate: -1})
		b.Trip(0)
		for _, mw := range []time.Duration{0, -1, math.MinInt64, time.Second, 999 * time.Millisecond} {
			_, err := b.Wait(context.Background(), mw)
			var oe *breaker.OpenError
			if !errors.As(err, &oe) || !errors.Is(err, breaker.ErrOpen) || oe.State != breaker.Open || oe.Wait != time.Second {
				t.Errorf("maxWait %d: %v, want an immediate OpenError open for 1s", mw, err)
			}
		}
		if n := b.Snapshot().Waiters; n != 0 {
			t.Fatalf("%d waiters after rejections", n)
		}
		// A Retry-After of centuries: the breaker stays open that long.
		b.Reset()
		p, _ := b.Allow()
		b.Reset()
		b.Trip(math.MaxInt64 / 2)
		_ = p
		res := make(chan error, 2)
		for _, mw := range []time.Duration{math.MaxInt64, math.MaxInt64 - 1} {
			go func() {
				p, err := b.Wait(context.Background(), mw)
				if err == nil {
					b.Done(p, true)
				}
				res <- err
			}()
		}
		synctest.Wait()
		if n := b.Snapshot().Waiters; n != 2 {
			t.Fatalf("maxWait near MaxInt64 behind a long open period: %d waiters, want 2", n)
		}
		// A call with a bounded maxWait behind that open period is refused.
		if _, err := b.Wait(context.Background(), 100*365*24*time.Hour); err == nil {
			t.Fatal("a 100-year maxWait behind a >146-year open period was admitted")
		}
		time.Sleep(time.Hour)
		b.Reset()
		synctest.Wait()
		for range 2 {
			if err := <-res; err != nil {
				t.Errorf("unbounded waiter after Reset: %v", err)
			}
		}
	})
}

// Config.MaxWaiters: "0 means 10,000"; doc.go: "Waiting calls get the next
// round's probes first, those with the most time left first"; "When the
// breaker closes, the waiting calls are released" (ReleaseRate < 0: all at
// once). 10,000 waiting calls with distinct deadlines, one more refused;
// Probes 3: the three with the most time left probe; all the rest go on
// the close; none is left waiting.
func TestAttackBrk12TenThousandWaitersRound(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := b26New(t, breaker.Config{OpenFor: time.Second, Probes: 3, ReleaseRate: -1, Rand: b26Half})
		b.Trip(0)
		const n = 10_000
		out := make(chan b26Res, n)
		for i := range n {
			go func() {
				p, err := b.Wait(context.Background(), time.Hour+time.Duration(i)*time.Millisecond)
				out <- b26Res{id: i, p: p, err: err}
			}()
		}
		synctest.Wait()
		if got := b.Snapshot().Waiters; got != n {
			t.Fatalf("%d waiters, want %d", got, n)
		}
		if _, err := b.Wait(context.Background(), 2*time.Hour); err == nil {
			t.Fatal("the 10,001st waiting call was admitted")
		}
		time.Sleep(time.Second)
		synctest.Wait()
		var probes []b26Res
		for range 3 {
			select {
			case r := <-out:
				probes = append(probes, r)
			default:
				t.Fatalf("only %d probes handed out", len(probes))
			}
		}
		select {
		case r := <-out:
			t.Fatalf("a 4th call admitted in a round of 3: %d %v", r.id, r.err)
		default:
		}
		sort.Slice(probes, func(i, j int) bool { return probes[i].id < probes[j].id })
		for i, r := range probes {
			if r.err != nil || !r.p.Probe() || r.id != n-3+i {
				t.Errorf("probe %d: call %d err %v probe %v; want calls %d..%d (most time left)", i, r.id, r.err, r.p.Probe(), n-3, n-1)
			}
		}
		for _, r := range probes {
			b.Done(r.p, true)
		}
		synctest.Wait()
		for range n - 3 {
			r := <-out
			if r.err != nil {
				t.Fatalf("call %d after the close: %v", r.id, r.err)
			}
			b.Done(r.p, true)
		}
		if s := b.Snapshot(); s.State != breaker.Closed || s.Waiters != 0 {
			t.Fatalf("after the release: %+v", s)
		}
	})
}

// Config.ReleaseRate: "The release starts at a quarter of it, or at Probes
// per OpenFor if that is more ... and doubles every half second up to it";
// doc.go: "the waiting calls are released earliest deadline first";
// OpenError: "Closed for a call of Breaker.Wait whose context or maxWait
// ended while it waited for its turn in the release after the close (Wait
// 0...)". ReleaseRate 20/s, Probes 1, OpenFor 1 s: the pace starts at 5/s
// and reaches 20/s a second after the close. 60 waiting calls (the probe
// aside); one has a maxWait that ends before its turn could come.
func TestAttackBrk12ReleasePace(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := b26New(t, breaker.Config{OpenFor: time.Second, Probes: 1, ReleaseRate: 20, Rand: b26Half})
		b.Trip(0)
		const n = 60
		var mu sync.Mutex
		var got []b26Res
		var wg sync.WaitGroup
		// Call i has maxWait 10 min + i s: call n-1 gets the probe, the
		// rest must go in the order of i.
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				p, err := b.Wait(context.Background(), 10*time.Minute+time.Duration(i)*time.Second)
				if err == nil && p.Probe() {
					b.Done(p, true) // the probe closes the breaker
					return
				}
				mu.Lock()
				got = append(got, b26Res{id: i, p: p, err: err, at: time.Now()})
				mu.Unlock()
				if err == nil {
					b.Done(p, true)
				}
			}()
		}
		synctest.Wait()
		start := time.Now()
		time.Sleep(time.Second) // the round; the probe closes at once
		closeAt := start.Add(time.Second)
		wg.Wait()
		if len(got) != n-1 {
			t.Fatalf("%d released, want %d", len(got), n-1)
		}
		for i, r := range got {
			if r.err != nil {
				t.Fatalf("call %d: %v", r.id, r.err)
			}
			if r.id != i {
				t.Fatalf("release order: position %d is call %d (earliest deadline first wants %d)", i, r.id, i)
			}
		}
		// The documented pace: rate(x) = 5·2^(2x) up to 20 (x seconds after
		// the close), one call's credit at the start.
		expect := func(x float64) float64 {
			if x <= 1 {
				return 1 + 5*(math.Exp2(2*x)-1)/(2*math.Ln2)
			}
			return 1 + 5*3/(2*math.Ln2) + 20*(x-1)
		}
		for _, x := range []float64{0.25, 0.5, 1, 1.5, 2, 2.5} {
			at := closeAt.Add(time.Duration(x * float64(time.Second)))
			c := 0
			for _, r := range got {
				if !r.at.After(at) {
					c++
				}
			}
			if e := expect(x); math.Abs(float64(c)-e) > 3 {
				t.Errorf("%.2fs after the close: %d released, the documented pace gives about %.1f", x, c, e)
			}
		}
	})
}

// doc.go: "the waiting calls are released earliest deadline first";
// ReleaseRate: "the first waiting call goes within the first slot".
// ReleaseRate 2/s: 11 calls wait an hour or more; one more joins last with
// a maxWait of 3 s (2 s after the close): the earliest deadline, it goes
// first, within the first slot, and every call is released.
func TestAttackBrk12ReleaseLateShortCallFirst(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := b26New(t, breaker.Config{OpenFor: time.Second, Probes: 1, ReleaseRate: 2, Rand: b26Half})
		b.Trip(0)
		type r struct {
			id  int
			err error
			at  time.Duration
		}
		var mu sync.Mutex
		var got []r
		var wg sync.WaitGroup
		t0 := time.Now()
		for i := range 12 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				mw := time.Hour + time.Duration(i)*time.Second
				if i == 0 {
					mw = 2 * time.Hour // the probe (most time left)
				}
				p, err := b.Wait(context.Background(), mw)
				if err == nil {
					b.Done(p, true)
				}
				mu.Lock()
				got = append(got, r{i, err, time.Since(t0)})
				mu.Unlock()
			}()
		}
		synctest.Wait()
		// One more, whose maxWait ends 2 s after the close at 1 s.
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := b.Wait(context.Background(), 3*time.Second)
			mu.Lock()
			got = append(got, r{99, err, time.Since(t0)})
			mu.Unlock()
		}()
		synctest.Wait()
		wg.Wait()
		var gaveUp *r
		for i := range got {
			if got[i].id == 99 {
				gaveUp = &got[i]
			}
		}
		if gaveUp == nil {
			t.Fatal("no result for the short call")
		}
		// Its deadline is the earliest: it goes first in the release.
		if gaveUp.err != nil {
			t.Fatalf("the call with the earliest deadline was not released first: %v at %v", gaveUp.err, gaveUp.at)
		}
		if gaveUp.at > 2*time.Second {
			t.Errorf("the earliest-deadline call went at %v, after the first slot", gaveUp.at)
		}
		for _, g := range got {
			if g.err != nil {
				t.Errorf("call %d: %v", g.id, g.err)
			}
		}
	})
}

// OpenError (State Closed: "a call of Breaker.Wait whose context or
// maxWait ended while it waited for its turn in the release"). ReleaseRate
// 1/s: 8 waiting calls with maxWait 1 h except the last to come, whose
// ctx ends 3 s after the close; in deadline order it is behind the others
// (its maxWait is 2 h) so its turn comes ~7 s after the close: it gives up
// with an OpenError{State: Closed, Wait: 0} matching ErrOpen.
func TestAttackBrk12ReleaseCtxEndsBeforeTurn(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := b26New(t, breaker.Config{OpenFor: time.Second, Probes: 1, ReleaseRate: 1, Rand: b26Half})
		b.Trip(0)
		var wg sync.WaitGroup
		for i := range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				mw := time.Hour + time.Duration(i)*time.Minute
				if i == 7 {
					mw = 3 * time.Hour // the probe
				}
				p, err := b.Wait(context.Background(), mw)
				if err != nil {
					t.Errorf("call %d: %v", i, err)
					return
				}
				b.Done(p, true)
			}()
		}
		synctest.Wait()
		ctx, cancel := context.WithTimeout(context.Background(), 4*time.Second)
		defer cancel()
		errc := make(chan error, 1)
		go func() {
			p, err := b.Wait(ctx, 2*time.Hour)
			if err == nil {
				b.Done(p, true)
			}
			errc <- err
		}()
		synctest.Wait()
		wg.Wait()
		err := <-errc
		var oe *breaker.OpenError
		if !errors.As(err, &oe) || !errors.Is(err, breaker.ErrOpen) || oe.State != breaker.Closed || oe.Wait != 0 {
			t.Fatalf("a call whose ctx ended before its release turn: %v, want OpenError{State: Closed, Wait: 0}", err)
		}
		if s := b.Snapshot(); s.Waiters != 0 || s.State != breaker.Closed {
			t.Fatalf("after the release: %+v", s)
		}
	})
}

// Cancel: "A probe's slot is freed for another probe (a waiting call
// first)"; Wait: "or when ctx ends ... before the call is admitted". A
// waiting call granted a probe whose ctx ends before it takes it hands the
// slot on to the waiting call with the most time left; a probe reported
// twice (a caller's bug, documented) does not hand out a third slot.
func TestAttackBrk12CancelWhileGranted(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	synctest.Test(t, func(t *testing.T) {
		clk := newB26Clock()
		b := b26New(t, breaker.Config{Probes: 1, OpenFor: time.Second, ReleaseRate: -1, Now: clk.Now, Rand: b26Half})
		b.Trip(0)
		out := make(chan b26Res, 3)
		ctxA, cancelA := context.WithCancel(context.Background())
		start := func(id int, ctx context.Context, d time.Duration) {
			go func() {
				p, err := b.Wait(ctx, d)
				out <- b26Res{id: id, p: p, err: err}
			}()
			synctest.Wait()
		}
		start('A', ctxA, 10*time.Hour)
		start('B', context.Background(), time.Hour)
		start('C', context.Background(), 5*time.Hour)
		clk.Advance(time.Second)
		b.State() // round: A granted
		cancelA() // A gives up before it runs
		synctest.Wait()
		// A may see its grant or its ctx first (a select): either it gives
		// up (its slot handed on) or it is admitted and this goroutine
		// cancels the probe for it.
		ra := <-out
		if ra.id != 'A' {
			t.Fatalf("%c admitted before A gave its slot back", ra.id)
		}
		if ra.err == nil {
			b.Cancel(ra.p)
			synctest.Wait()
		}
		var rc b26Res
		select {
		case rc = <-out:
		default:
			t.Fatal("A's slot was not handed on to a waiting call")
		}
		if rc.id != 'C' || rc.err != nil || !rc.p.Probe() {
			t.Fatalf("the slot went to %c (%v), want C (5h left)", rc.id, rc.err)
		}
		rs := []b26Res{ra, rc}
		if _, err := b.Allow(); err == nil {
			t.Fatal("a second probe admitted in a round of 1")
		}
		b.Done(rs[1].p, true)
		synctest.Wait()
		r := <-out
		if r.id != 'B' || r.err != nil {
			t.Fatalf("B after the close: %v", r.err)
		}
		b.Done(r.p, true)
	})
}
