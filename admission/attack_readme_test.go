package admission_test

// Black-box checks of README.md's promises about package admission.

import (
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync/atomic"
	"testing"
	"testing/synctest"

	"github.com/stormguard/stormguard/admission"
	"github.com/stormguard/stormguard/wire"
)

func rdmServe(h http.Handler, kv ...string) *httptest.ResponseRecorder {
	req := httptest.NewRequest("POST", "/pay", nil)
	for i := 0; i+1 < len(kv); i += 2 {
		req.Header.Set(kv[i], kv[i+1])
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec
}

// README: "admission.New(admission.Config{}) and ctl.Wrap(handler) count
// originals and retries by the attempt header (or a repeated
// Idempotency-Key) over a sliding window, refuse retries beyond 10% before
// the handler runs (503 and Stormguard-Retry: no) but let breaker probes
// (Stormguard-Probe) onto idle slots ... and shed with a jittered
// Retry-After."
func TestAttackReadmeAdmissionRetryRatio(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctl, err := admission.New(admission.Config{})
		if err != nil {
			t.Fatal(err)
		}
		var runs atomic.Int32
		h := ctl.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { runs.Add(1) }))
		for i := 0; i < 200; i++ {
			if rec := rdmServe(h); rec.Code != 200 {
				t.Fatalf("original %d: %d", i, rec.Code)
			}
		}
		runs.Store(0)
		admitted, refused := 0, 0
		retryAfters := map[string]bool{}
		for i := 0; i < 100; i++ {
			rec := rdmServe(h, wire.AttemptHeader, "2")
			switch rec.Code {
			case 200:
				admitted++
			case 503:
				refused++
				if !wire.DontRetry(rec.Header()) {
					t.Errorf("refused retry without Stormguard-Retry: no")
				}
				retryAfters[rec.Header().Get("Retry-After")] = true
			default:
				t.Errorf("retry: %d", rec.Code)
			}
		}
		if want := 200/10 + 10; admitted != want || int(runs.Load()) != want {
			t.Errorf("retries admitted %d (handler ran %d), want %d (10%% of 200 + 10)", admitted, runs.Load(), want)
		}
		if refused == 0 {
			t.Errorf("no retry refused")
		}
		// A probe takes an idle slot beyond the ratio.
		rec := rdmServe(h, wire.AttemptHeader, "2", wire.ProbeHeader, "1")
		if rec.Code != 200 {
			t.Errorf("probe on an idle server, ratio spent: %d, want admitted", rec.Code)
		}
		// A repeated Idempotency-Key is a retry whatever the attempt header.
		ctl2, _ := admission.New(admission.Config{MinRetriesPerSecond: -1})
		h2 := ctl2.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
		for i := 0; i < 5; i++ {
			rdmServe(h2, "Idempotency-Key", "k-"+strconv.Itoa(i))
		}
		if rec := rdmServe(h2, "Idempotency-Key", "k-1"); rec.Code != 503 {
			t.Errorf("repeated key with 5 originals and no floor: %d, want refused as a retry", rec.Code)
		}
		// The caller left: dropped before the handler.
		runs.Store(0)
		if rec := rdmServe(h, wire.TimeoutHeader, "0"); rec.Code != 503 || runs.Load() != 0 {
			t.Errorf("Stormguard-Timeout-Ms: 0: %d, handler ran %d; want 503 before the handler", rec.Code, runs.Load())
		}
	})
}
