package admission_test

import (
	"context"
	"net/http"
	"testing"

	"github.com/stormguard/stormguard/admission"
	"github.com/stormguard/stormguard/observe"
	"github.com/stormguard/stormguard/wire"
)

// The admitted path allocates nothing: Acquire and Release, and the HTTP
// middleware around a handler, for originals and for retries within the
// ratio, with and without an observer.
func TestAdmittedPathAllocs(t *testing.T) {
	events := new(counter)
	tests := []struct {
		name     string
		attempt  string // "" for no header
		observer observe.Observer
	}{
		{"original without header", "", nil},
		{"original with header", "1", nil},
		{"retry", "2", nil},
		{"original with observer", "", events},
		{"retry with observer", "3", events},
		{"probe with a timeout", "4", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctl := newController(t, admission.Config{
				MaxInFlight: 4, MinRetriesPerSecond: 1e9, // the floor admits every retry
				Name: "pay", Observer: tt.observer,
			})
			attempt := 1
			if tt.attempt != "" {
				attempt, _ = wire.ParseAttempt(tt.attempt)
			}
			ctx := context.Background()
			if n := testing.AllocsPerRun(1000, func() {
				p, d := ctl.Acquire(ctx, attempt)
				if d.Outcome != admission.Admitted {
					t.Fatalf("refused: %+v", d)
				}
				p.Release()
			}); n != 0 {
				t.Errorf("Acquire+Release: %v allocs per run, want 0", n)
			}

			h := ctl.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusNoContent) }))
			r := request(0)
			if tt.attempt != "" {
				r.Header[wire.AttemptHeader] = []string{tt.attempt}
			}
			if tt.name == "probe with a timeout" {
				r.Header[wire.ProbeHeader] = []string{"1"}
				r.Header[wire.TimeoutHeader] = []string{"30000"}
				r.Header["X-Envoy-Expected-Rq-Timeout-Ms"] = []string{"20000"}
			}
			w := &nopWriter{h: http.Header{}}
			before := ctl.Stats().Outcomes[admission.Admitted]
			if n := testing.AllocsPerRun(1000, func() { h.ServeHTTP(w, r) }); n != 0 {
				t.Errorf("middleware: %v allocs per request, want 0", n)
			}
			if got := ctl.Stats().Outcomes[admission.Admitted] - before; got != 1001 { // AllocsPerRun runs once more to warm up
				t.Errorf("middleware admitted %d of 1001 requests", got)
			}
		})
	}
	// Two observed cases, each 1001 Acquire+Release and 1001 requests.
	if n := events.n.Load(); n != 2*2*1001 {
		t.Errorf("the observer heard %d events, want %d (one per admission)", n, 2*2*1001)
	}
}
