// Black-box attacks (AREA wire2) on how admission's HTTP middleware reads
// package wire's timeout field and probe mark.

package admission_test

import (
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stormguard/stormguard/admission"
	"github.com/stormguard/stormguard/wire"
)

// Passing probes. DOC (doc.go, step 1): the deadline is the earliest of the
// Stormguard-Timeout-Ms values "(a field sent on several lines, or as a
// comma-separated list, says the earliest of its valid values; malformed
// ones are ignored)"; wire.TimeoutHeader: "0 means the time is up"; a
// caller who has left is dropped at once with 503 and "Stormguard-Retry: no".
func TestAttackWire2TimeoutFieldForms(t *testing.T) {
	for _, tc := range []struct {
		vals    []string
		dropped bool
	}{
		{[]string{"0"}, true},
		{[]string{" \t0\t "}, true},
		{[]string{"000"}, true},
		{[]string{"abc, 0"}, true},
		{[]string{"5000", "0"}, true},
		{[]string{"5000,\t0 "}, true},
		{[]string{"-1"}, false},
		{[]string{"1e3"}, false},
		{[]string{"0x0"}, false},
		{[]string{"5000"}, false},
		{[]string{"99999999999999999999999999"}, false},
		{[]string{""}, false},
		{[]string{","}, false},
	} {
		for _, extra := range []int{0, 6} { // a small and a large header map
			ctl, err := admission.New(admission.Config{MaxInFlight: 4, MaxQueueWait: time.Second})
			if err != nil {
				t.Fatal(err)
			}
			ran := false
			h := ctl.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { ran = true }))
			r := httptest.NewRequest("GET", "/", nil)
			r.Header[wire.TimeoutHeader] = tc.vals
			for i := 0; i < extra; i++ {
				r.Header.Set("X-Pad-"+string(rune('A'+i)), "x")
			}
			w := httptest.NewRecorder()
			h.ServeHTTP(w, r)
			dropped := w.Code == 503 && wire.DontRetry(w.Header()) && !ran
			if dropped != tc.dropped {
				t.Errorf("timeout %q (+%d fields): code %d ran %v header %v; want dropped %v", tc.vals, extra, w.Code, ran, w.Header(), tc.dropped)
			}
		}
	}
}

// Passing probes. DOC (wire.ProbeHeader): "a server reads only the value
// "1", without regard to surrounding spaces and tabs"; doc.go: a probe
// retry skips the ratio onto an idle slot, any other retry beyond the
// ratio is refused.
func TestAttackWire2ProbeMarkForms(t *testing.T) {
	for _, tc := range []struct {
		vals  []string
		probe bool
	}{
		{[]string{"1"}, true},
		{[]string{" \t1 \t"}, true},
		{[]string{"01"}, false},
		{[]string{"true"}, false},
		{[]string{"1.0"}, false},
		{[]string{""}, false},
		{[]string{"\v1"}, false},
	} {
		for _, extra := range []int{0, 6} {
			ctl, err := admission.New(admission.Config{MaxInFlight: 4, MaxQueueWait: time.Second, MinRetriesPerSecond: -1})
			if err != nil {
				t.Fatal(err)
			}
			ran := false
			h := ctl.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { ran = true }))
			r := httptest.NewRequest("GET", "/", nil)
			r.Header[wire.AttemptHeader] = []string{"2"}
			r.Header[wire.ProbeHeader] = tc.vals
			for i := 0; i < extra; i++ {
				r.Header.Set("X-Pad-"+string(rune('A'+i)), "x")
			}
			w := httptest.NewRecorder()
			h.ServeHTTP(w, r)
			if ran != tc.probe {
				t.Errorf("probe %q (+%d fields): ran %v code %d; want ran %v", tc.vals, extra, ran, w.Code, tc.probe)
			}
		}
	}
}
