// Black-box attacks on the retry budget (AREA budget2): the bound over
// every window-long span, slice edges, idle gaps, DepositN, concurrency,
// Stats, the zero Budget and the retry loop. Each test names the sentence
// it checks.

package budget_test

import (
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stormguard/stormguard/budget"
	"github.com/stormguard/stormguard/retry"
)

// bd2Clock is a fake Config.Now safe for concurrent use.
type bd2Clock struct{ ns atomic.Int64 }

func (c *bd2Clock) now() time.Time      { return time.Unix(1_000_000, c.ns.Load()) }
func (c *bd2Clock) set(d time.Duration) { c.ns.Store(int64(d)) }
func (c *bd2Clock) at() time.Duration   { return time.Duration(c.ns.Load()) }
func (c *bd2Clock) add(d time.Duration) { c.ns.Add(int64(d)) }

// bd2Count returns how many of the sorted times lie in [lo, hi).
func bd2Count(ts []time.Duration, lo, hi time.Duration) int {
	i := sort.Search(len(ts), func(i int) bool { return ts[i] >= lo })
	j := sort.Search(len(ts), func(i int) bool { return ts[i] >= hi })
	return j - i
}

// The tolerance that does hold for arbitrary spans, checked so that it is
// known: with a clock that only goes forward, any span [a, a+Window) holds
// at most Ratio·(requests in [a−Window, a+Window)) + 2·floor retries, and
// with no floor exactly the documented Ratio·requests bound. Every span
// that begins at a granted retry is checked (those are the worst ones).
// Also the documented bound over every window of Slices whole slices.
func TestAttackBudget2AnySpanRandomTolerance(t *testing.T) {
	r := rand.New(rand.NewPCG(2, 2))
	over, spans := 0, 0
	for trial := range 150 {
		slices := 1 + r.IntN(6)
		slice := time.Duration(1+r.IntN(4)) * time.Millisecond
		w := slice * time.Duration(slices)
		ratio := []float64{-1, 0.1, 0.5, 1}[r.IntN(4)]
		perSec := []float64{-1, 1000, 2500}[r.IntN(3)]
		floor := max(perSec, 0) * w.Seconds()
		c := &bd2Clock{}
		b, err := budget.New(budget.Config{Ratio: ratio, MinPerSecond: perSec, Window: w, Slices: slices, Now: c.now})
		if err != nil {
			t.Fatal(err)
		}
		var reqs, rets []time.Duration
		depP := r.Float64()
		for range 3000 {
			switch x := r.IntN(100); {
			case x < 30:
				c.add(time.Duration(r.Int64N(int64(slice) / 3)))
			case x < 40:
				k := c.at()/slice + 1 // to the edge of the next slice, or 1 ns before
				c.set(k*slice - time.Duration(r.IntN(2)))
			case x < 42:
				c.add(time.Duration(r.Int64N(int64(w) * 3)))
			case x < 44:
				depP = r.Float64()
			}
			if r.Float64() < depP {
				n := 1 + r.IntN(3)
				b.DepositN(n)
				for range n {
					reqs = append(reqs, c.at())
				}
			} else if b.Withdraw() {
				rets = append(rets, c.at())
			}
		}
		eR := max(ratio, 0)
		for _, a := range rets {
			n := bd2Count(rets, a, a+w)
			req := bd2Count(reqs, a-w, a+w)
			if lim := (eR*float64(req) + 2*floor) * (1 + 1e-12); float64(n) > lim {
				t.Fatalf("trial %d: span [%v,%v) holds %d retries, %d requests around it; even 2 floors give %v", trial, a, a+w, n, req, lim)
			}
			spans++
			if float64(n) > (eR*float64(req)+floor)*(1+1e-12) {
				over++ // beyond the documented bound, within the tolerance
			}
			if floor == 0 && float64(n) > eR*float64(req)*(1+1e-12) {
				t.Fatalf("trial %d (no floor): span [%v,%v) holds %d retries > %v·%d", trial, a, a+w, n, eR, req)
			}
		}
		// Windows of whole slices: (k−S, k] in slice numbers.
		last := c.at()/slice + 1
		for k := time.Duration(0); k <= last; k++ {
			hi := (k + 1) * slice
			n := bd2Count(rets, hi-w, hi)
			req := bd2Count(reqs, hi-2*w, hi)
			if lim := (eR*float64(req) + floor) * (1 + 1e-12); float64(n) > lim {
				t.Fatalf("trial %d: window of slices ending in %d holds %d retries, %d requests in it and the one before; limit %v", trial, k, n, req, lim)
			}
		}
	}
	t.Logf("%d of %d spans starting at a granted retry exceed Ratio·requests(2 windows) + floor", over, spans)
}

// Bursts at slice edges and a long idle gap: "A slice expires exactly when
// its Slices-th successor begins." Requests deposited at the last instant
// of a slice fund a burst until the first instant of its Slices-th
// successor, and not at that instant; after a long idle gap nothing old
// counts, and the burst gets exactly ⌊Ratio·requests + floor⌋.
func TestAttackBudget2EdgeBurstsAndIdleGap(t *testing.T) {
	c := &bd2Clock{}
	b, err := budget.New(budget.Config{Ratio: 0.5, MinPerSecond: 0.2, Window: 5 * time.Second, Slices: 5, Now: c.now}) // floor 1
	if err != nil {
		t.Fatal(err)
	}
	burst := func() int {
		n := 0
		for b.Withdraw() {
			n++
		}
		return n
	}
	c.set(2*time.Second - 1) // last ns of slice 1
	b.DepositN(20)
	if n := burst(); n != 11 {
		t.Fatalf("burst at the end of slice 1: %d, want 11 (0.5·20+1)", n)
	}
	c.set(6*time.Second - 1) // last ns of slice 5: the window is slices 1..5, retries of slice 1 still count
	if n := burst(); n != 0 {
		t.Fatalf("last ns before slice 1 expires: %d more admitted, want 0 (%+v)", n, b.Stats())
	}
	c.set(6 * time.Second) // slice 6: slice 1 (20 requests, 11 retries) left
	if s := b.Stats(); s.Requests != 0 || s.Retries != 0 {
		t.Fatalf("slice 6: %+v, want empty", s)
	}
	if n := burst(); n != 1 {
		t.Fatalf("slice 6 burst: %d, want 1 (the floor)", n)
	}
	// An idle gap of a day, a whole number of windows (every ring word's
	// index matches again), then a burst.
	c.add(24 * time.Hour)
	if s := b.Stats(); s.Requests != 0 || s.Retries != 0 {
		t.Fatalf("after a day idle: %+v, want empty", s)
	}
	b.DepositN(7)
	if n := burst(); n != 4 {
		t.Fatalf("burst after a day idle: %d, want 4 (⌊0.5·7+1⌋)", n)
	}
	// An idle gap of 2^32 slices (136 years of 1 s slices), inside the
	// documented 2^39 slices and 292 years.
	c.add((1 << 32) * time.Second)
	if s := b.Stats(); s.Requests != 0 || s.Retries != 0 {
		t.Fatalf("after 2^32 slices idle: %+v, want empty", s)
	}
	b.DepositN(4)
	if n := burst(); n != 3 {
		t.Fatalf("burst after 2^32 slices idle: %d, want 3", n)
	}
}

// DepositN: "like n calls of Budget.Deposit in one counter update ... n of
// 0 or less records nothing; a slice's count saturates at 16,777,215."
func TestAttackBudget2DepositNLarge(t *testing.T) {
	c := &bd2Clock{}
	b, err := budget.New(budget.Config{Ratio: 1, MinPerSecond: -1, Window: 3 * time.Second, Slices: 3, Now: c.now})
	if err != nil {
		t.Fatal(err)
	}
	b.DepositN(0)
	b.DepositN(-5)
	b.DepositN(math.MinInt)
	if s := b.Stats(); s.Requests != 0 {
		t.Fatalf("n <= 0 recorded %+v", s)
	}
	b.DepositN(math.MaxInt)
	if s := b.Stats(); s.Requests != 16_777_215 {
		t.Fatalf("DepositN(MaxInt): %+v, want 16777215", s)
	}
	b.DepositN(1 << 24)
	b.Deposit()
	if s := b.Stats(); s.Requests != 16_777_215 {
		t.Fatalf("saturated slice grew: %+v", s)
	}
	c.add(time.Second)
	b.DepositN(16_777_214)
	b.DepositN(1)
	b.DepositN(1)
	c.add(time.Second)
	b.DepositN(1<<24 + 3)
	if s := b.Stats(); s.Requests != 3*16_777_215 || s.Limit != 3*16_777_215 {
		t.Fatalf("three saturated slices: %+v, want 50331645 requests and limit", s)
	}
	c.add(time.Second) // slice 3: slice 0 leaves
	if s := b.Stats(); s.Requests != 2*16_777_215 {
		t.Fatalf("slice 3: %+v", s)
	}
	// Split deposits equal one DepositN.
	c2 := &bd2Clock{}
	b2, _ := budget.New(budget.Config{Now: c2.now})
	for range 1000 {
		b2.Deposit()
	}
	b3, _ := budget.New(budget.Config{Now: c2.now})
	b3.DepositN(1000)
	if b2.Stats() != b3.Stats() {
		t.Fatalf("1000 Deposits %+v != DepositN(1000) %+v", b2.Stats(), b3.Stats())
	}
}

// Concurrency: "Under any interleaving the rule above holds at every
// admission". Many goroutines deposit and withdraw while the clock moves
// forward by a step per call, across slice boundaries. Each call's reading
// lies between the clock before and after it; a retry whose bracket lies
// in one slice is counted there (others are left out: the count is a lower
// bound), a deposit whose bracket spans slices is counted in all of them
// (an upper bound). A window of whole slices holding more retries than
// Ratio·requests(that window and the one before) + floor would then be a
// certain breach. Stats after the run equals what was granted.
func TestAttackBudget2ConcurrentMovingClockBound(t *testing.T) {
	for round := range 5 {
		c := &bd2Clock{}
		const slice = 10 * time.Millisecond
		const S = 4
		cfg := budget.Config{Ratio: 0.2, MinPerSecond: 100, Window: S * slice, Slices: S} // floor 4
		var calls atomic.Int64
		cfg.Now = func() time.Time {
			calls.Add(1)
			c.add(37 * time.Microsecond)
			return c.now()
		}
		b, err := budget.New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		type ev struct {
			lo, hi int64 // slices of the bracket
		}
		const g = 8
		reqs := make([][]ev, g)
		rets := make([][]ev, g)
		var wg sync.WaitGroup
		for i := range g {
			wg.Add(1)
			go func() {
				defer wg.Done()
				rng := rand.New(rand.NewPCG(uint64(round), uint64(i)))
				for range 3000 {
					lo := int64(c.at() / slice)
					if rng.IntN(3) == 0 {
						b.Deposit()
						reqs[i] = append(reqs[i], ev{lo, int64(c.at() / slice)})
					} else if b.Withdraw() {
						rets[i] = append(rets[i], ev{lo, int64(c.at() / slice)})
					}
				}
			}()
		}
		wg.Wait()
		ret := map[int64]int{}
		req := map[int64]int{}
		var maxS int64
		total := 0
		for i := range g {
			for _, e := range rets[i] {
				total++
				if e.lo == e.hi {
					ret[e.lo]++
				}
				maxS = max(maxS, e.hi)
			}
			for _, e := range reqs[i] {
				for s := e.lo; s <= e.hi; s++ {
					req[s]++
				}
			}
		}
		if total == 0 {
			t.Fatal("nothing admitted")
		}
		for k := int64(0); k <= maxS; k++ {
			n, rq := 0, 0
			for s := k - S + 1; s <= k; s++ {
				n += ret[s]
			}
			for s := k - 2*S + 1; s <= k; s++ {
				rq += req[s]
			}
			if lim := 0.2*float64(rq) + 4; float64(n) > lim {
				t.Fatalf("round %d: window ending in slice %d holds at least %d retries; at most %d requests in it and the one before; limit %v", round, k, n, rq, lim)
			}
		}
	}
}

// Stats: "a snapshot of the window that a withdrawal now would see".
// With a still clock, Stats after concurrent Deposits and Withdraws equals
// exactly what was deposited and granted, and Withdraw admits exactly
// ⌊Limit⌋ − Retries more.
func TestAttackBudget2StatsMatchesGranted(t *testing.T) {
	c := &bd2Clock{}
	b, err := budget.New(budget.Config{Ratio: 0.25, MinPerSecond: 0.35, Now: c.now}) // floor 3.5
	if err != nil {
		t.Fatal(err)
	}
	var granted, deposited atomic.Int64
	var wg sync.WaitGroup
	for i := range 16 {
		wg.Go(func() {
			for j := range 500 {
				switch (i + j) % 3 {
				case 0:
					b.DepositN(2)
					deposited.Add(2)
				default:
					if b.Withdraw() {
						granted.Add(1)
					}
				}
			}
		})
	}
	wg.Wait()
	s := b.Stats()
	if int64(s.Requests) != deposited.Load() || int64(s.Retries) != granted.Load() {
		t.Fatalf("Stats %+v; deposited %d, granted %d", s, deposited.Load(), granted.Load())
	}
	if want := 0.25*float64(s.Requests) + 3.5; s.Limit != want {
		t.Fatalf("Limit %v, want %v", s.Limit, want)
	}
	more := 0
	for b.Withdraw() {
		more++
	}
	if more != int(math.Floor(s.Limit))-s.Retries {
		t.Fatalf("Stats %+v predicts %d more, got %d", s, int(math.Floor(s.Limit))-s.Retries, more)
	}
}

// Budget: "The zero value is a budget with the default settings whose
// window starts at its first use." Default settings: 10% plus a floor of 10
// over 10 s. Used from many goroutines at once in a bubble.
func TestAttackBudget2ZeroBudgetDefaults(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var b budget.Budget
		time.Sleep(time.Hour) // the window starts at first use, not at creation
		var wg sync.WaitGroup
		var granted atomic.Int64
		for range 10 {
			wg.Go(func() {
				b.DepositN(10)
				for range 10 {
					if b.Withdraw() {
						granted.Add(1)
					}
				}
			})
		}
		wg.Wait()
		if granted.Load() != 20 { // 0.1·100 + 10
			t.Fatalf("zero budget: %d granted with 100 requests, want 20 (%+v)", granted.Load(), b.Stats())
		}
		if cfg := b.Config(); cfg.Ratio != 0.1 || cfg.MinPerSecond != 1 || cfg.Window != 10*time.Second || cfg.Slices != 10 || cfg.Now != nil {
			t.Fatalf("zero budget Config %+v", cfg)
		}
		time.Sleep(10*time.Second - 1)
		if s := b.Stats(); s.Requests != 100 || s.Retries != 20 {
			t.Fatalf("1 ns before expiry: %+v", s)
		}
		time.Sleep(time.Nanosecond)
		if s := b.Stats(); s.Requests != 0 || s.Retries != 0 {
			t.Fatalf("at expiry: %+v", s)
		}
	})
}

var errZZDown = bd2TempErr{}

type bd2TempErr struct{}

func (bd2TempErr) Error() string   { return "down" }
func (bd2TempErr) Temporary() bool { return true }

// Through the retry loop, retry.WithGuards(retry.Guards{Budget: b}): a
// storm of failing calls all at once. Package doc: "a withdrawal is refused
// once the window's retries would exceed Ratio·requests +
// MinPerSecond·Window.Seconds()". 500 calls with 3 attempts each, all within
// one window: at most 0.1·500 + 10 = 60 retries run, and exactly that many
// are granted (every call fails, so every call asks).
func TestAttackBudget2RetryStormBurst(t *testing.T) {
	for _, zero := range []bool{false, true} {
		synctest.Test(t, func(t *testing.T) {
			var b *budget.Budget
			if zero {
				b = new(budget.Budget)
			} else {
				var err error
				if b, err = budget.New(budget.Config{}); err != nil {
					t.Fatal(err)
				}
			}
			p, err := retry.New(retry.WithGuards(retry.Guards{Budget: b}))
			if err != nil {
				t.Fatal(err)
			}
			var first, retries atomic.Int64
			var exhausted atomic.Int64
			var wg sync.WaitGroup
			for range 500 {
				wg.Go(func() {
					ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
					defer cancel()
					err := p.Do(ctx, func(ctx context.Context, attempt int) error {
						if attempt == 1 {
							first.Add(1)
						} else {
							retries.Add(1)
						}
						return errZZDown
					})
					var re *retry.Error
					if errors.As(err, &re) && re.Reason == retry.BudgetExhausted {
						exhausted.Add(1)
						if !errors.Is(err, errZZDown) {
							t.Errorf("BudgetExhausted without the last real error: %v", err)
						}
					}
				})
			}
			wg.Wait()
			if first.Load() != 500 || retries.Load() != 60 {
				t.Fatalf("zero=%v: %d first attempts, %d retries; want 500 and exactly 0.1·500+10 = 60 (%+v)", zero, first.Load(), retries.Load(), b.Stats())
			}
			if s := b.Stats(); s.Requests != 500 || s.Retries != 60 {
				t.Fatalf("zero=%v: Stats %+v, want 500 requests, 60 retries", zero, s)
			}
			if exhausted.Load() < 440 {
				t.Fatalf("zero=%v: %d calls ended BudgetExhausted, want at least 440", zero, exhausted.Load())
			}
		})
	}
}

// bd2Recorder wraps a budget to time every deposit and granted withdrawal.
type bd2Recorder struct {
	b        *budget.Budget
	t0       time.Time
	mu       sync.Mutex
	dep, ret []time.Duration
}

func (r *bd2Recorder) Deposit() {
	r.b.Deposit()
	r.mu.Lock()
	r.dep = append(r.dep, time.Since(r.t0))
	r.mu.Unlock()
}

func (r *bd2Recorder) Withdraw() bool {
	ok := r.b.Withdraw()
	if ok {
		r.mu.Lock()
		r.ret = append(r.ret, time.Since(r.t0))
		r.mu.Unlock()
	}
	return ok
}

// A sustained storm through the retry loop for two minutes at a varying
// rate: over every window of whole slices the granted retries stay within
// Ratio·requests(that window and the one before) + floor, and the retries
// that ran never exceed those granted. Overall, retries stay under
// 0.2·requests + the floor per window elapsed, a crude sum of the per-window
// bound.
func TestAttackBudget2RetryStormSustained(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b, err := budget.New(budget.Config{})
		if err != nil {
			t.Fatal(err)
		}
		rec := &bd2Recorder{b: b, t0: time.Now()}
		p, err := retry.New(retry.WithGuards(retry.Guards{Budget: rec}))
		if err != nil {
			t.Fatal(err)
		}
		var ran atomic.Int64
		var wg sync.WaitGroup
		rng := rand.New(rand.NewPCG(9, 9))
		for sec := range 120 {
			perSec := []int{0, 3, 20, 200}[(sec/7)%4]
			for range perSec {
				delay := time.Duration(rng.Int64N(int64(time.Second)))
				wg.Go(func() {
					time.Sleep(delay)
					ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
					defer cancel()
					_ = p.Do(ctx, func(ctx context.Context, attempt int) error {
						if attempt > 1 {
							ran.Add(1)
						}
						return errZZDown
					})
				})
			}
			time.Sleep(time.Second)
		}
		wg.Wait()
		sort.Slice(rec.ret, func(i, j int) bool { return rec.ret[i] < rec.ret[j] })
		sort.Slice(rec.dep, func(i, j int) bool { return rec.dep[i] < rec.dep[j] })
		if ran.Load() > int64(len(rec.ret)) {
			t.Fatalf("%d retries ran, %d granted", ran.Load(), len(rec.ret))
		}
		const W, slice = 10 * time.Second, time.Second
		for k := time.Duration(0); k <= 130; k++ {
			hi := (k + 1) * slice
			n := bd2Count(rec.ret, hi-W, hi)
			req := bd2Count(rec.dep, hi-2*W, hi)
			if lim := 0.1*float64(req) + 10; float64(n) > lim {
				t.Fatalf("window ending in slice %d: %d granted, %d requests in it and the one before, limit %v", k, n, req, lim)
			}
		}
		if len(rec.ret) == 0 || len(rec.dep) == 0 {
			t.Fatal("nothing happened")
		}
		if lim := 0.2*float64(len(rec.dep)) + 10*14; float64(len(rec.ret)) > lim {
			t.Fatalf("%d granted for %d requests over 2 minutes, above %v", len(rec.ret), len(rec.dep), lim)
		}
	})
}
