package retry_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stormguard/stormguard/backoff"
	"github.com/stormguard/stormguard/observe"
	"github.com/stormguard/stormguard/retry"
)

// statusErr is a small protocol error of the tests' own (the loop knows no
// status codes): it declares itself transient through Temporary for 408,
// 429, 502, 503 and 504, and carries a server hint through RetryAfter.
type statusErr struct {
	Code  int
	After time.Duration
}

func (e *statusErr) Error() string {
	if e.After > 0 {
		return fmt.Sprintf("HTTP %d (retry after %v)", e.Code, e.After)
	}
	return fmt.Sprintf("HTTP %d", e.Code)
}

func (e *statusErr) Temporary() bool {
	switch e.Code {
	case 408, 429, 502, 503, 504:
		return true
	}
	return false
}

func (e *statusErr) RetryAfter() time.Duration { return e.After }

var (
	err503 = &statusErr{Code: 503}
	err404 = &statusErr{Code: 404}
)

// mustNew builds a policy or fails the test.
func mustNew(t testing.TB, opts ...retry.Option) *retry.Policy {
	t.Helper()
	p, err := retry.New(opts...)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return p
}

// mustBackoff builds a backoff with U pinned at u, or fails the test.
func mustBackoff(t testing.TB, s backoff.Strategy, base, cap time.Duration, u float64) *backoff.Backoff {
	t.Helper()
	b, err := backoff.New(backoff.Config{Strategy: s, Base: base, Cap: cap, Rand: func() float64 { return u }})
	if err != nil {
		t.Fatalf("backoff.New: %v", err)
	}
	return b
}

// lockedRand returns a seeded Mulberry32 made safe for concurrent use, for
// reproducible draws from many goroutines.
func lockedRand(seed uint32) func() float64 {
	var mu sync.Mutex
	m := backoff.NewMulberry32(seed)
	return func() float64 {
		mu.Lock()
		defer mu.Unlock()
		return m.Float64()
	}
}

// asError extracts the *retry.Error from err or fails the test.
func asError(t *testing.T, err error) *retry.Error {
	t.Helper()
	var re *retry.Error
	if !errors.As(err, &re) {
		t.Fatalf("error %v (%T) is not a *retry.Error", err, err)
	}
	return re
}

// checkStop asserts a give-up's reason and attempt count, and that the
// reason is reachable with errors.Is.
func checkStop(t *testing.T, err error, reason retry.Reason, attempts int) *retry.Error {
	t.Helper()
	re := asError(t, err)
	if re.Reason != reason || re.Attempts != attempts {
		t.Fatalf("Do = %v: reason %v after %d attempts, want %v after %d", err, re.Reason, re.Attempts, reason, attempts)
	}
	if !errors.Is(err, reason) {
		t.Errorf("errors.Is(%v, %v) = false", err, reason)
	}
	return re
}

// script returns an op that returns errs[attempt-1] (nil past the end) and
// counts its calls.
func script(calls *int, errs ...error) func(context.Context, int) error {
	return func(ctx context.Context, attempt int) error {
		*calls++
		if attempt <= len(errs) {
			return errs[attempt-1]
		}
		return nil
	}
}

// recordingClock is a fake retry.Clock: Sleep records the delay and moves
// the fake time forward at once, so nothing sleeps for real. It is safe for
// concurrent use.
type recordingClock struct {
	mu     sync.Mutex
	now    time.Time
	sleeps []time.Duration
}

func newRecordingClock() *recordingClock {
	return &recordingClock{now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
}

func (c *recordingClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *recordingClock) Sleep(ctx context.Context, d time.Duration) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.sleeps = append(c.sleeps, d)
	c.now = c.now.Add(d)
	return nil
}

// Advance moves the fake time forward by d, as an operation that takes d
// would.
func (c *recordingClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// Sleeps returns a copy of the recorded sleeps.
func (c *recordingClock) Sleeps() []time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]time.Duration(nil), c.sleeps...)
}

// instantClock sleeps for no time at all: a retry costs only the loop.
type instantClock struct{}

func (instantClock) Now() time.Time { return time.Time{} }
func (instantClock) Sleep(ctx context.Context, d time.Duration) error {
	return ctx.Err()
}

// events collects the events of an observer, safe for concurrent use.
type events struct {
	mu   sync.Mutex
	list []observe.Event
}

// observer returns an observe.Func that appends to e.
func (e *events) observer() observe.Func {
	return func(ctx context.Context, ev observe.Event) {
		e.mu.Lock()
		defer e.mu.Unlock()
		e.list = append(e.list, ev)
	}
}

// take returns the events so far and forgets them.
func (e *events) take() []observe.Event {
	e.mu.Lock()
	defer e.mu.Unlock()
	l := e.list
	e.list = nil
	return l
}
