// Black-box attack on package admission (AREA = admission2).

package admission_test

import (
	"context"
	"math"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stormguard/stormguard/admission"
	"github.com/stormguard/stormguard/observe"
	"github.com/stormguard/stormguard/wire"
)

func adm2New(t *testing.T, c admission.Config) *admission.Controller {
	t.Helper()
	ctl, err := admission.New(c)
	if err != nil {
		t.Fatalf("New(%+v): %v", c, err)
	}
	return ctl
}

// adm2Limit reads the in-flight limit in force of a Controller built with
// MaxQueue -1, inside a synctest bubble: the permits out now plus the ones
// it still admits. The extra permits are given back for callers who left,
// with no time elapsed: "no sample" (package doc), so the limit is left as
// it was.
func adm2Limit(t *testing.T, ctl *admission.Controller) int {
	t.Helper()
	n := ctl.Stats().InFlight
	ctx, cancel := context.WithCancel(context.Background())
	var ps []admission.Permit
	for {
		p, d := ctl.Acquire(ctx, 1)
		if d.Outcome != admission.Admitted {
			break
		}
		ps = append(ps, p)
		if len(ps) > 1<<16 {
			t.Fatal("unbounded")
		}
	}
	cancel()
	for i := range ps {
		ps[i].Release()
	}
	return n + len(ps)
}

// Package doc: "a request that ran for LatencyCeiling or longer is a drop
// ...: the limit is cut by a tenth, at most once per LatencyCeiling/10".
func TestAttackAdm2AdaptiveCutOncePerInterval(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctl := adm2New(t, admission.Config{MaxInFlight: 100, MaxQueue: -1, LatencyCeiling: 100 * time.Millisecond})
		if got := adm2Limit(t, ctl); got != 100 {
			t.Fatalf("start limit %d, want 100", got)
		}
		var ps []admission.Permit
		for range 10 {
			p, _ := ctl.Acquire(context.Background(), 1)
			ps = append(ps, p)
		}
		time.Sleep(100 * time.Millisecond)
		for i := range ps {
			ps[i].Release()
		}
		if got := adm2Limit(t, ctl); got != 90 {
			t.Errorf("after 10 drops at one instant: limit %d, want 90 (one cut)", got)
		}
		// 10 ms later: the next drop cuts again.
		p, _ := ctl.Acquire(context.Background(), 1)
		time.Sleep(100 * time.Millisecond)
		p.Release()
		if got := adm2Limit(t, ctl); got != 81 {
			t.Errorf("after a drop 100 ms later: limit %d, want 81", got)
		}
	})
}

// Package doc: "a request that ran longer than the reference,
// LatencyCeiling/2, shrinks the limit by a fifth of its excess,
// limit·(1 - (1 - ref/latency)/5)".
func TestAttackAdm2AdaptiveSlowShrink(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctl := adm2New(t, admission.Config{MaxInFlight: 100, MaxQueue: -1, LatencyCeiling: 100 * time.Millisecond})
		p, _ := ctl.Acquire(context.Background(), 1)
		time.Sleep(75 * time.Millisecond)
		p.Release()
		want := 93 // 100·(1 - (1 - 50/75)/5) = 93.3
		if got := adm2Limit(t, ctl); got != want {
			t.Errorf("after one 75 ms request: limit %d, want %d", got, want)
		}
	})
}

// Package doc: a request "that ran longer than the reference and ended past
// its caller's deadline or with its context ended" is a drop; "a request
// whose caller left but that ran within the reference is no sample".
func TestAttackAdm2AdaptiveCallerGone(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		for _, tc := range []struct {
			run  time.Duration
			how  string
			want int
		}{
			{50 * time.Millisecond, "cancel", 100},                // within ref: no sample
			{50*time.Millisecond + time.Nanosecond, "cancel", 90}, // past ref: drop
			{60 * time.Millisecond, "deadline", 90},               // past its deadline
			{40 * time.Millisecond, "deadline", 100},              // within ref, deadline passed: no sample
		} {
			ctl := adm2New(t, admission.Config{MaxInFlight: 100, MaxQueue: -1, LatencyCeiling: 100 * time.Millisecond})
			var ctx context.Context
			var cancel context.CancelFunc
			if tc.how == "cancel" {
				ctx, cancel = context.WithCancel(context.Background())
			} else {
				ctx, cancel = context.WithTimeout(context.Background(), 10*time.Millisecond)
			}
			p, d := ctl.Acquire(ctx, 1)
			if d.Outcome != admission.Admitted {
				t.Fatalf("%v", d)
			}
			time.Sleep(tc.run)
			if tc.how == "cancel" {
				cancel()
			}
			p.Release()
			cancel()
			if got := adm2Limit(t, ctl); got != tc.want {
				t.Errorf("%s after %v: limit %d, want %d", tc.how, tc.run, got, tc.want)
			}
		}
	})
}

// Package doc: "a faster one grows it by 1/√limit while the limit is in use
// (at least half of it in flight)". And "moves between 1 and it".
func TestAttackAdm2AdaptiveGrowth(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctl := adm2New(t, admission.Config{MaxInFlight: 100, MaxQueue: -1, LatencyCeiling: 100 * time.Millisecond})
		p, _ := ctl.Acquire(context.Background(), 1)
		time.Sleep(100 * time.Millisecond)
		p.Release() // 90
		lim := 90.0
		var ps []admission.Permit
		for range 45 {
			q, _ := ctl.Acquire(context.Background(), 1)
			ps = append(ps, q)
		}
		// Keep 45 in flight (>= limit/2 while limit < 90) and release fast.
		for i := 0; i < 30; i++ {
			ps[0].Release()
			if 45 >= lim/2 {
				lim = math.Min(100, lim+1/math.Sqrt(lim))
			}
			q, d := ctl.Acquire(context.Background(), 1)
			if d.Outcome != admission.Admitted {
				t.Fatal(d)
			}
			ps[0] = q
		}
		for i := range ps {
			// no sample on the way out
			ps[i].Release()
		}
		_ = lim
		got := adm2Limit(t, ctl)
		if got != int(lim) {
			t.Errorf("after 30 fast releases in use: limit %d, want %d (float %.3f)", got, int(lim), lim)
		}
	})
}

// Queue order: "A freed slot goes to the oldest queued original, and to the
// oldest queued retry only while no original waits ... Within a class,
// first come first served."
func TestAttackAdm2QueueOrder(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctl := adm2New(t, admission.Config{MaxInFlight: 1, MaxQueue: 10, MaxQueueWait: 10 * time.Second})
		hold, _ := ctl.Acquire(context.Background(), 1)
		var mu sync.Mutex
		var order []string
		var wg sync.WaitGroup
		names := []struct {
			n string
			a int
		}{{"r1", 2}, {"o1", 1}, {"r2", 3}, {"o2", 1}, {"r3", 2}, {"o3", 1}}
		gate := make(chan struct{})
		for _, x := range names {
			wg.Add(1)
			go func() {
				defer wg.Done()
				p, d := ctl.Acquire(context.Background(), x.a)
				if d.Outcome != admission.Admitted {
					t.Errorf("%s: %v", x.n, d)
					return
				}
				mu.Lock()
				order = append(order, x.n)
				mu.Unlock()
				<-gate
				p.Release()
			}()
			synctest.Wait()
			time.Sleep(time.Millisecond)
		}
		hold.Release()
		for range names {
			synctest.Wait()
			gate <- struct{}{}
		}
		wg.Wait()
		want := "o1 o2 o3 r1 r2 r3"
		got := ""
		for i, s := range order {
			if i > 0 {
				got += " "
			}
			got += s
		}
		if got != want {
			t.Errorf("order %q, want %q", got, want)
		}
	})
}

// Observer / Stats: "So every request makes one event, and one more if it
// queued"; Outcomes count final decisions; Elapsed is the time waited in
// the queue; Delay the Retry-After of a refusal.
func TestAttackAdm2ObserverStatsEviction(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var mu sync.Mutex
		var evs []observe.Event
		obs := observe.Func(func(_ context.Context, e observe.Event) {
			mu.Lock()
			evs = append(evs, e)
			mu.Unlock()
		})
		ctl := adm2New(t, admission.Config{MaxInFlight: 1, MaxQueue: 1, Observer: obs, Name: "svc"})
		hold, _ := ctl.Acquire(context.Background(), 1)
		var rd admission.Decision
		done := make(chan struct{})
		go func() {
			_, rd = ctl.Acquire(context.Background(), 2)
			close(done)
		}()
		synctest.Wait()
		time.Sleep(20 * time.Millisecond)
		var od admission.Decision
		var op admission.Permit
		go func() {
			op, od = ctl.Acquire(context.Background(), 1)
		}()
		synctest.Wait()
		<-done
		if rd.Outcome != admission.QueueFull || !rd.DontRetry {
			t.Errorf("evicted retry: %+v, want QueueFull with DontRetry", rd)
		}
		time.Sleep(30 * time.Millisecond)
		hold.Release()
		synctest.Wait()
		if od.Outcome != admission.Admitted {
			t.Errorf("original: %+v", od)
		}
		op.Release()
		st := ctl.Stats()
		want := [5]uint64{2, 0, 1, 0, 0}
		if st.Outcomes != want || st.Originals != 2 || st.Retries != 1 || st.InFlight != 0 || st.Queued != 0 {
			t.Errorf("stats %+v", st)
		}
		mu.Lock()
		defer mu.Unlock()
		// hold admitted; retry queued; original queued; retry shed; original admitted.
		if len(evs) != 5 {
			t.Fatalf("events %+v", evs)
		}
		for _, e := range evs {
			if e.Name != "svc" || e.Kind != observe.Admission {
				t.Errorf("event %+v", e)
			}
			switch {
			case e.Outcome == "shed-busy":
				if e.Reason != "queue-full" || e.Attempt != 2 || e.Delay < time.Second || e.Elapsed != 20*time.Millisecond {
					t.Errorf("shed event %+v", e)
				}
			case e.Outcome == "admitted" && e.Attempt == 1 && e.Elapsed != 0:
				if e.Elapsed != 30*time.Millisecond {
					t.Errorf("admitted from queue %+v, want Elapsed 30ms", e)
				}
			}
		}
	})
}

// Wrap with a timeout field: a request whose time left is no more than the
// last of its class given a slot waited is dropped on arrival, Canceled,
// don't retry.
func TestAttackAdm2WrapOddTimeoutValues(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctl := adm2New(t, admission.Config{MaxInFlight: 4})
		h := ctl.Wrap(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
		for _, tc := range []struct {
			vals []string
			drop bool
		}{
			{[]string{"0"}, true},
			{[]string{" 0 "}, true},
			{[]string{"abc, 0"}, true},
			{[]string{"5", "0"}, true},
			{[]string{",0"}, true},
			{[]string{"0000"}, true},
			{[]string{"-0"}, false},
			{[]string{"+0"}, false},
			{[]string{"0.5"}, false},
			{[]string{"0x0"}, false},
			{[]string{""}, false},
			{[]string{"1e3"}, false},
			{[]string{"99999999999999999999999999"}, false},
			{[]string{"3153600000000"}, false}, // 100 years
			{[]string{"3153599999999, 0"}, true},
			{[]string{"\t0\t"}, true},
		} {
			for _, name := range []string{wire.TimeoutHeader, "X-Envoy-Expected-Rq-Timeout-Ms"} {
				r := httptest.NewRequest("GET", "/", nil)
				for _, v := range tc.vals {
					r.Header.Add(name, v)
				}
				rec := httptest.NewRecorder()
				h.ServeHTTP(rec, r)
				dropped := rec.Code == 503
				if dropped != tc.drop {
					t.Errorf("%s %q: code %d, want drop %v", name, tc.vals, rec.Code, tc.drop)
				}
				if dropped && !wire.DontRetry(rec.Header()) {
					t.Errorf("%s %q: dropped without don't-retry", name, tc.vals)
				}
			}
		}
	})
}

// A storm in a bubble: originals, retries, probes, deadlines, cancels, on
// an adaptive limit with an observer. Checks: no admitted request past its
// caller's deadline; never more in flight than MaxInFlight; afterwards
// nothing in flight or queued, and one final decision per request.
func TestAttackAdm2StormInvariants(t *testing.T) {
	for seed := range 20 {
		synctest.Test(t, func(t *testing.T) {
			var nev, nfinal, nqueued int64
			var emu sync.Mutex
			obs := observe.Func(func(_ context.Context, e observe.Event) {
				emu.Lock()
				nev++
				if e.Outcome == "queued" {
					nqueued++
				} else {
					nfinal++
				}
				emu.Unlock()
			})
			ctl := adm2New(t, admission.Config{MaxInFlight: 8, MaxQueue: 6, LatencyCeiling: 80 * time.Millisecond,
				MaxQueueWait: 200 * time.Millisecond, Observer: obs, RetryRatio: 0.5})
			var cur, peak int64
			var mu sync.Mutex
			var wg sync.WaitGroup
			const n = 400
			for i := range n {
				wg.Add(1)
				go func() {
					defer wg.Done()
					k := (i*7919 + seed*104729) % 1000
					time.Sleep(time.Duration(k%300) * time.Millisecond)
					attempt := 1 + k%3
					var ctx context.Context = context.Background()
					var cancel context.CancelFunc = func() {}
					var dl time.Time
					switch k % 4 {
					case 0:
						ctx, cancel = context.WithTimeout(ctx, time.Duration(k%150)*time.Millisecond)
						dl, _ = ctx.Deadline()
					case 1:
						ctx, cancel = context.WithCancel(ctx)
						time.AfterFunc(time.Duration(k%90)*time.Millisecond, cancel)
					}
					defer cancel()
					var p admission.Permit
					var d admission.Decision
					if k%5 == 0 {
						p, d = ctl.AcquireProbe(ctx, attempt)
					} else {
						p, d = ctl.Acquire(ctx, attempt)
					}
					if d.Outcome != admission.Admitted {
						if d.RetryAfter <= 0 {
							t.Errorf("refusal %+v without Retry-After", d)
						}
						return
					}
					if !dl.IsZero() && !time.Now().Before(dl) {
						t.Errorf("admitted at %v past its deadline %v", time.Now(), dl)
					}
					mu.Lock()
					cur++
					peak = max(peak, cur)
					mu.Unlock()
					time.Sleep(time.Duration(10+k%70) * time.Millisecond)
					mu.Lock()
					cur--
					mu.Unlock()
					p.Release()
				}()
			}
			wg.Wait()
			st := ctl.Stats()
			var sum uint64
			for _, o := range st.Outcomes {
				sum += o
			}
			if st.InFlight != 0 || st.Queued != 0 || sum != st.Originals+st.Retries || sum != n || peak > 8 {
				t.Errorf("seed %d: stats %+v sum %d peak %d", seed, st, sum, peak)
			}
			emu.Lock()
			if nfinal != n {
				t.Errorf("seed %d: %d final events for %d requests (%d queued)", seed, nfinal, n, nqueued)
			}
			emu.Unlock()
		})
	}
}

// Package doc, "Originals before retries": "An original that finds the queue
// full takes the place of the oldest queued retry, which is refused
// (QueueFull, with the don't-retry signal)." A queued retry that its client
// marked as a probe (AcquireProbe) is refused without it (AcquireProbe's
// own doc says so): the two docs disagree. DOC-ONLY evidence, not asserted.
func TestAttackAdm2EvictedProbeSignal(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctl := adm2New(t, admission.Config{MaxInFlight: 1, MaxQueue: 1})
		hold, _ := ctl.Acquire(context.Background(), 1)
		var rd admission.Decision
		done := make(chan struct{})
		go func() { _, rd = ctl.AcquireProbe(context.Background(), 2); close(done) }()
		synctest.Wait()
		var op admission.Permit
		go func() { op, _ = ctl.Acquire(context.Background(), 1) }()
		synctest.Wait()
		<-done
		t.Logf("evicted marked probe: %+v", rd)
		hold.Release()
		synctest.Wait()
		op.Release()
	})
}

// Config.MaxQueue: "0 means the same as the MaxInFlight in force". With an
// adaptive limit cut from 10 to 9, the queue still takes 10. DOC-ONLY
// evidence, not asserted.
func TestAttackAdm2QueueDepthAdaptive(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctl := adm2New(t, admission.Config{MaxInFlight: 10, LatencyCeiling: 100 * time.Millisecond})
		p, _ := ctl.Acquire(context.Background(), 1)
		time.Sleep(100 * time.Millisecond)
		p.Release() // 9
		var ps []admission.Permit
		for range 9 {
			q, _ := ctl.Acquire(context.Background(), 1)
			ps = append(ps, q)
		}
		var wg sync.WaitGroup
		for range 12 {
			wg.Add(1)
			go func() { defer wg.Done(); q, _ := ctl.Acquire(context.Background(), 1); q.Release() }()
		}
		synctest.Wait()
		t.Logf("limit in force 9; stats %+v", ctl.Stats())
		for i := range ps {
			ps[i].Release()
		}
		wg.Wait()
	})
}
