package admission_test

import (
	"context"
	"math"
	"reflect"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stormguard/stormguard/admission"
	"github.com/stormguard/stormguard/observe"
)

// TestDefaults: Config{} admits 10% retries plus a floor of 1/s over a 10 s
// window, 1024 requests at once and 1024 queued for at most 500 ms, and
// refuses with a Retry-After from 1 s to 11 s. A zero Controller is the
// same.
func TestDefaults(t *testing.T) {
	for _, zero := range []bool{false, true} {
		synctest.Test(t, func(t *testing.T) {
			ctl := &admission.Controller{}
			if !zero {
				ctl = newController(t, admission.Config{})
			}
			ctx := context.Background()
			for range 100 {
				p, _ := ctl.Acquire(ctx, 1)
				p.Release()
			}
			retries := 0
			for {
				p, d := ctl.Acquire(ctx, 2)
				if d.Outcome != admission.Admitted {
					if d.Outcome != admission.RetryRefused || !d.DontRetry || d.RetryAfter < time.Second || d.RetryAfter >= 11*time.Second {
						t.Errorf("refused retry: %+v, want RetryRefused, DontRetry, a Retry-After in [1s, 11s)", d)
					}
					break
				}
				p.Release()
				retries++
			}
			if retries != 20 { // 0.1·100 + 1·10
				t.Errorf("zero %v: %d retries admitted after 100 originals, want 20", zero, retries)
			}
			permits := make([]admission.Permit, 1024)
			for i := range permits {
				if permits[i], _ = ctl.Acquire(ctx, 1); ctl.Stats().InFlight != i+1 {
					t.Fatalf("request %d not admitted", i+1)
				}
			}
			start := time.Now()
			_, d := ctl.Acquire(ctx, 1) // queues, and waits in vain
			if d.Outcome != admission.QueueTimeout || time.Since(start) != 500*time.Millisecond {
				t.Errorf("request 1025: %+v after %v, want QueueTimeout after 500ms", d, time.Since(start))
			}
			for i := range permits {
				permits[i].Release()
			}
		})
	}
}

func TestNewInvalid(t *testing.T) {
	tests := []struct {
		name string
		c    admission.Config
		want string // in the message
	}{
		{"negative queue wait", admission.Config{MaxQueueWait: -time.Second}, "MaxQueueWait"},
		{"negative latency ceiling", admission.Config{LatencyCeiling: -time.Second}, "LatencyCeiling"},
		{"latency ceiling without a limit", admission.Config{LatencyCeiling: time.Second, MaxInFlight: -1}, "LatencyCeiling"},
		{"NaN ratio", admission.Config{RetryRatio: math.NaN()}, "RetryRatio"},
		{"ratio above 1", admission.Config{RetryRatio: 1.5}, "RetryRatio"},
		{"infinite floor", admission.Config{MinRetriesPerSecond: math.Inf(1)}, "MinRetriesPerSecond"},
		{"minus infinite floor", admission.Config{MinRetriesPerSecond: math.Inf(-1)}, "MinRetriesPerSecond"},
		{"NaN floor", admission.Config{MinRetriesPerSecond: math.NaN()}, "MinRetriesPerSecond"},
		{"negative window", admission.Config{Window: -time.Second}, "Window"},
		{"window not a multiple", admission.Config{Window: 10*time.Second + 1}, "Window: "},
		{"slice too short", admission.Config{Window: 5 * time.Millisecond}, "Window: "},
		{"negative base", admission.Config{RetryAfterBase: -time.Second}, "RetryAfterBase"},
		{"base too long", admission.Config{RetryAfterBase: 25 * time.Hour}, "exceeds"},
		{"spread too long", admission.Config{RetryAfterSpread: 24 * time.Hour}, "exceeds"},
		{"base + spread overflow", admission.Config{RetryAfterBase: time.Hour, RetryAfterSpread: math.MaxInt64}, "exceeds"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctl, err := admission.New(tt.c)
			if err == nil || !strings.HasPrefix(err.Error(), "admission: invalid config: ") {
				t.Fatalf("New(%+v) = %v, %v; want an invalid config error", tt.c, ctl, err)
			}
			if ctl != nil {
				t.Errorf("New(%+v) returned a Controller with its error", tt.c)
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("New(%+v) error %q does not mention %q", tt.c, err, tt.want)
			}
		})
	}
}

func TestNewValidEdges(t *testing.T) {
	tests := []struct {
		name string
		c    admission.Config
	}{
		{"zero", admission.Config{}},
		{"no limit, no queue", admission.Config{MaxInFlight: -1, MaxQueue: -1}},
		{"ratio 1", admission.Config{RetryRatio: 1}},
		{"no ratio, no floor", admission.Config{RetryRatio: -1, MinRetriesPerSecond: -1}},
		{"shortest window", admission.Config{Window: 10 * time.Millisecond}},
		{"longest retry-after", admission.Config{RetryAfterBase: time.Hour, RetryAfterSpread: 23 * time.Hour}},
		{"no jitter", admission.Config{RetryAfterSpread: -1}},
	}
	for _, tt := range tests {
		if _, err := admission.New(tt.c); err != nil {
			t.Errorf("%s: New(%+v) = %v, want no error", tt.name, tt.c, err)
		}
	}
}

func TestOutcomeString(t *testing.T) {
	tests := []struct {
		o    admission.Outcome
		want string
	}{
		{admission.Admitted, "admitted"},
		{admission.RetryRefused, "retry-refused"},
		{admission.QueueFull, "queue-full"},
		{admission.QueueTimeout, "queue-timeout"},
		{admission.Canceled, "canceled"},
		{admission.Outcome(200), "Outcome(200)"},
	}
	for _, tt := range tests {
		if got := tt.o.String(); got != tt.want {
			t.Errorf("Outcome(%d).String() = %q, want %q", uint8(tt.o), got, tt.want)
		}
	}
}

// The zero Controller works with the defaults.
func TestZeroController(t *testing.T) {
	var ctl admission.Controller
	p, d := ctl.Acquire(context.Background(), 1)
	if d.Outcome != admission.Admitted {
		t.Fatalf("zero Controller refused an original: %+v", d)
	}
	if s := ctl.Stats(); s.InFlight != 1 || s.Originals != 1 || s.Outcomes[admission.Admitted] != 1 {
		t.Errorf("Stats() = %+v, want one original in flight", s)
	}
	p.Release()
	p.Release() // a second release of the same variable does nothing
	if s := ctl.Stats(); s.InFlight != 0 {
		t.Errorf("after Release, InFlight = %d, want 0", s.InFlight)
	}
	var zp admission.Permit
	zp.Release() // the zero Permit holds nothing
}

// The retry rule, exactly: with 1000 originals in the window, ratio 0.1 and
// a floor of 1/s over 10 s, exactly 110 retries reach the handler however
// many goroutines send them, and every other one is refused with the
// don't-retry signal before the handler runs.
func TestRetriesBeyondRatioNeverReachHandler(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctl := newController(t, admission.Config{MaxInFlight: -1})
		var originals, retries atomic.Int64
		h := ctl.Wrap(handlerOf(func(attempt int) {
			if attempt >= 2 {
				retries.Add(1)
			} else {
				originals.Add(1)
			}
		}))

		const workers, nOrig, nRetry = 32, 1000, 600
		run := func(n, attempt int, check func(int)) {
			var wg sync.WaitGroup
			var next atomic.Int64
			for range workers {
				wg.Go(func() {
					for next.Add(1) <= int64(n) {
						check(attempt)
					}
				})
			}
			wg.Wait()
		}
		run(nOrig, 0, func(a int) {
			if rec := serve(h, a); rec.Code != 200 {
				t.Errorf("original: status %d, want 200", rec.Code)
			}
		})
		var refused atomic.Int64
		run(nRetry, 2, func(a int) {
			rec := serve(h, a)
			if rec.Code == 200 {
				return
			}
			refused.Add(1)
			checkRefusal(t, rec, 1, 10, true)
		})

		const want = 110 // 0.1·1000 + 1·10
		if got := retries.Load(); got != want {
			t.Errorf("retries that reached the handler = %d, want exactly %d", got, want)
		}
		if got := refused.Load(); got != nRetry-want {
			t.Errorf("refused retries = %d, want %d", got, nRetry-want)
		}
		if got := originals.Load(); got != nOrig {
			t.Errorf("originals that reached the handler = %d, want %d", got, nOrig)
		}
		s := ctl.Stats()
		wantStats := admission.Stats{Originals: nOrig, Retries: nRetry}
		wantStats.Outcomes[admission.Admitted] = nOrig + want
		wantStats.Outcomes[admission.RetryRefused] = nRetry - want
		if s != wantStats {
			t.Errorf("Stats() = %+v\nwant %+v", s, wantStats)
		}
	})
}

// Originals and retries interleaved from many goroutines: the retries that
// reach the handler never exceed the limit computed from the originals the
// window had counted at that moment.
func TestRetryRatioUnderInterleaving(t *testing.T) {
	synctest.Test(t, func(t *testing.T) { // the window does not slide
		var violations, admittedRetries atomic.Int64
		var ctl *admission.Controller
		ctl = newController(t, admission.Config{
			MaxInFlight: -1, RetryRatio: 0.2, MinRetriesPerSecond: 0.5,
			Observer: observe.Func(func(_ context.Context, e observe.Event) {
				if e.Attempt >= 2 && e.Outcome == "admitted" {
					// The originals counted now are at least those counted
					// when this retry was admitted.
					if n := admittedRetries.Add(1); float64(n) > 0.2*float64(ctl.Stats().Originals)+0.5*10 {
						violations.Add(1)
					}
				}
			}),
		})
		var reached atomic.Int64
		h := ctl.Wrap(handlerOf(func(attempt int) {
			if attempt >= 2 {
				reached.Add(1)
			}
		}))
		var wg sync.WaitGroup
		for w := range 16 {
			wg.Go(func() {
				for i := range 300 {
					attempt := 1
					if (i+w)%3 == 0 { // a third of the traffic is retries
						attempt = 2 + i%3
					}
					serve(h, attempt)
				}
			})
		}
		wg.Wait()
		s := ctl.Stats()
		if violations.Load() != 0 {
			t.Errorf("%d admissions saw more retries than the limit", violations.Load())
		}
		if got := reached.Load(); got != admittedRetries.Load() || float64(got) > 0.2*float64(s.Originals)+5 {
			t.Errorf("retries reached = %d, admitted %d, limit %v", got, admittedRetries.Load(), 0.2*float64(s.Originals)+5)
		}
		if refused := s.Outcomes[admission.RetryRefused]; s.Retries != uint64(reached.Load())+refused || refused == 0 {
			t.Errorf("Stats() = %+v: retries != reached %d + refused, or none refused with a third of the traffic retrying", s, reached.Load())
		}
	})
}

// The window slides: originals older than the window no longer pay for
// retries.
func TestRetryWindowSlides(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctl := newController(t, admission.Config{MinRetriesPerSecond: -1}) // ratio only
		ctx := context.Background()
		for range 50 {
			p, _ := ctl.Acquire(ctx, 1)
			p.Release()
		}
		admitted := 0
		for range 20 {
			if p, d := ctl.Acquire(ctx, 3); d.Outcome == admission.Admitted {
				admitted++
				p.Release()
			}
		}
		if admitted != 5 {
			t.Fatalf("with 50 originals, %d retries admitted, want 5", admitted)
		}
		time.Sleep(10 * time.Second) // the default window
		if _, d := ctl.Acquire(ctx, 2); d.Outcome != admission.RetryRefused || !d.DontRetry {
			t.Fatalf("a window later with no originals: %+v, want RetryRefused with DontRetry", d)
		}
	})
}

// Attempt numbers below 1 count as originals.
func TestAcquireAttemptBelowOne(t *testing.T) {
	ctl := newController(t, admission.Config{})
	for _, a := range []int{0, -5, math.MinInt} {
		p, d := ctl.Acquire(context.Background(), a)
		if d.Outcome != admission.Admitted || d.DontRetry {
			t.Errorf("Acquire(ctx, %d) = %+v, want an admitted original", a, d)
		}
		p.Release()
	}
	if s := ctl.Stats(); s.Originals != 3 || s.Retries != 0 {
		t.Errorf("Stats() = %+v, want 3 originals", s)
	}
}

// The work-in-progress limit without a queue, under real concurrency: never
// more than MaxInFlight handlers at once, every request admitted or shed.
func TestMaxInFlightConcurrent(t *testing.T) {
	const limit, workers, each = 4, 32, 50
	ctl := newController(t, admission.Config{MaxInFlight: limit, MaxQueue: -1})
	var running peak
	h := ctl.Wrap(handlerOf(func(int) {
		running.enter()
		for range 50 {
			runtime.Gosched() // so that handlers overlap
		}
		running.leave()
	}))
	var ok, shed atomic.Int64
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for range each {
				rec := serve(h, 0)
				if rec.Code == 200 {
					ok.Add(1)
					continue
				}
				shed.Add(1)
				checkRefusal(t, rec, 1, 10, false)
			}
		})
	}
	wg.Wait()
	if p := running.max.Load(); p > limit {
		t.Errorf("peak handlers at once = %d, want at most %d", p, limit)
	}
	s := ctl.Stats()
	if s.Outcomes[admission.Admitted] != uint64(ok.Load()) || s.Outcomes[admission.QueueFull] != uint64(shed.Load()) || ok.Load()+shed.Load() != workers*each {
		t.Errorf("Stats() = %+v; handler ran %d, shed %d of %d", s, ok.Load(), shed.Load(), workers*each)
	}
	if s.InFlight != 0 || s.Queued != 0 {
		t.Errorf("after the run Stats() = %+v, want nothing in flight or queued", s)
	}
}

// The queue under real concurrency with a short real wait: slots are
// handed over, timeouts race with hand-overs, and in the end no slot and
// no waiter is left behind.
func TestQueueConcurrent(t *testing.T) {
	const limit, queue, workers, each = 3, 8, 24, 40
	var maxQueue atomic.Int64
	var ctl *admission.Controller
	ctl = newController(t, admission.Config{
		MaxInFlight: limit, MaxQueue: queue, MaxQueueWait: 200 * time.Microsecond,
		Observer: observe.Func(func(context.Context, observe.Event) {
			q := int64(ctl.Stats().Queued)
			for m := maxQueue.Load(); q > m && !maxQueue.CompareAndSwap(m, q); m = maxQueue.Load() {
			}
		}),
	})
	var running peak
	h := ctl.Wrap(handlerOf(func(int) {
		running.enter()
		for range 100 {
			runtime.Gosched()
		}
		running.leave()
	}))
	var ok atomic.Int64
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for range each {
				if serve(h, 0).Code == 200 {
					ok.Add(1)
				}
			}
		})
	}
	wg.Wait()
	s := ctl.Stats()
	if p := running.max.Load(); p > limit {
		t.Errorf("peak handlers at once = %d, want at most %d", p, limit)
	}
	if m := maxQueue.Load(); m > queue {
		t.Errorf("queue length reached %d, want at most %d", m, queue)
	}
	if s.InFlight != 0 || s.Queued != 0 {
		t.Errorf("after the run InFlight = %d, Queued = %d, want 0 and 0", s.InFlight, s.Queued)
	}
	var decided uint64
	for _, n := range s.Outcomes {
		decided += n
	}
	if s.Outcomes[admission.Admitted] != uint64(ok.Load()) || decided != workers*each {
		t.Errorf("Stats() = %+v: decisions %d, want %d (handler ran %d)", s, decided, workers*each, ok.Load())
	}
	t.Logf("admitted %d, full %d, timed out %d", s.Outcomes[admission.Admitted], s.Outcomes[admission.QueueFull], s.Outcomes[admission.QueueTimeout])
}

// The queue, step by step in a synctest bubble: FIFO hand-over, a full
// queue sheds at once, a queued request waits exactly MaxQueueWait.
func TestQueueSteps(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		events := new(recorder)
		ctl := newController(t, admission.Config{
			Name: "pay", MaxInFlight: 2, MaxQueue: 3, MaxQueueWait: time.Second, Rand: seeded(7),
			RetryAfterSpread: -1, Observer: events,
		})
		ctx := context.Background()
		start := time.Now()

		// Two running, three queued.
		permits := make([]admission.Permit, 2)
		for i := range permits {
			var d admission.Decision
			permits[i], d = ctl.Acquire(ctx, 1)
			if d.Outcome != admission.Admitted {
				t.Fatalf("request %d refused: %+v", i, d)
			}
		}
		type result struct {
			id int
			p  admission.Permit
			d  admission.Decision
			at time.Duration
		}
		results := make(chan result, 3)
		for id := range 3 {
			go func() {
				p, d := ctl.Acquire(ctx, 1)
				results <- result{id, p, d, time.Since(start)}
			}()
			synctest.Wait() // queued in this order
		}
		if s := ctl.Stats(); s.InFlight != 2 || s.Queued != 3 {
			t.Fatalf("Stats() = %+v, want 2 in flight and 3 queued", s)
		}

		// The queue is full: an original and a retry are shed at once.
		for _, attempt := range []int{1, 2} {
			_, d := ctl.Acquire(ctx, attempt)
			if d.Outcome != admission.QueueFull || d.DontRetry != (attempt == 2) || d.RetryAfter != time.Second {
				t.Errorf("Acquire(attempt %d) on a full queue = %+v, want QueueFull, DontRetry %v, RetryAfter 1s",
					attempt, d, attempt == 2)
			}
		}

		// A slot frees after 300 ms: the oldest waiter gets it.
		time.Sleep(300 * time.Millisecond)
		permits[0].Release()
		synctest.Wait()
		r := <-results
		if r.id != 0 || r.d.Outcome != admission.Admitted || r.at != 300*time.Millisecond {
			t.Errorf("after one release: waiter %d got %+v, want waiter 0 admitted after 300ms", r.id, r.d)
		}

		// The other two wait exactly MaxQueueWait, then are shed.
		for range 2 {
			r := <-results
			if r.d.Outcome != admission.QueueTimeout || r.at != time.Second || r.d.DontRetry {
				t.Errorf("waiter %d: %+v at %v, want QueueTimeout after exactly 1s, DontRetry false", r.id, r.d, r.at)
			}
		}
		s := ctl.Stats()
		if s.InFlight != 2 || s.Queued != 0 || s.Outcomes[admission.Admitted] != 3 || s.Outcomes[admission.QueueFull] != 2 || s.Outcomes[admission.QueueTimeout] != 2 {
			t.Errorf("Stats() = %+v, want 2 in flight, 3 admitted, 2 full, 2 timed out", s)
		}
		permits[1].Release()
		r.p.Release()
		if s := ctl.Stats(); s.InFlight != 0 {
			t.Errorf("InFlight = %d after every release, want 0", s.InFlight)
		}
		// One event per decision, one more per request that queued.
		ev := func(outcome, reason string, attempt int, delay, elapsed time.Duration) observe.Event {
			return observe.Event{Kind: observe.Admission, Name: "pay", Attempt: attempt, Outcome: outcome, Reason: reason, Delay: delay, Elapsed: elapsed}
		}
		want := []observe.Event{
			ev("admitted", "", 1, 0, 0),
			ev("admitted", "", 1, 0, 0),
			ev("queued", "", 1, 0, 0),
			ev("queued", "", 1, 0, 0),
			ev("queued", "", 1, 0, 0),
			ev("shed-busy", "queue-full", 1, time.Second, 0),
			ev("shed-busy", "queue-full", 2, time.Second, 0),
			ev("admitted", "", 1, 0, 300*time.Millisecond),
			ev("shed-busy", "queue-timeout", 1, time.Second, time.Second),
			ev("shed-busy", "queue-timeout", 1, time.Second, time.Second),
		}
		if got := events.all(); !reflect.DeepEqual(got, want) {
			t.Errorf("events:\n%v\nwant\n%v", got, want)
		}
	})
}

// A queued request whose context ends is shed as Canceled, leaves the
// queue, and the next free slot goes to the one behind it.
func TestQueueCanceled(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		events := new(recorder)
		ctl := newController(t, admission.Config{MaxInFlight: 1, MaxQueue: 2, MaxQueueWait: time.Minute, Observer: events})
		p, _ := ctl.Acquire(context.Background(), 1)
		ctx, cancel := context.WithCancel(context.Background())
		canceled := make(chan admission.Decision, 1)
		go func() {
			_, d := ctl.Acquire(ctx, 1)
			canceled <- d
		}()
		synctest.Wait()
		next := make(chan admission.Decision, 1)
		go func() {
			//lint:ignore SA1012 a nil context is documented to never end
			p, d := ctl.Acquire(nil, 1)
			next <- d
			p.Release()
		}()
		synctest.Wait()
		time.Sleep(time.Second)
		cancel()
		synctest.Wait()
		if d := <-canceled; d.Outcome != admission.Canceled {
			t.Errorf("canceled waiter: %+v, want Canceled", d)
		}
		if e := events.last(); e.Outcome != "shed-busy" || e.Reason != "canceled" || e.Elapsed != time.Second || e.Delay < time.Second {
			t.Errorf("canceled waiter reported %+v, want shed-busy, reason canceled, after 1s, with a Retry-After", e)
		}
		if s := ctl.Stats(); s.Queued != 1 || s.Outcomes[admission.Canceled] != 1 {
			t.Errorf("Stats() = %+v, want 1 queued, 1 canceled", s)
		}
		p.Release()
		synctest.Wait()
		if d := <-next; d.Outcome != admission.Admitted {
			t.Errorf("waiter behind the canceled one: %+v, want Admitted", d)
		}
		if s := ctl.Stats(); s.InFlight != 0 || s.Queued != 0 {
			t.Errorf("Stats() = %+v, want nothing left", s)
		}
	})
}

// A release at the very instant the wait ends: whichever wins, no slot is
// lost and none is given twice.
func TestQueueHandOffAtTimeout(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctl := newController(t, admission.Config{MaxInFlight: 1, MaxQueueWait: time.Second})
		outcomes := map[admission.Outcome]int{}
		for range 50 {
			p, _ := ctl.Acquire(context.Background(), 1)
			got := make(chan admission.Permit, 1)
			go func() {
				q, d := ctl.Acquire(context.Background(), 1)
				outcomes[d.Outcome]++
				got <- q
			}()
			go func() {
				time.Sleep(time.Second)
				p.Release()
			}()
			q := <-got
			q.Release()
			synctest.Wait()
			if s := ctl.Stats(); s.InFlight != 0 || s.Queued != 0 {
				t.Fatalf("Stats() = %+v, want nothing in flight or queued", s)
			}
		}
		t.Logf("outcomes of a wait that ends as the slot frees: %v", outcomes)
	})
}

// With no limit on work in progress nothing queues or is shed.
func TestNoLimit(t *testing.T) {
	ctl := newController(t, admission.Config{MaxInFlight: -1})
	var permits []admission.Permit
	for range 5000 {
		p, d := ctl.Acquire(context.Background(), 1)
		if d.Outcome != admission.Admitted {
			t.Fatalf("unlimited Controller refused: %+v", d)
		}
		permits = append(permits, p)
	}
	if s := ctl.Stats(); s.InFlight != 5000 {
		t.Errorf("InFlight = %d, want 5000", s.InFlight)
	}
	for i := range permits {
		permits[i].Release()
	}
}

// A handler that panics gives its slot back.
func TestPanicReleases(t *testing.T) {
	ctl := newController(t, admission.Config{MaxInFlight: 1, MaxQueue: -1})
	h := ctl.Wrap(handlerOf(func(int) { panic("boom") }))
	func() {
		defer func() {
			if recover() == nil {
				t.Error("the handler's panic did not propagate")
			}
		}()
		serve(h, 0)
	}()
	if s := ctl.Stats(); s.InFlight != 0 {
		t.Errorf("after a panic InFlight = %d, want 0", s.InFlight)
	}
}

// A Rand that returns values outside [0, 1) is clamped; no jitter means
// every refusal says the base.
func TestRetryAfterDraw(t *testing.T) {
	tests := []struct {
		name   string
		spread time.Duration
		u      float64
		want   time.Duration
	}{
		{"low", 4 * time.Second, 0, 2 * time.Second},
		{"middle", 4 * time.Second, 0.5, 4 * time.Second},
		{"negative", 4 * time.Second, -3, 2 * time.Second},
		{"NaN", 4 * time.Second, math.NaN(), 2 * time.Second},
		{"one", 4 * time.Second, 1, 6*time.Second - 1},
		{"no jitter", -1, 0.9, 2 * time.Second},
	}
	for _, tt := range tests {
		ctl := newController(t, admission.Config{
			MaxInFlight: 1, MaxQueue: -1, RetryAfterBase: 2 * time.Second, RetryAfterSpread: tt.spread,
			Rand: func() float64 { return tt.u },
		})
		p, _ := ctl.Acquire(context.Background(), 1)
		_, d := ctl.Acquire(context.Background(), 1)
		p.Release()
		if d.RetryAfter != tt.want {
			t.Errorf("%s: RetryAfter = %v, want %v", tt.name, d.RetryAfter, tt.want)
		}
	}
}
