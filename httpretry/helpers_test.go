package httpretry_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stormguard/stormguard/backoff"
	"github.com/stormguard/stormguard/httpretry"
)

// fakeClock is a retry.Clock whose Sleep records the delay and moves the
// fake time forward at once, so nothing sleeps for real. Safe for
// concurrent use.
type fakeClock struct {
	mu     sync.Mutex
	now    time.Time
	sleeps []time.Duration
}

// newFakeClock starts at a whole second, so that HTTP-dates (whole
// seconds) computed from it are exact.
func newFakeClock() *fakeClock {
	return &fakeClock{now: time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)}
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Sleep(ctx context.Context, d time.Duration) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.sleeps = append(c.sleeps, d)
	c.now = c.now.Add(d)
	return nil
}

func (c *fakeClock) Sleeps() []time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.sleeps)
}

// blockingClock sleeps until the context ends, and reports each sleep
// that starts on started.
type blockingClock struct {
	started chan struct{}
}

func (c *blockingClock) Now() time.Time { return time.Now() }

func (c *blockingClock) Sleep(ctx context.Context, d time.Duration) error {
	c.started <- struct{}{}
	<-ctx.Done()
	return ctx.Err()
}

// smallBackoff is full jitter with a 1 ms base: every backoff delay is
// below 2 s, so a recorded sleep of 2 s can only come from Retry-After.
func smallBackoff(t *testing.T) *backoff.Backoff {
	t.Helper()
	b, err := backoff.New(backoff.Config{Strategy: backoff.FullJitter, Base: time.Millisecond, Cap: 100 * time.Millisecond, Rand: func() float64 { return 0.5 }})
	if err != nil {
		t.Fatalf("backoff.New: %v", err)
	}
	return b
}

// newTransport builds a Transport over base with a fake clock and a small
// backoff (both overridable by opts).
func newTransport(t *testing.T, base http.RoundTripper, opts ...httpretry.Option) (*httpretry.Transport, *fakeClock) {
	t.Helper()
	clock := newFakeClock()
	all := append([]httpretry.Option{httpretry.WithClock(clock), httpretry.WithBackoff(smallBackoff(t))}, opts...)
	tr, err := httpretry.NewTransport(base, all...)
	if err != nil {
		t.Fatalf("NewTransport: %v", err)
	}
	return tr, clock
}

// observed is what a test server saw: one entry per request.
type observed struct {
	mu       sync.Mutex
	attempts []string // AttemptHeader values
	keys     []string // Idempotency-Key values
	bodies   []string
	methods  []string
}

func (o *observed) record(r *http.Request) int {
	b, _ := io.ReadAll(r.Body)
	o.mu.Lock()
	defer o.mu.Unlock()
	o.attempts = append(o.attempts, r.Header.Get(httpretry.AttemptHeader))
	o.keys = append(o.keys, r.Header.Get("Idempotency-Key"))
	o.bodies = append(o.bodies, string(b))
	o.methods = append(o.methods, r.Method)
	return len(o.attempts)
}

func (o *observed) count() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return len(o.attempts)
}

func (o *observed) snapshot() (attempts, keys, bodies []string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return slices.Clone(o.attempts), slices.Clone(o.keys), slices.Clone(o.bodies)
}

// serve starts a loopback server whose handler gets the request number
// (1 for the first) after the request was recorded.
func serve(t *testing.T, h func(w http.ResponseWriter, r *http.Request, n int)) (*httptest.Server, *observed) {
	t.Helper()
	o := &observed{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h(w, r, o.record(r))
	}))
	t.Cleanup(srv.Close)
	return srv, o
}

// wantAttemptHeaders returns "1".."n".
func wantAttemptHeaders(n int) []string {
	s := make([]string, n)
	for i := range s {
		s[i] = string(rune('1' + i))
	}
	return s
}

func newRequest(t *testing.T, ctx context.Context, method, url string, body io.Reader) *http.Request {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, method, url, body)
	if err != nil {
		t.Fatalf("NewRequest(%s %s): %v", method, url, err)
	}
	return req
}

// readClose reads and closes resp's body.
func readClose(t *testing.T, resp *http.Response) string {
	t.Helper()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Errorf("reading the response body: %v", err)
	}
	if err := resp.Body.Close(); err != nil {
		t.Errorf("closing the response body: %v", err)
	}
	return string(b)
}
