package admission_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stormguard/stormguard/admission"
	"github.com/stormguard/stormguard/wire"
)

// atkLAFarCtx: a request context whose deadline lies in year 9999 (beyond
// what a time.Duration from now can hold), not done.
type atkLAFarCtx struct{ context.Context }

func (atkLAFarCtx) Deadline() (time.Time, bool) {
	return time.Date(9999, 1, 1, 0, 0, 0, 0, time.UTC), true
}

// Package doc, adaptive limit: a request that ran longer than the
// reference (LatencyCeiling/2) but under the ceiling, for a caller who has
// not left, "shrinks the limit by a fifth of its excess, limit·(1 - (1 -
// ref/latency)/5)"; a drop (caller gone) cuts it by a tenth. A caller
// deadline in year 9999 must read as "not left": 100 → 93 (shrink), not
// 90 (cut). The hint clients read ("Stormguard-Capacity") is the adaptive
// limit in force, one decimal value.
func TestAttackLimitadmAdaptiveFarDeadlineIsNotGone(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctl, err := admission.New(admission.Config{MaxInFlight: 100, MaxQueue: -1, LatencyCeiling: 100 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		release := make(chan struct{})
		h := ctl.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Header.Get("Slow") != "" {
				time.Sleep(75 * time.Millisecond)
				return
			}
			<-release
		}))
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		r := httptest.NewRequest("GET", "/", nil).WithContext(atkLAFarCtx{ctx})
		r.Header.Set("Slow", "1")
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, r)
		if rec.Code != http.StatusOK {
			t.Fatalf("slow request: %d", rec.Code)
		}
		// Fill the limit in force and read the hint of the next refusal.
		var wg sync.WaitGroup
		for range 100 {
			wg.Go(func() { h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("GET", "/", nil)) })
		}
		synctest.Wait()
		rec = httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest("GET", "/", nil))
		close(release)
		wg.Wait()
		if rec.Code != http.StatusServiceUnavailable {
			t.Fatalf("code %d, want 503", rec.Code)
		}
		if got := rec.Header()[wire.CapacityHeader]; len(got) != 1 || got[0] != "93" {
			t.Errorf("capacity hint %q after one 75 ms request for a year-9999 caller, want [93] (shrink; 90 would be a cut for a caller taken as gone)", got)
		}
	})
}
