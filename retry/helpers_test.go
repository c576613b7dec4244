package retry_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
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

// lockedRand returns a seeded generator made safe for concurrent use, for
// reproducible draws from many goroutines.
func lockedRand(seed uint64) func() float64 {
	var mu sync.Mutex
	r := rand.New(rand.NewPCG(seed, 0))
	return func() float64 {
		mu.Lock()
		defer mu.Unlock()
		return r.Float64()
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

// timeline is an observer that records the loop's sleeps as they happen on
// the clock of the synctest bubble the test runs in: the time from the end
// of a failed attempt to the start of the next (a wait behind an open
// breaker included), or to the give-up when that took time (a sleep whose
// next attempt the breaker rejected). It passes every event on to next, if
// set. It is safe for concurrent use, but records one call at a time.
type timeline struct {
	next observe.Observer

	mu      sync.Mutex
	lastEnd time.Time // of the last failed attempt of the call under way
	sleeps  []time.Duration
}

func newTimeline() *timeline { return &timeline{} }

func (tl *timeline) Observe(ctx context.Context, e observe.Event) {
	now := time.Now()
	tl.mu.Lock()
	switch e.Kind {
	case observe.AttemptEnd:
		tl.lastEnd = now
		if e.Err == nil {
			tl.lastEnd = time.Time{}
		}
	case observe.AttemptStart, observe.GiveUp:
		if !tl.lastEnd.IsZero() {
			if gap := now.Sub(tl.lastEnd); e.Kind == observe.AttemptStart || gap > 0 {
				tl.sleeps = append(tl.sleeps, gap)
			}
		}
		tl.lastEnd = time.Time{}
	}
	tl.mu.Unlock()
	if tl.next != nil {
		tl.next.Observe(ctx, e)
	}
}

// Sleeps returns a copy of the recorded sleeps.
func (tl *timeline) Sleeps() []time.Duration {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	return append([]time.Duration(nil), tl.sleeps...)
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
