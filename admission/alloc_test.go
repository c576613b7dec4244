package admission_test

import (
	"context"
	"net/http"
	"testing"

	"github.com/stormguard/stormguard/admission"
	"github.com/stormguard/stormguard/httpretry"
)

// The admitted path allocates nothing: Acquire and Release, and the HTTP
// middleware around a handler, for originals and for retries within the
// ratio, with and without a hook.
func TestAdmittedPathAllocs(t *testing.T) {
	var decisions int
	hook := func(admission.Decision) { decisions++ }
	tests := []struct {
		name    string
		attempt string // "" for no header
		hook    func(admission.Decision)
	}{
		{"original without header", "", nil},
		{"original with header", "1", nil},
		{"retry", "2", nil},
		{"retry with hook", "3", hook},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctl := newController(t, admission.Config{
				MaxInFlight: 4, MinRetriesPerSecond: 1e9, // the floor admits every retry
				OnDecision: tt.hook,
			})
			attempt := 1
			if tt.attempt != "" {
				attempt, _ = httpretry.ParseAttempt(tt.attempt)
			}
			ctx := context.Background()
			if n := testing.AllocsPerRun(1000, func() {
				p, d := ctl.Acquire(ctx, attempt)
				if d.Refused() {
					t.Fatalf("refused: %+v", d)
				}
				p.Release()
			}); n != 0 {
				t.Errorf("Acquire+Release: %v allocs per run, want 0", n)
			}

			h := ctl.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusNoContent) }))
			r := request(0)
			if tt.attempt != "" {
				r.Header[httpretry.AttemptHeader] = []string{tt.attempt}
			}
			w := &nopWriter{h: http.Header{}}
			before := ctl.Stats().Admitted
			if n := testing.AllocsPerRun(1000, func() { h.ServeHTTP(w, r) }); n != 0 {
				t.Errorf("middleware: %v allocs per request, want 0", n)
			}
			if got := ctl.Stats().Admitted - before; got != 1001 { // AllocsPerRun runs once more to warm up
				t.Errorf("middleware admitted %d of 1001 requests", got)
			}
		})
	}
	if decisions == 0 {
		t.Error("the hook was never called")
	}
}
