package admission_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stormguard/stormguard/admission"
	"github.com/stormguard/stormguard/wire"
)

// TestDeadlineDrops: work whose caller has left, or will have left before
// a slot frees, is dropped before it runs, as Canceled with the
// don't-retry signal; a queued request whose deadline comes before
// MaxQueueWait leaves the queue at its deadline.
func TestDeadlineDrops(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctl := newController(t, admission.Config{MaxInFlight: 1, MaxQueue: 10, MaxQueueWait: 10 * time.Second})
		past, cancel := context.WithDeadline(context.Background(), time.Now().Add(-time.Nanosecond))
		defer cancel()
		// Deadline already passed: dropped even though a slot is free.
		if _, d := ctl.Acquire(past, 1); d.Outcome != admission.Canceled || !d.DontRetry {
			t.Errorf("Acquire past the deadline = %+v, want Canceled with DontRetry", d)
		}

		hold, _ := ctl.Acquire(context.Background(), 1)
		start := time.Now()
		// Queued with 2 s left: leaves at 2 s, not at MaxQueueWait.
		ctx2, cancel2 := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel2()
		done := make(chan admission.Decision, 1)
		go func() { _, d := ctl.Acquire(ctx2, 1); done <- d }()
		synctest.Wait()
		d := <-done
		if d.Outcome != admission.Canceled || !d.DontRetry || time.Since(start) != 2*time.Second {
			t.Errorf("queued request with 2s left = %+v after %v, want Canceled with DontRetry at 2s", d, time.Since(start))
		}

		// The last waiter given a slot waited 3 s, and one still waits: a
		// request with 1 s left is dropped at once.
		got := make(chan admission.Permit, 2)
		for range 2 {
			go func() { p, _ := ctl.Acquire(context.Background(), 1); got <- p }()
		}
		synctest.Wait()
		time.Sleep(3 * time.Second)
		hold.Release()
		hold = <-got // waited 3 s; the other still waits
		ctx1, cancel1 := context.WithTimeout(context.Background(), time.Second)
		defer cancel1()
		t0 := time.Now()
		if _, d := ctl.Acquire(ctx1, 1); d.Outcome != admission.Canceled || !d.DontRetry || time.Since(t0) != 0 {
			t.Errorf("request with 1s left behind a 3s queue = %+v after %v, want Canceled at once", d, time.Since(t0))
		}
		hold.Release()
		last := <-got
		last.Release()
		if s := ctl.Stats(); s.Outcomes[admission.Canceled] != 3 {
			t.Errorf("Canceled = %d, want the 3 dropped for their deadline", s.Outcomes[admission.Canceled])
		}
	})
}

// TestStandingQueue: a queue that has not been empty (nor given a slot)
// for MaxQueueWait/5 is a standing queue; a request that joins it waits at
// most 25 turns, within MaxQueueWait/100 (CoDel's target) and
// MaxQueueWait/5 (the interval). A queue that has handed no slot over for
// 300 ms has a turn of at least 300 ms, so the joiner waits the interval;
// a joiner 5 ms after a slot handed over, the target. One that joins a
// queue just formed waits up to MaxQueueWait.
func TestStandingQueue(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctl := newController(t, admission.Config{MaxInFlight: 1, MaxQueue: 10, MaxQueueWait: time.Second})
		hold, _ := ctl.Acquire(context.Background(), 1)
		defer hold.Release()
		start := time.Now()
		first := make(chan time.Duration, 1)
		go func() {
			_, d := ctl.Acquire(context.Background(), 1)
			if d.Outcome != admission.QueueTimeout {
				t.Errorf("first waiter: %+v, want QueueTimeout", d)
			}
			first <- time.Since(start)
		}()
		synctest.Wait()
		time.Sleep(300 * time.Millisecond) // the queue has stood for 300 ms > 200 ms
		t0 := time.Now()
		if _, d := ctl.Acquire(context.Background(), 1); d.Outcome != admission.QueueTimeout || time.Since(t0) != 200*time.Millisecond {
			t.Errorf("joining a standing queue that handed no slot over: %+v after %v, want QueueTimeout after the 200ms interval", d, time.Since(t0))
		}
		if at := <-first; at != time.Second {
			t.Errorf("first waiter shed after %v, want MaxQueueWait (1s): it joined an empty queue", at)
		}
		// The queue emptied: a burst is absorbed again.
		t0 = time.Now()
		if _, d := ctl.Acquire(context.Background(), 1); d.Outcome != admission.QueueTimeout || time.Since(t0) != time.Second {
			t.Errorf("joining an empty queue: %+v after %v, want QueueTimeout after 1s", d, time.Since(t0))
		}
	})
}

// TestWrapTimeoutFields: over HTTP the caller's deadline comes from
// wire.TimeoutHeader or Envoy's x-envoy-expected-rq-timeout-ms (the earlier
// counts); "0" means the caller's time is up; a malformed value is
// ignored. A request shed for lack of room carries the capacity hint.
func TestWrapTimeoutFields(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctl := newController(t, admission.Config{MaxInFlight: 1, MaxQueue: 10, MaxQueueWait: 10 * time.Second})
		ran := 0
		h := ctl.Wrap(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { ran++ }))
		send := func(fields map[string]string) (*httptest.ResponseRecorder, time.Duration) {
			r := request(0)
			for k, v := range fields {
				r.Header.Set(k, v)
			}
			rec := httptest.NewRecorder()
			start := time.Now()
			h.ServeHTTP(rec, r)
			return rec, time.Since(start)
		}
		if rec, _ := send(map[string]string{wire.TimeoutHeader: "0"}); rec.Code != 503 || !wire.DontRetry(rec.Header()) || ran != 0 {
			t.Errorf("timeout 0: %d %v, handler ran %d; want 503 with the don't-retry signal, not run", rec.Code, rec.Header(), ran)
		}
		if rec, _ := send(map[string]string{wire.TimeoutHeader: "x5", "X-Envoy-Expected-Rq-Timeout-Ms": "-1"}); rec.Code != 200 || ran != 1 {
			t.Errorf("malformed timeouts: %d, handler ran %d; want the request served", rec.Code, ran)
		}
		hold, _ := ctl.Acquire(context.Background(), 1)
		for _, tt := range []struct {
			fields map[string]string
			wait   time.Duration
		}{
			{map[string]string{wire.TimeoutHeader: "1500"}, 1500 * time.Millisecond},
			{map[string]string{"x-envoy-expected-rq-timeout-ms": "700"}, 700 * time.Millisecond},
			{map[string]string{wire.TimeoutHeader: "900", "x-envoy-expected-rq-timeout-ms": "2000"}, 900 * time.Millisecond},
		} {
			rec, took := send(tt.fields)
			if rec.Code != 503 || !wire.DontRetry(rec.Header()) || took != tt.wait {
				t.Errorf("%v while busy: %d after %v, want 503 with the don't-retry signal after %v", tt.fields, rec.Code, took, tt.wait)
			}
			if rec.Header().Get(wire.CapacityHeader) != "" {
				t.Errorf("%v: a deadline drop carries the capacity hint %q", tt.fields, rec.Header().Get(wire.CapacityHeader))
			}
		}
		full := newController(t, admission.Config{MaxInFlight: 1, MaxQueue: -1})
		fh := full.Wrap(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
		p, _ := full.Acquire(context.Background(), 1)
		rec := httptest.NewRecorder()
		fh.ServeHTTP(rec, request(0))
		if rec.Code != 503 || rec.Header().Get(wire.CapacityHeader) != "1" {
			t.Errorf("shed for lack of room: %d, capacity hint %q; want 503 with %s: 1", rec.Code, rec.Header().Get(wire.CapacityHeader), wire.CapacityHeader)
		}
		p.Release()
		hold.Release()
	})
}

// TestNoDropByAnEmptyQueue: when the last queued request of a class leaves
// (its caller canceled), the queue's recent wait goes with it: a later
// request whose time left is below that wait queues and gets the slot,
// instead of being dropped on arrival with nobody queued.
func TestNoDropByAnEmptyQueue(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctl, err := admission.New(admission.Config{MaxInFlight: 1, MaxQueue: 10, MaxQueueWait: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		pa, _ := ctl.Acquire(context.Background(), 1) // A holds the only slot
		bGot := make(chan admission.Permit, 1)
		go func() { p, _ := ctl.Acquire(context.Background(), 1); bGot <- p }() // B queues at 0
		time.Sleep(10 * time.Millisecond)
		cctx, ccancel := context.WithCancel(context.Background())
		cDone := make(chan struct{})
		go func() { ctl.Acquire(cctx, 1); close(cDone) }() // C queues at 10 ms
		time.Sleep(40 * time.Millisecond)
		pa.Release() // 50 ms: B gets the slot after 50 ms; C waits
		pb := <-bGot
		time.Sleep(10 * time.Millisecond)
		ccancel() // 60 ms: C leaves; nobody is queued
		<-cDone
		time.Sleep(10 * time.Millisecond)
		go func() { time.Sleep(10 * time.Millisecond); pb.Release() }() // the slot frees at 80 ms
		dctx, dcancel := context.WithTimeout(context.Background(), 40*time.Millisecond)
		defer dcancel()
		pd, d := ctl.Acquire(dctx, 1)
		if d.Outcome != admission.Admitted {
			t.Errorf("D = %v with nobody queued and the slot free 30 ms before its deadline, want admitted", d.Outcome)
		}
		pd.Release()
	})
}

// TestSlotAtTheDeadlineIsNotTaken: a queued request whose slot frees at
// the very instant its caller's deadline comes is dropped (Canceled, don't
// retry), never admitted with its caller gone, and the slot goes on (the
// next call takes it). It was admitted in about 4 runs of 10 of the tie.
func TestSlotAtTheDeadlineIsNotTaken(t *testing.T) {
	for range 40 {
		synctest.Test(t, func(t *testing.T) {
			ctl, err := admission.New(admission.Config{MaxInFlight: 1, MaxQueueWait: time.Second})
			if err != nil {
				t.Fatal(err)
			}
			p, _ := ctl.Acquire(context.Background(), 1)
			go func() { time.Sleep(100 * time.Millisecond); p.Release() }()
			ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
			defer cancel()
			q, d := ctl.Acquire(ctx, 1)
			if d.Outcome == admission.Admitted && ctx.Err() != nil {
				t.Fatalf("admitted with the caller's context past its deadline")
			}
			q.Release()
			synctest.Wait()
			if s := ctl.Stats(); s.InFlight != 0 {
				t.Fatalf("%d in flight after every permit was released: the slot was lost", s.InFlight)
			}
			next, d2 := ctl.Acquire(context.Background(), 1)
			if d2.Outcome != admission.Admitted {
				t.Fatalf("the next call: %v, want the free slot", d2.Outcome)
			}
			next.Release()
		})
	}
}

// TestDeadlineAtTheQueueLimit: a queued request whose caller's deadline
// comes exactly when its time in the queue ends is the caller's deadline
// drop (Canceled, don't retry), not a queue timeout: the caller has left.
func TestDeadlineAtTheQueueLimit(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctl, err := admission.New(admission.Config{MaxInFlight: 1, MaxQueueWait: 100 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		p, _ := ctl.Acquire(context.Background(), 1)
		defer p.Release()
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cancel()
		_, d := ctl.Acquire(ctx, 1)
		if d.Outcome != admission.Canceled || !d.DontRetry {
			t.Errorf("%+v, want Canceled with the don't-retry signal", d)
		}
	})
}
