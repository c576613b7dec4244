package admission_test

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stormguard/stormguard/admission"
)

// queued is what became of a request that was sent to the queue.
type queued struct {
	id int
	p  admission.Permit
	d  admission.Decision
	at time.Duration
}

// TestQueueOriginalsFirst, step by step in a synctest bubble: a freed slot
// goes to the oldest queued original even if retries queued before it; a
// retry gets one only while no original waits; a retry does not take a
// free slot from queued requests, and an original that finds the queue full
// takes the place of the oldest queued retry, which is refused with
// QueueFull and the don't-retry signal.
func TestQueueOriginalsFirst(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctl := newController(t, admission.Config{MaxInFlight: 1, MaxQueue: 3, MaxQueueWait: time.Second, MinRetriesPerSecond: 1e6})
		ctx := context.Background()
		start := time.Now()
		hold, _ := ctl.Acquire(ctx, 1)
		results := make(chan queued, 4)
		send := func(id, attempt int) {
			go func() {
				p, d := ctl.Acquire(ctx, attempt)
				results <- queued{id, p, d, time.Since(start)}
			}()
			synctest.Wait()
		}
		send(0, 2) // retry, oldest
		send(1, 3) // retry
		send(2, 1) // original
		if s := ctl.Stats(); s.Queued != 3 {
			t.Fatalf("Stats() = %+v, want 3 queued", s)
		}
		// The queue is full: a retry is refused, an original takes the
		// oldest retry's place.
		if _, d := ctl.Acquire(ctx, 2); d.Outcome != admission.QueueFull || !d.DontRetry {
			t.Errorf("retry on a full queue: %+v, want QueueFull with DontRetry", d)
		}
		send(3, 1)
		r := <-results
		if r.id != 0 || r.d.Outcome != admission.QueueFull || !r.d.DontRetry || r.at != 0 {
			t.Errorf("evicted: request %d %+v at %v, want the oldest retry (0) refused QueueFull with DontRetry at once", r.id, r.d, r.at)
		}
		// Slots go to the originals in their order, then to the retry.
		for _, want := range []int{2, 3, 1} {
			time.Sleep(100 * time.Millisecond)
			hold.Release()
			synctest.Wait()
			r := <-results
			if r.id != want || r.d.Outcome != admission.Admitted {
				t.Errorf("after a release: request %d %+v, want request %d admitted", r.id, r.d, want)
			}
			hold = r.p
		}
		hold.Release()
		if s := ctl.Stats(); s.InFlight != 0 || s.Queued != 0 || s.Outcomes[admission.QueueFull] != 2 {
			t.Errorf("Stats() = %+v, want nothing in flight or queued, 2 QueueFull", s)
		}
	})
}

// TestQueueRetriesStandApart: retries that have stood in the queue for
// longer than the delay control's interval (they wait for gaps the
// originals leave) do not make the originals' list a standing one: an
// original that joins waits up to MaxQueueWait, while a retry that joins
// the retries' standing list waits the standing wait (the 200 ms interval
// here: no slot handed over for 300 ms is a turn of at least 300 ms).
func TestQueueRetriesStandApart(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctl := newController(t, admission.Config{MaxInFlight: 1, MaxQueue: 10, MaxQueueWait: time.Second, MinRetriesPerSecond: 1e6})
		ctx := context.Background()
		hold, _ := ctl.Acquire(ctx, 1)
		defer hold.Release()
		go ctl.Acquire(ctx, 2) // a retry stands in the queue for its 1 s
		synctest.Wait()
		time.Sleep(300 * time.Millisecond) // over the 200 ms interval
		t0 := time.Now()
		if _, d := ctl.Acquire(ctx, 2); d.Outcome != admission.QueueTimeout || time.Since(t0) != 200*time.Millisecond {
			t.Errorf("retry joining standing retries: %+v after %v, want QueueTimeout after the 200ms interval", d, time.Since(t0))
		}
		t0 = time.Now()
		if _, d := ctl.Acquire(ctx, 1); d.Outcome != admission.QueueTimeout || time.Since(t0) != time.Second {
			t.Errorf("original beside standing retries: %+v after %v, want QueueTimeout after MaxQueueWait (1s)", d, time.Since(t0))
		}
	})
}
