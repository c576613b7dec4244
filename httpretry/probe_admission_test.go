package httpretry_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stormguard/stormguard/admission"
	"github.com/stormguard/stormguard/backoff"
	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/httpretry"
	"github.com/stormguard/stormguard/retry"
	"github.com/stormguard/stormguard/wire"
)

// inMemory is a RoundTripper that serves requests with a handler in the
// same goroutine (inside a synctest bubble, where sockets would keep the
// bubble from idling). strip removes the probe mark first, as a client
// that does not send it would.
type inMemory struct {
	h     http.Handler
	strip bool
}

func (m inMemory) RoundTrip(r *http.Request) (*http.Response, error) {
	if m.strip && len(r.Header[wire.ProbeHeader]) > 0 {
		r = r.Clone(r.Context())
		delete(r.Header, wire.ProbeHeader)
	}
	rec := httptest.NewRecorder()
	m.h.ServeHTTP(rec, r)
	resp := rec.Result()
	resp.Request = r
	return resp, nil
}

// probeRecovery runs the scenario of TestProbesPassAdmission and returns
// how long after the provider healed the client saw its first success,
// how many calls failed and how many probes admission refused.
func probeRecovery(t *testing.T, strip bool) (recovered time.Duration, failed int64, refused uint64) {
	const heal = 2500 * time.Millisecond
	var down atomic.Bool
	down.Store(true)
	ctl, err := admission.New(admission.Config{Rand: func() float64 { return 0.3 }}) // Retry-After 4 s
	if err != nil {
		t.Fatal(err)
	}
	provider := ctl.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if down.Load() {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusOK)
	}))
	// Other clients retried during the outage: the window's retry
	// allowance (the 10 s floor, 10 retries) is spent.
	for range 12 {
		rec := httptest.NewRecorder()
		req := httptest.NewRequest("GET", "http://provider.test/", nil)
		req.Header.Set(wire.AttemptHeader, "2")
		provider.ServeHTTP(rec, req)
	}
	tr, err := httpretry.NewTransport(inMemory{h: provider, strip: strip}, httpretry.WithBudget(nil),
		httpretry.WithBreaker(&breaker.Config{MinCalls: 1, Probes: 1, OpenFor: time.Second, Rand: func() float64 { return 0.5 }}))
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	go func() {
		time.Sleep(heal)
		down.Store(false)
	}()
	var mu sync.Mutex
	first := time.Duration(-1)
	var wg sync.WaitGroup
	// Calls with a 20 s deadline, one every 200 ms for 8 s.
	for i := range 40 {
		wg.Go(func() {
			time.Sleep(time.Duration(i) * 200 * time.Millisecond)
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			req, _ := http.NewRequestWithContext(ctx, "GET", "http://provider.test/", nil)
			resp, err := tr.RoundTrip(req)
			if err != nil || resp.StatusCode != 200 {
				atomic.AddInt64(&failed, 1)
				if resp != nil {
					_ = resp.Body.Close()
				}
				return
			}
			_ = resp.Body.Close()
			mu.Lock()
			if at := time.Since(start); first < 0 || at < first {
				first = at
			}
			mu.Unlock()
		})
	}
	wg.Wait()
	return first - heal, failed, ctl.Stats().Outcomes[admission.RetryRefused] - 2 // the 2 foreign retries beyond the floor
}

// TestProbesPassAdmission: a client waits behind its open breaker for a
// provider whose admission has spent its retry allowance on other
// clients' retries. The breaker's probes carry attempt numbers of 2 and
// more; marked as probes (wire.ProbeHeader) they pass the ratio, and the
// client sees the provider back at the first probe round after it healed.
// Without the mark (a client that does not send it), admission refuses
// retries beyond the ratio with the don't-retry signal and a 4 s
// Retry-After: calls fail (1 or 2 in this scenario), each on such a
// refusal; recovery is seen at the same probe round as with the mark.
func TestProbesPassAdmission(t *testing.T) {
	var marked, unmarked time.Duration
	var failedMarked, failedUnmarked int64
	synctest.Test(t, func(t *testing.T) {
		var refused uint64
		marked, failedMarked, refused = probeRecovery(t, false)
		if refused != 0 {
			t.Errorf("marked probes: admission refused %d probes as retries, want 0", refused)
		}
	})
	synctest.Test(t, func(t *testing.T) {
		unmarked, failedUnmarked, _ = probeRecovery(t, true)
	})
	t.Logf("recovery seen %v after the provider healed with the probe mark (%d calls failed), %v without it (%d failed)",
		marked, failedMarked, unmarked, failedUnmarked)
	if marked < 0 || marked > time.Second {
		t.Errorf("with the probe mark, recovery seen %v after the provider healed, want within the 1 s probe round", marked)
	}
	if failedMarked != 0 {
		t.Errorf("with the probe mark, %d calls failed, want 0 (each had a 20 s deadline)", failedMarked)
	}
	if unmarked >= 0 && unmarked <= marked && failedUnmarked == 0 {
		t.Errorf("without the mark: recovery %v, %d failed; the scenario does not show the defect", unmarked, failedUnmarked)
	}
}

// headerBase records a header field of every request and answers from a
// script of statuses (the last one repeats).
type headerBase struct {
	name   string
	codes  []int
	got    []string
	sleeps []time.Duration // time spent before answering, per request
}

func (b *headerBase) RoundTrip(r *http.Request) (*http.Response, error) {
	i := len(b.got)
	b.got = append(b.got, r.Header.Get(b.name))
	if i < len(b.sleeps) {
		time.Sleep(b.sleeps[i])
	}
	code := b.codes[min(i, len(b.codes)-1)]
	return &http.Response{StatusCode: code, Header: http.Header{}, Body: http.NoBody, Request: r}, nil
}

// TestTimeoutHeader: every attempt that has a deadline carries the time it
// has left, in whole milliseconds (the earlier of the attempt timeout and
// the call's deadline), except the first attempt of a plain request, which
// goes unchanged; an attempt without a deadline carries none.
func TestTimeoutHeader(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		for _, tt := range []struct {
			name     string
			opts     []httpretry.Option
			deadline time.Duration // 0: none
			want     []string
		}{
			{"no deadline", nil, 0, []string{"", ""}},
			{"call deadline (a plain first attempt goes unchanged)", nil, 5 * time.Second, []string{"", "4100"}},
			{"call deadline, a POST keyed by the transport", []httpretry.Option{httpretry.WithAutoIdempotencyKey()}, 5 * time.Second, []string{"5000", "4100"}},
			{"attempt timeout", []httpretry.Option{httpretry.WithAttemptTimeout(time.Second)}, 0, []string{"1000", "1000"}},
			{"both, deadline first", []httpretry.Option{httpretry.WithAttemptTimeout(3 * time.Second)}, 3500 * time.Millisecond, []string{"3000", "2600"}},
		} {
			bo, err := backoff.New(backoff.Config{Strategy: backoff.NoJitter, Base: 500 * time.Millisecond, Cap: 500 * time.Millisecond})
			if err != nil {
				t.Fatal(err)
			}
			base := &headerBase{name: wire.TimeoutHeader, codes: []int{503, 200}, sleeps: []time.Duration{400 * time.Millisecond}}
			opts := append([]httpretry.Option{httpretry.WithBudget(nil), httpretry.WithBreaker(nil),
				httpretry.WithRetry(retry.WithBackoff(bo))}, tt.opts...)
			tr, err := httpretry.NewTransport(base, opts...)
			if err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			if tt.deadline > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, tt.deadline)
				defer cancel()
			}
			method := "GET"
			if strings.HasPrefix(tt.name, "call deadline, a POST") {
				method = "POST"
			}
			req, _ := http.NewRequestWithContext(ctx, method, "http://provider.test/", nil)
			resp, err := tr.RoundTrip(req)
			if err != nil || resp.StatusCode != 200 {
				t.Fatalf("%s: RoundTrip = %v, %v", tt.name, resp, err)
			}
			_ = resp.Body.Close()
			if !slices.Equal(base.got, tt.want) {
				t.Errorf("%s: %s values %q, want %q", tt.name, wire.TimeoutHeader, base.got, tt.want)
			}
		}
	})
}
