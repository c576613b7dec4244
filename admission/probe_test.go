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

// TestAcquireProbe: a marked retry takes an idle slot without the ratio
// (spending no allowance); with no idle slot it is a retry like any other
// within the ratio (it queues), and beyond it is refused with the base
// Retry-After and without the don't-retry signal.
func TestAcquireProbe(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctl := newController(t, admission.Config{MaxInFlight: 1, MaxQueue: 4, RetryRatio: -1, MinRetriesPerSecond: 0.1, // 1 retry per window
			RetryAfterBase: 2 * time.Second, Window: 10 * time.Second})
		ctx := context.Background()
		for i := range 3 { // idle: admitted, no allowance spent
			p, d := ctl.AcquireProbe(ctx, 3)
			if d.Outcome != admission.Admitted {
				t.Fatalf("probe %d on an idle server: %+v, want admitted", i, d)
			}
			p.Release()
		}
		hold, _ := ctl.Acquire(ctx, 1)
		// Busy, and the window admits one retry: the probe queues like a retry.
		got := make(chan admission.Decision, 1)
		go func() {
			p, d := ctl.AcquireProbe(ctx, 2)
			p.Release()
			got <- d
		}()
		synctest.Wait()
		if s := ctl.Stats(); s.Queued != 1 {
			t.Fatalf("busy probe within the ratio: Stats %+v, want it queued", s)
		}
		// Busy, and the allowance is spent: refused, base Retry-After, no don't-retry.
		if _, d := ctl.AcquireProbe(ctx, 2); d.Outcome != admission.QueueFull || d.DontRetry || d.RetryAfter != 2*time.Second {
			t.Errorf("busy probe beyond the ratio: %+v, want QueueFull, no DontRetry, RetryAfter 2s", d)
		}
		// An unmarked retry beyond the ratio is refused as usual.
		if _, d := ctl.Acquire(ctx, 2); d.Outcome != admission.RetryRefused || !d.DontRetry {
			t.Errorf("unmarked retry beyond the ratio: %+v, want RetryRefused with DontRetry", d)
		}
		hold.Release()
		if d := <-got; d.Outcome != admission.Admitted {
			t.Errorf("queued probe: %+v, want admitted when the slot freed", d)
		}
		if s := ctl.Stats(); s.Retries != 6 || s.Outcomes[admission.RetryRefused] != 1 {
			t.Errorf("Stats %+v, want 6 retries counted (5 marked), 1 refused by the ratio", s)
		}
	})
}

// TestProbeDeadlineDrop: a marked probe dropped for its caller's deadline,
// on arrival or after it queued, gets one answer: Canceled, RetryAfterBase
// without jitter, and the don't-retry signal of every deadline drop.
func TestProbeDeadlineDrop(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctl, err := admission.New(admission.Config{MaxInFlight: 1, MaxQueueWait: 10 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		hold, _ := ctl.Acquire(context.Background(), 1) // the one slot is busy
		defer hold.Release()
		h := ctl.Wrap(http.NotFoundHandler())
		req := httptest.NewRequest(http.MethodGet, "http://p.test/", nil)
		req.Header.Set(wire.AttemptHeader, "2")
		req.Header.Set(wire.ProbeHeader, "1")
		req.Header.Set(wire.TimeoutHeader, "50") // it queues, then its caller's 50 ms end
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if s := ctl.Stats(); s.Outcomes[admission.Canceled] != 1 {
			t.Fatalf("not a deadline drop: %+v", s)
		}
		if !wire.DontRetry(rec.Header()) || rec.Header().Get("Retry-After") != "1" {
			t.Errorf("queued probe dropped at its deadline: %d %v; want the don't-retry signal and Retry-After 1", rec.Code, rec.Header())
		}
		ctx, cancel := context.WithDeadline(context.Background(), time.Now())
		defer cancel()
		_, d := ctl.AcquireProbe(ctx, 2)
		if d.Outcome != admission.Canceled || !d.DontRetry || d.RetryAfter != time.Second {
			t.Errorf("probe whose deadline passed on arrival: %+v; want Canceled, RetryAfterBase (1s), don't retry", d)
		}
	})
}
