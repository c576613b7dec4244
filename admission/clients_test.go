package admission_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stormguard/stormguard/admission"
	"github.com/stormguard/stormguard/wire"
)

// clientHeader names the client in these tests.
const clientHeader = "X-Client"

// byHeader is a Config.Client that reads clientHeader.
func byHeader(r *http.Request) string { return r.Header.Get(clientHeader) }

// sendAs sends one request of client with the given attempt number through
// h and returns the status.
func sendAs(h http.Handler, client string, attempt int) int {
	r := httptest.NewRequest(http.MethodGet, "http://provider.test/pay", nil)
	r.Header.Set(clientHeader, client)
	r.Header.Set(wire.AttemptHeader, strconv.Itoa(attempt))
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, r)
	return rec.Code
}

// TestGreedyClientCannotTakeOthersRetries: every second a well-behaved
// client sends 10 originals, then a greedy client sends 10 originals and
// retries each of them at once, then the well-behaved client sends 1 retry
// (its 10%). With
// Config.Client, every retry of the well-behaved client is admitted for
// 30 s; without it, the greedy client spends the shared allowance and the
// well-behaved client's retries are refused.
func TestGreedyClientCannotTakeOthersRetries(t *testing.T) {
	tests := []struct {
		name   string
		client func(*http.Request) string
	}{
		{"per-client", byHeader},
		{"global only", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				ctl := newController(t, admission.Config{RetryRatio: 0.1, MinRetriesPerSecond: 1, Window: 10 * time.Second, Client: tt.client})
				h := ctl.Wrap(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
				var greedyAdmitted, goodAdmitted, goodRefused int
				for range 30 {
					for range 10 {
						sendAs(h, "good", 1)
					}
					for range 10 {
						sendAs(h, "greedy", 1)
						if sendAs(h, "greedy", 2) == 200 {
							greedyAdmitted++
						}
					}
					if sendAs(h, "good", 2) == 200 {
						goodAdmitted++
					} else {
						goodRefused++
					}
					time.Sleep(time.Second)
				}
				t.Logf("greedy: %d of 300 retries admitted; good: %d of 30 admitted", greedyAdmitted, goodAdmitted)
				if tt.client != nil {
					if goodRefused != 0 {
						t.Errorf("well-behaved client: %d of 30 retries refused, want 0", goodRefused)
					}
					// Its own ratio over a 10 s window: 0.1·100 + 1 = 11 per
					// window, so at most 11 + 3·10 over 30 s (the window
					// slides by slices) and far below 300.
					if greedyAdmitted > 41 {
						t.Errorf("greedy client: %d retries admitted, want <= 41", greedyAdmitted)
					}
				} else if goodRefused == 0 {
					t.Errorf("without Config.Client the greedy client left every retry of the other: want it to take the shared allowance")
				}
			})
		})
	}
}

// TestClientCollisionsWithinGlobalRatio: 5,000 clients in 1,024 buckets
// (so many share one), each sending one original and two retries, get no
// more retries admitted than the global ratio and floor allow.
func TestClientCollisionsWithinGlobalRatio(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const n = 5000
		ctl := newController(t, admission.Config{RetryRatio: 0.1, MinRetriesPerSecond: 1, Window: 10 * time.Second, Client: byHeader})
		h := ctl.Wrap(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
		for i := range n {
			sendAs(h, "c-"+strconv.Itoa(i), 1)
		}
		admitted := 0
		for range 2 {
			for i := range n {
				if sendAs(h, "c-"+strconv.Itoa(i), 2) == 200 {
					admitted++
				}
			}
		}
		bound := int(0.1*n + 1*10) // RetryRatio·originals + floor over the window
		t.Logf("%d clients: %d of %d retries admitted (global bound %d)", n, admitted, 2*n, bound)
		if admitted > bound || admitted == 0 {
			t.Errorf("%d retries admitted, want 1..%d", admitted, bound)
		}
		if s := ctl.Stats(); s.Outcomes[admission.RetryRefused] != uint64(2*n-admitted) {
			t.Errorf("Stats %+v: want %d refused retries", s, 2*n-admitted)
		}
	})
}

// TestClientQuietFloorAndAcquire: a client with no originals may retry
// once per window (the per-client floor), not twice, while the global
// floor has room; Acquire, which has no request, stays global only.
func TestClientQuietFloorAndAcquire(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctl := newController(t, admission.Config{RetryRatio: 0.1, MinRetriesPerSecond: 1, Window: 10 * time.Second, Client: byHeader})
		h := ctl.Wrap(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
		if code := sendAs(h, "quiet", 2); code != 200 {
			t.Errorf("quiet client's first retry: %d, want 200", code)
		}
		if code := sendAs(h, "quiet", 2); code != 503 {
			t.Errorf("quiet client's second retry in the window: %d, want 503", code)
		}
		for i := range 5 { // Acquire: the global floor (10 per window) only
			p, d := ctl.Acquire(context.Background(), 2)
			if d.Outcome != admission.Admitted {
				t.Fatalf("Acquire retry %d: %v, want admitted", i, d.Outcome)
			}
			p.Release()
		}
		time.Sleep(10 * time.Second)
		if code := sendAs(h, "quiet", 2); code != 200 {
			t.Errorf("quiet client's retry a window later: %d, want 200", code)
		}
	})
}

// Wrap's admitted path allocates nothing with Config.Client, for an
// original and a retry of one client.
func TestClientAllocs(t *testing.T) {
	ctl := newController(t, admission.Config{RetryRatio: 1, MinRetriesPerSecond: 1e9, Client: byHeader})
	h := ctl.Wrap(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	orig, retry := request(1), request(2)
	orig.Header[clientHeader] = []string{"tenant-7"}
	retry.Header[clientHeader] = []string{"tenant-7"}
	w := &nopWriter{h: http.Header{}}
	if n := testing.AllocsPerRun(1000, func() {
		h.ServeHTTP(w, orig)
		h.ServeHTTP(w, retry)
	}); n != 0 {
		t.Errorf("an original and a retry with Config.Client: %v allocs, want 0", n)
	}
	if s := ctl.Stats(); s.Outcomes[admission.Admitted] != 2*1001 {
		t.Errorf("%d of %d admitted", s.Outcomes[admission.Admitted], 2*1001)
	}
}
