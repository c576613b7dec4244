package httpretry_test

import (
	"context"
	"errors"
	"net/http"
	"sync/atomic"
	"testing"

	"github.com/stormguard/stormguard/httpretry"
	"github.com/stormguard/stormguard/retry"
)

// countingLimiter lets allow attempts go and refuses the rest; it counts
// its waits. Safe for concurrent use.
type countingLimiter struct {
	allow atomic.Int64
	waits atomic.Int64
}

var errLimited = errors.New("limiter: no token")

func (l *countingLimiter) Wait(ctx context.Context) error {
	l.waits.Add(1)
	if l.allow.Add(-1) < 0 {
		return errLimited
	}
	return ctx.Err()
}

// TestRateLimitHook: retry.WithRateLimit given through WithRetry makes
// every attempt of every host wait for the one limiter; a refusal ends the
// request with the limiter's error, nothing sent.
func TestRateLimitHook(t *testing.T) {
	srv, o := serveMem(t, func(w http.ResponseWriter, r *http.Request, n int) {
		if n < 3 {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
	})
	lim := &countingLimiter{}
	lim.allow.Store(4)
	tr, _ := newTransport(t, srv.Client().Transport, httpretry.WithRetry(retry.WithRateLimit(lim)))
	resp, err := getClose(t, tr, srv.URL)
	if err != nil || resp.StatusCode != http.StatusOK || lim.waits.Load() != 3 || o.count() != 3 {
		t.Fatalf("RoundTrip = %v, %v after %d waits and %d sends; want 200 after 3 and 3", resp, err, lim.waits.Load(), o.count())
	}
	if _, err := getClose(t, tr, srv.URL); err != nil { // the 4th token
		t.Fatal(err)
	}
	resp, err = getClose(t, tr, "http://other.test/")
	if resp != nil || !errors.Is(err, errLimited) || !errors.Is(err, retry.Deadline) {
		t.Fatalf("RoundTrip with no token = %v, %v; want the limiter's refusal", resp, err)
	}
	if o.count() != 4 {
		t.Errorf("%d sends, want 4 (nothing sent without a token)", o.count())
	}
}
