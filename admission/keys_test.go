package admission_test

import (
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stormguard/stormguard/admission"
	"github.com/stormguard/stormguard/idempotency"
	"github.com/stormguard/stormguard/wire"
)

// TestKeyedRetryWithoutAttemptHeader: a client that sends no attempt
// header (or always says 1) but resends a request with the same
// idempotency key within the window is counted as retrying: its resends
// meet the retry ratio. Distinct keys are originals; a key seen more than
// a window ago, and longer ago than the longest Retry-After the controller
// sends, is new again.
func TestKeyedRetryWithoutAttemptHeader(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctl := newController(t, admission.Config{RetryRatio: -1, MinRetriesPerSecond: -1, Window: 10 * time.Second})
		ran := 0
		h := ctl.Wrap(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { ran++ }))
		send := func(name, key, attempt string) int {
			r := httptest.NewRequest("POST", "http://provider.test/pay", nil)
			r.Header.Set(name, key)
			if attempt != "" {
				r.Header.Set(wire.AttemptHeader, attempt)
			}
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, r)
			return rec.Code
		}
		for i := range 5 {
			if code := send(idempotency.Header, "k-"+strconv.Itoa(i), ""); code != 200 {
				t.Errorf("original %d: %d, want 200", i, code)
			}
		}
		// The same keys again, claiming to be originals, in either field.
		if code := send(idempotency.Header, "k-1", ""); code != 503 {
			t.Errorf("resend of k-1 without attempt header: %d, want 503 (a retry, no allowance)", code)
		}
		if code := send("X-Idempotency-Key", "k-2", "1"); code != 503 {
			t.Errorf("resend of k-2 saying attempt 1: %d, want 503", code)
		}
		if s := ctl.Stats(); s.Originals != 5 || s.Retries != 2 || ran != 5 {
			t.Errorf("Stats %+v, handler ran %d; want 5 originals, 2 retries, 5 runs", s, ran)
		}
		// A client that honours the longest Retry-After (1 s + 10 s of
		// spread, sent as 10 s) and resends is still resending.
		time.Sleep(11 * time.Second)
		if code := send(idempotency.Header, "k-2", ""); code != 503 {
			t.Errorf("resend of k-2 11 s later (after the longest Retry-After): %d, want 503 (a retry)", code)
		}
		time.Sleep(14 * time.Second)
		if code := send(idempotency.Header, "k-1", ""); code != 200 {
			t.Errorf("k-1 25 s later: %d, want 200 (an original again)", code)
		}
	})
}

// The keyed admitted path allocates nothing.
func TestKeyedAllocs(t *testing.T) {
	ctl := newController(t, admission.Config{MinRetriesPerSecond: 1e9})
	h := ctl.Wrap(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	r := request(0)
	r.Header[idempotency.Header] = []string{"k-1"}
	w := &nopWriter{h: http.Header{}}
	if n := testing.AllocsPerRun(1000, func() { h.ServeHTTP(w, r) }); n != 0 {
		t.Errorf("keyed request: %v allocs, want 0", n)
	}
}
