package breaker_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stormguard/stormguard/breaker"
)

var t0 = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

// half pins the jitter at its middle: every open period is exactly OpenFor.
func half() float64 { return 0.5 }

// testConfig is the configuration most tests start from: 30 s open periods
// and 5 probes (round numbers the scenarios were written for), no jitter.
func testConfig() breaker.Config {
	return breaker.Config{OpenFor: 30 * time.Second, Probes: 5, Rand: half}
}

// fakeClock is a clock tests move by hand; safe for concurrent use.
type fakeClock struct{ ns atomic.Int64 }

func newClock() *fakeClock {
	c := &fakeClock{}
	c.ns.Store(t0.UnixNano())
	return c
}

func (c *fakeClock) Now() time.Time          { return time.Unix(0, c.ns.Load()).UTC() }
func (c *fakeClock) Advance(d time.Duration) { c.ns.Add(int64(d)) }

// recorder collects state changes; safe for concurrent use.
type recorder struct {
	mu     sync.Mutex
	events []string
}

func (r *recorder) add(from, to breaker.State) {
	r.mu.Lock()
	r.events = append(r.events, from.String()+">"+to.String())
	r.mu.Unlock()
}

func (r *recorder) get() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.events)
}

// harness is a breaker on a fake clock that records its state changes.
type harness struct {
	b   *breaker.Breaker
	clk *fakeClock
	rec *recorder
}

func newHarness(t *testing.T, edit func(c *breaker.Config)) *harness {
	t.Helper()
	h := &harness{clk: newClock(), rec: &recorder{}}
	c := testConfig()
	c.Now = h.clk.Now
	c.OnStateChange = h.rec.add
	if edit != nil {
		edit(&c)
	}
	b, err := breaker.New(c)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	h.b = b
	return h
}

// calls makes n calls through Allow and Done with the given outcome; every
// call must be allowed.
func (h *harness) calls(t *testing.T, n int, success bool) {
	t.Helper()
	for i := range n {
		p, err := h.b.Allow()
		if err != nil {
			t.Fatalf("call %d of %d: Allow() = %v, want a permit", i+1, n, err)
		}
		h.b.Done(p, success)
	}
}

// rejected checks that Allow rejects with an *OpenError in state st with
// the given Wait.
func rejected(t *testing.T, b *breaker.Breaker, st breaker.State, wait time.Duration) {
	t.Helper()
	p, err := b.Allow()
	var oe *breaker.OpenError
	if !errors.As(err, &oe) {
		t.Fatalf("Allow() = %+v, %v; want an *OpenError", p, err)
	}
	if oe.State != st || oe.Wait != wait || oe.RetryAfter() != wait {
		t.Fatalf("Allow() = %#v (RetryAfter %v), want State %v Wait %v", oe, oe.RetryAfter(), st, wait)
	}
	if !errors.Is(err, breaker.ErrOpen) {
		t.Fatalf("errors.Is(%v, ErrOpen) = false, want true", err)
	}
	if p != (breaker.Permit{}) {
		t.Fatalf("Allow() rejected but returned permit %+v, want the zero Permit", p)
	}
}

func TestStateString(t *testing.T) {
	tests := []struct {
		s    breaker.State
		want string
	}{
		{breaker.Closed, "closed"},
		{breaker.HalfOpen, "half-open"},
		{breaker.Open, "open"},
		{breaker.State(7), "State(7)"},
	}
	for _, tt := range tests {
		if got := tt.s.String(); got != tt.want {
			t.Errorf("State(%d).String() = %q, want %q", uint8(tt.s), got, tt.want)
		}
	}
	var zero breaker.State
	if zero != breaker.Closed {
		t.Errorf("zero State = %v, want closed", zero)
	}
}

func TestZeroConfigTakesDefaults(t *testing.T) {
	b, err := breaker.New(breaker.Config{})
	if err != nil {
		t.Fatalf("New(Config{}) = %v", err)
	}
	c := b.Config()
	if c.FailureRatio != 0.5 || c.Window != 10*time.Second || c.Buckets != 10 ||
		c.MinCalls != 20 || c.OpenFor != time.Second || c.MaxOpenFor != 0 ||
		c.Probes != 3 || c.MaxWaiters != 10_000 || c.ReleaseRate != 0 ||
		c.IsFailure != nil || c.OnStateChange != nil || c.Now != nil || c.Rand != nil || c.Shared != nil {
		t.Fatalf("New(Config{}).Config() = %+v, want the defaults", c)
	}
	if s := b.State(); s != breaker.Closed {
		t.Fatalf("new breaker State() = %v, want closed", s)
	}
	b, err = breaker.New(breaker.Config{OpenFor: 5 * time.Second})
	if err != nil || b.Config().OpenFor != 5*time.Second || b.Config().Probes != 3 {
		t.Fatalf("New(Config{OpenFor: 5s}) = %+v, %v; want OpenFor 5s and the other defaults", b.Config(), err)
	}
}

func TestNewInvalid(t *testing.T) {
	tests := []struct {
		name string
		edit func(c *breaker.Config)
	}{
		{"negative ratio", func(c *breaker.Config) { c.FailureRatio = -0.5 }},
		{"ratio above 1", func(c *breaker.Config) { c.FailureRatio = 1.01 }},
		{"NaN ratio", func(c *breaker.Config) { c.FailureRatio = math.NaN() }},
		{"negative window", func(c *breaker.Config) { c.Window = -time.Second }},
		{"negative buckets", func(c *breaker.Config) { c.Buckets = -1 }},
		{"too many buckets", func(c *breaker.Config) { c.Buckets = 3600 + 1; c.Window = time.Hour * 2 }},
		{"window not a multiple of buckets", func(c *breaker.Config) { c.Window = 10*time.Second + 3 }},
		{"bucket too short", func(c *breaker.Config) { c.Window = time.Millisecond; c.Buckets = 10 }},
		{"negative min calls", func(c *breaker.Config) { c.MinCalls = -1 }},
		{"negative open for", func(c *breaker.Config) { c.OpenFor = -time.Second }},
		{"max open for below open for", func(c *breaker.Config) { c.MaxOpenFor = c.OpenFor - 1 }},
		{"negative max open for", func(c *breaker.Config) { c.MaxOpenFor = -1 }},
		{"negative probes", func(c *breaker.Config) { c.Probes = -2 }},
		{"NaN release rate", func(c *breaker.Config) { c.ReleaseRate = math.NaN() }},
		{"negative slow call", func(c *breaker.Config) { c.SlowCall = -time.Millisecond }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := testConfig()
			tt.edit(&c)
			b, err := breaker.New(c)
			if err == nil || !strings.HasPrefix(err.Error(), "breaker: invalid config: ") || b != nil {
				t.Fatalf("New(%+v) = %v, %v; want nil, an invalid-config error", c, b, err)
			}
		})
	}
}

// step is one action of a transition scenario.
type step struct {
	op    string        // succeed, fail, advance, reject, probe, finish, cancel
	n     int           // calls for succeed/fail/probe/finish/cancel
	ok    bool          // outcome for finish
	d     time.Duration // for advance; the expected Wait for reject
	state breaker.State // expected state after the step, as State reports it
}

func TestTransitions(t *testing.T) {
	const w = 10 * time.Second
	grow := func(c *breaker.Config) { c.MaxOpenFor = 100 * time.Second }
	tests := []struct {
		name   string
		edit   func(c *breaker.Config)
		steps  []step
		events []string
	}{
		{
			name: "not before the minimum",
			steps: []step{
				{op: "fail", n: 19, state: breaker.Closed},
				{op: "fail", n: 1, state: breaker.Open},
				{op: "reject", d: 30 * time.Second, state: breaker.Open},
			},
			events: []string{"closed>open"},
		},
		{
			name: "at the threshold, not below it",
			steps: []step{
				{op: "succeed", n: 10, state: breaker.Closed},
				{op: "fail", n: 9, state: breaker.Closed},
				{op: "succeed", n: 1, state: breaker.Closed}, // 9/20 = 45%
				{op: "fail", n: 1, state: breaker.Closed},    // 10/21 = 47.6%
				{op: "fail", n: 1, state: breaker.Open},      // 11/22 = 50%
			},
			events: []string{"closed>open"},
		},
		{
			// Only a failure trips the breaker: a success that brings the
			// window to MinCalls does not, the next failure does.
			name: "the failure after the minimum trips",
			steps: []step{
				{op: "fail", n: 10, state: breaker.Closed},
				{op: "succeed", n: 10, state: breaker.Closed}, // 10/20 = 50%, but no failure yet
				{op: "fail", n: 1, state: breaker.Open},       // 11/21
			},
			events: []string{"closed>open"},
		},
		{
			name: "below the threshold stays closed",
			steps: []step{
				{op: "succeed", n: 51, state: breaker.Closed},
				{op: "fail", n: 49, state: breaker.Closed},
			},
		},
		{
			name: "failures expire with their bucket",
			steps: []step{
				{op: "fail", n: 10, state: breaker.Closed}, // bucket 0
				{op: "advance", d: w, state: breaker.Closed},
				{op: "fail", n: 10, state: breaker.Closed}, // bucket 10: bucket 0 has left the window
			},
		},
		{
			name: "failures count until the last nanosecond of the window",
			steps: []step{
				{op: "fail", n: 10, state: breaker.Closed},
				{op: "advance", d: w - 1, state: breaker.Closed},
				{op: "fail", n: 10, state: breaker.Open},
			},
			events: []string{"closed>open"},
		},
		{
			name: "open rejects until the open period is over",
			steps: []step{
				{op: "fail", n: 20, state: breaker.Open},
				{op: "reject", d: 30 * time.Second, state: breaker.Open},
				{op: "advance", d: 30*time.Second - 1, state: breaker.Open},
				{op: "reject", d: 1, state: breaker.Open},
				{op: "advance", d: 1, state: breaker.HalfOpen},
				{op: "probe", n: 1, state: breaker.HalfOpen},
			},
			events: []string{"closed>open", "open>half-open"},
		},
		{
			name: "half-open admits exactly Probes probes and closes when they succeed",
			steps: []step{
				{op: "fail", n: 20, state: breaker.Open},
				{op: "advance", d: 30 * time.Second, state: breaker.HalfOpen},
				{op: "probe", n: 5, state: breaker.HalfOpen},
				{op: "reject", state: breaker.HalfOpen},
				{op: "finish", n: 4, ok: true, state: breaker.HalfOpen},
				{op: "reject", state: breaker.HalfOpen}, // finished probes do not free slots
				{op: "finish", n: 1, ok: true, state: breaker.Closed},
				{op: "fail", n: 19, state: breaker.Closed}, // the window starts empty
				{op: "fail", n: 1, state: breaker.Open},
			},
			events: []string{"closed>open", "open>half-open", "half-open>closed", "closed>open"},
		},
		{
			name: "closing empties the window even when the open period is shorter than it",
			edit: func(c *breaker.Config) { c.OpenFor = time.Second },
			steps: []step{
				{op: "fail", n: 20, state: breaker.Open},
				{op: "advance", d: time.Second, state: breaker.HalfOpen},
				{op: "probe", n: 5, state: breaker.HalfOpen},
				{op: "finish", n: 5, ok: true, state: breaker.Closed},
				{op: "fail", n: 19, state: breaker.Closed}, // the 20 failures of 1 s ago are gone
				{op: "fail", n: 1, state: breaker.Open},
			},
			events: []string{"closed>open", "open>half-open", "half-open>closed", "closed>open"},
		},
		{
			name: "a failed probe reopens at once",
			steps: []step{
				{op: "fail", n: 20, state: breaker.Open},
				{op: "advance", d: 30 * time.Second, state: breaker.HalfOpen},
				{op: "probe", n: 3, state: breaker.HalfOpen},
				{op: "finish", n: 1, ok: true, state: breaker.HalfOpen},
				{op: "finish", n: 1, ok: false, state: breaker.Open},
				{op: "finish", n: 1, ok: true, state: breaker.Open}, // stale probe: ignored
				{op: "reject", d: 30 * time.Second, state: breaker.Open},
			},
			events: []string{"closed>open", "open>half-open", "half-open>open"},
		},
		{
			name: "a cancelled probe frees its slot",
			edit: func(c *breaker.Config) { c.Probes = 2 },
			steps: []step{
				{op: "fail", n: 20, state: breaker.Open},
				{op: "advance", d: 30 * time.Second, state: breaker.HalfOpen},
				{op: "probe", n: 2, state: breaker.HalfOpen},
				{op: "reject", state: breaker.HalfOpen},
				{op: "cancel", n: 1, state: breaker.HalfOpen},
				{op: "probe", n: 1, state: breaker.HalfOpen},
				{op: "finish", n: 2, ok: true, state: breaker.Closed},
			},
			events: []string{"closed>open", "open>half-open", "half-open>closed"},
		},
		{
			name: "the open period doubles on consecutive trips up to MaxOpenFor",
			edit: grow,
			steps: []step{
				{op: "fail", n: 20, state: breaker.Open},
				{op: "reject", d: 30 * time.Second, state: breaker.Open},
				{op: "advance", d: 30 * time.Second, state: breaker.HalfOpen},
				{op: "probe", n: 1, state: breaker.HalfOpen},
				{op: "finish", n: 1, ok: false, state: breaker.Open},
				{op: "reject", d: 60 * time.Second, state: breaker.Open},
				{op: "advance", d: 60 * time.Second, state: breaker.HalfOpen},
				{op: "probe", n: 1, state: breaker.HalfOpen},
				{op: "finish", n: 1, ok: false, state: breaker.Open},
				{op: "reject", d: 100 * time.Second, state: breaker.Open}, // 120 s capped
				{op: "advance", d: 100 * time.Second, state: breaker.HalfOpen},
				{op: "probe", n: 1, state: breaker.HalfOpen},
				{op: "finish", n: 1, ok: false, state: breaker.Open},
				{op: "reject", d: 100 * time.Second, state: breaker.Open},
				{op: "advance", d: 100 * time.Second, state: breaker.HalfOpen},
				{op: "probe", n: 5, state: breaker.HalfOpen},
				{op: "finish", n: 5, ok: true, state: breaker.Closed},
				{op: "fail", n: 20, state: breaker.Open},
				{op: "reject", d: 30 * time.Second, state: breaker.Open}, // closing reset the growth
			},
			events: []string{
				"closed>open", "open>half-open", "half-open>open", "open>half-open", "half-open>open",
				"open>half-open", "half-open>open", "open>half-open", "half-open>closed", "closed>open",
			},
		},
		{
			name: "no growth without MaxOpenFor",
			steps: []step{
				{op: "fail", n: 20, state: breaker.Open},
				{op: "advance", d: 30 * time.Second, state: breaker.HalfOpen},
				{op: "probe", n: 1, state: breaker.HalfOpen},
				{op: "finish", n: 1, ok: false, state: breaker.Open},
				{op: "reject", d: 30 * time.Second, state: breaker.Open},
			},
			events: []string{"closed>open", "open>half-open", "half-open>open"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHarness(t, tt.edit)
			var probes []breaker.Permit
			for i, s := range tt.steps {
				switch s.op {
				case "succeed", "fail":
					h.calls(t, s.n, s.op == "succeed")
				case "advance":
					h.clk.Advance(s.d)
				case "reject":
					rejected(t, h.b, s.state, s.d)
				case "probe":
					for range s.n {
						p, err := h.b.Allow()
						if err != nil || !p.Probe() {
							t.Fatalf("step %d: Allow() = %+v, %v; want a probe permit", i, p, err)
						}
						probes = append(probes, p)
					}
				case "finish":
					for _, p := range probes[:s.n] {
						h.b.Done(p, s.ok)
					}
					probes = probes[s.n:]
				case "cancel":
					for _, p := range probes[:s.n] {
						h.b.Cancel(p)
					}
					probes = probes[s.n:]
				default:
					t.Fatalf("step %d: unknown op %q", i, s.op)
				}
				if got := h.b.Snapshot().State; got != s.state {
					t.Fatalf("step %d (%s %d): state %v, want %v", i, s.op, s.n, got, s.state)
				}
			}
			if got := h.rec.get(); !slices.Equal(got, tt.events) {
				t.Fatalf("state changes %q, want %q", got, tt.events)
			}
		})
	}
}

// TestOpenRejectsWithoutCalling checks that Execute does not call the
// function while the breaker is open.
func TestOpenRejectsWithoutCalling(t *testing.T) {
	h := newHarness(t, func(c *breaker.Config) { c.MinCalls = 1 })
	boom := errors.New("boom")
	calls := 0
	fn := func() error { calls++; return boom }
	if err := h.b.Execute(fn); err != boom || calls != 1 {
		t.Fatalf("Execute = %v after %d calls, want boom after 1", err, calls)
	}
	h.clk.Advance(10 * time.Second)
	for range 3 {
		err := h.b.Execute(fn)
		var oe *breaker.OpenError
		if !errors.As(err, &oe) || oe.Wait != 20*time.Second {
			t.Fatalf("Execute on an open breaker = %v, want *OpenError with Wait 20s", err)
		}
	}
	if calls != 1 {
		t.Fatalf("the function ran %d times, want 1: an open breaker must not call it", calls)
	}
}

func TestOpenError(t *testing.T) {
	tests := []struct {
		e        *breaker.OpenError
		msg      string
		retryAft time.Duration
	}{
		{&breaker.OpenError{State: breaker.Open, Wait: 12500 * time.Millisecond}, "breaker: open, half-open in 12.5s", 12500 * time.Millisecond},
		{&breaker.OpenError{State: breaker.HalfOpen}, "breaker: half-open, all probes taken", 0},
	}
	for _, tt := range tests {
		if got := tt.e.Error(); got != tt.msg {
			t.Errorf("Error() = %q, want %q", got, tt.msg)
		}
		if got := tt.e.RetryAfter(); got != tt.retryAft {
			t.Errorf("%q: RetryAfter() = %v, want %v", tt.msg, got, tt.retryAft)
		}
		wrapped := fmt.Errorf("payments: %w", tt.e)
		if !errors.Is(wrapped, breaker.ErrOpen) {
			t.Errorf("%q: errors.Is(wrapped, ErrOpen) = false", tt.msg)
		}
	}
}

// TestStalePermits checks the generation rule: outcomes of permits issued
// in an older generation change nothing.
func TestStalePermits(t *testing.T) {
	t.Run("closed permit after the breaker tripped", func(t *testing.T) {
		h := newHarness(t, nil)
		old, _ := h.b.Allow()
		h.calls(t, 20, false)
		before := h.b.Snapshot()
		for range 10 {
			h.b.Done(old, true)
			h.b.Done(old, false)
		}
		if after := h.b.Snapshot(); after != before {
			t.Fatalf("Snapshot after stale Done = %+v, want %+v", after, before)
		}
	})
	t.Run("closed permit from before a full open/half-open/closed cycle", func(t *testing.T) {
		h := newHarness(t, nil)
		old := make([]breaker.Permit, 40)
		for i := range old {
			old[i], _ = h.b.Allow()
		}
		h.calls(t, 20, false) // trip
		h.clk.Advance(30 * time.Second)
		probes := make([]breaker.Permit, 5)
		for i := range probes {
			probes[i], _ = h.b.Allow()
		}
		for _, p := range probes {
			h.b.Done(p, true)
		}
		if s := h.b.State(); s != breaker.Closed {
			t.Fatalf("State() = %v after 5 good probes, want closed", s)
		}
		for _, p := range old { // 40 failures of the first closed generation
			h.b.Done(p, false)
		}
		if s := h.b.Snapshot(); s.State != breaker.Closed || s.Calls != 0 || s.Failures != 0 {
			t.Fatalf("Snapshot after 40 stale failures = %+v, want closed with an empty window", s)
		}
	})
	t.Run("probe of an earlier half-open generation", func(t *testing.T) {
		h := newHarness(t, func(c *breaker.Config) { c.Probes = 2 })
		h.calls(t, 20, false)
		h.clk.Advance(30 * time.Second)
		p1, _ := h.b.Allow()
		p2, _ := h.b.Allow()
		h.b.Done(p1, false) // reopen
		h.clk.Advance(30 * time.Second)
		p3, err := h.b.Allow()
		if err != nil || !p3.Probe() {
			t.Fatalf("Allow() in the second half-open = %+v, %v; want a probe", p3, err)
		}
		h.b.Done(p2, true) // stale: must not count towards closing
		h.b.Cancel(p2)     // stale: must not free a slot
		h.b.Done(p3, true)
		if s := h.b.State(); s != breaker.HalfOpen {
			t.Fatalf("State() after 1 of 2 probes succeeded (and a stale one) = %v, want half-open (the stale one ignored)", s)
		}
		h.b.Done(p2, false) // a stale failure must not reopen either
		if s := h.b.State(); s != breaker.HalfOpen {
			t.Fatalf("State() after a stale failed probe = %v, want half-open", s)
		}
		// One probe slot is left: the stale Cancel did not free another.
		p4, err := h.b.Allow()
		if err != nil || !p4.Probe() {
			t.Fatalf("Allow() for the second probe = %+v, %v; want a probe", p4, err)
		}
		rejected(t, h.b, breaker.HalfOpen, 0)
		h.b.Done(p4, true)
		if s := h.b.State(); s != breaker.Closed {
			t.Fatalf("State() after 2 of 2 probes succeeded = %v, want closed", s)
		}
	})
	t.Run("zero permit", func(t *testing.T) {
		h := newHarness(t, func(c *breaker.Config) { c.MinCalls = 1 })
		for range 10 {
			h.b.Done(breaker.Permit{}, false)
			h.b.Cancel(breaker.Permit{})
		}
		if s := h.b.Snapshot(); s.State != breaker.Closed || s.Calls != 0 {
			t.Fatalf("Snapshot after zero-permit Done = %+v, want closed, no calls", s)
		}
	})
}

// TestCallbacksOutsideLock: a callback that uses the breaker, and even
// causes another state change, must neither deadlock nor run nested.
func TestCallbacksOutsideLock(t *testing.T) {
	clk := newClock()
	var b *breaker.Breaker
	var depth atomic.Int32
	var got []string
	var seen []breaker.State
	c := testConfig()
	c.MinCalls = 1
	c.Now = clk.Now
	c.OnStateChange = func(from, to breaker.State) {
		if depth.Add(1) != 1 {
			t.Errorf("callback %v>%v runs inside another callback", from, to)
		}
		defer depth.Add(-1)
		got = append(got, from.String()+">"+to.String())
		seen = append(seen, b.State()) // must not deadlock
		_ = b.Snapshot()
		if from == breaker.Closed && to == breaker.Open {
			// Causes open>half-open from inside this callback; it must
			// be delivered after this callback returns.
			clk.Advance(c.OpenFor)
			if _, err := b.Allow(); err != nil {
				t.Errorf("Allow() in callback after the open period = %v, want a probe", err)
			}
		}
	}
	var err error
	b, err = breaker.New(c)
	if err != nil {
		t.Fatal(err)
	}
	p, _ := b.Allow()
	b.Done(p, false)
	want := []string{"closed>open", "open>half-open"}
	if !slices.Equal(got, want) {
		t.Fatalf("callbacks %q, want %q", got, want)
	}
	if wantSeen := []breaker.State{breaker.Open, breaker.HalfOpen}; !slices.Equal(seen, wantSeen) {
		t.Fatalf("State() inside callbacks = %v, want %v", seen, wantSeen)
	}
}

// TestCallbackPanic: a panicking callback does not wedge later ones.
func TestCallbackPanic(t *testing.T) {
	clk := newClock()
	var got []string
	c := testConfig()
	c.MinCalls, c.Now = 1, clk.Now
	c.OnStateChange = func(from, to breaker.State) {
		got = append(got, from.String()+">"+to.String())
		if to == breaker.Open {
			panic("callback")
		}
	}
	b, err := breaker.New(c)
	if err != nil {
		t.Fatal(err)
	}
	func() {
		defer func() {
			if r := recover(); r != "callback" {
				t.Errorf("recover() = %v, want the callback's panic", r)
			}
		}()
		_ = b.Execute(func() error { return errors.New("x") })
	}()
	clk.Advance(c.OpenFor)
	if s := b.State(); s != breaker.HalfOpen {
		t.Fatalf("State() = %v, want half-open", s)
	}
	if want := []string{"closed>open", "open>half-open"}; !slices.Equal(got, want) {
		t.Fatalf("callbacks %q, want %q", got, want)
	}
}

func TestExecute(t *testing.T) {
	notFound := errors.New("not found")
	boom := errors.New("boom")
	h := newHarness(t, func(c *breaker.Config) {
		c.MinCalls = 4
		c.IsFailure = func(err error) bool { return err != nil && !errors.Is(err, notFound) }
	})
	results := []error{nil, notFound, boom, notFound}
	for _, want := range results {
		if err := h.b.Execute(func() error { return want }); err != want {
			t.Fatalf("Execute(fn returning %v) = %v", want, err)
		}
	}
	if s := h.b.Snapshot(); s.Calls != 4 || s.Failures != 1 || s.State != breaker.Closed {
		t.Fatalf("Snapshot = %+v, want 4 calls, 1 failure (not-found is not a failure), closed", s)
	}
	if err := h.b.Execute(func() error { return boom }); err != boom {
		t.Fatalf("Execute = %v, want boom", err)
	}
	if s := h.b.Snapshot(); s.Calls != 5 || s.Failures != 2 || s.State != breaker.Closed {
		t.Fatalf("Snapshot = %+v, want 5 calls, 2 failures (40%% < 50%%), closed", s)
	}
	for range 2 {
		_ = h.b.Execute(func() error { return boom })
	}
	if s := h.b.State(); s != breaker.Open { // 4 of 7
		t.Fatalf("State() after 4 failures in 7 = %v, want open", s)
	}
}

// TestPanicIsFailure: a panic in the closure counts as a failure and is
// re-raised with its original value.
func TestPanicIsFailure(t *testing.T) {
	tests := []struct {
		name string
		run  func(b *breaker.Breaker)
	}{
		{"Execute", func(b *breaker.Breaker) { _ = b.Execute(func() error { panic("kaboom") }) }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHarness(t, func(c *breaker.Config) { c.MinCalls = 1 })
			func() {
				defer func() {
					if r := recover(); r != "kaboom" {
						t.Fatalf("recover() = %v, want kaboom", r)
					}
				}()
				tt.run(h.b)
				t.Fatal("the panic was swallowed")
			}()
			if s := h.b.State(); s != breaker.Open {
				t.Fatalf("State() after a panic with MinCalls 1 = %v, want open (the panic is a failure)", s)
			}
		})
	}
	t.Run("probe", func(t *testing.T) {
		h := newHarness(t, func(c *breaker.Config) { c.MinCalls = 1 })
		h.calls(t, 1, false)
		h.clk.Advance(30 * time.Second)
		func() {
			defer func() { _ = recover() }()
			_ = h.b.Execute(func() error { panic("probe") })
		}()
		if got, want := h.rec.get(), []string{"closed>open", "open>half-open", "half-open>open"}; !slices.Equal(got, want) {
			t.Fatalf("state changes after a panicking probe = %q, want %q", got, want)
		}
	})
}

// TestConcurrentClosed: outcomes recorded from many goroutines are all
// counted, exactly.
func TestConcurrentClosed(t *testing.T) {
	const goroutines, perG = 8, 2000
	h := newHarness(t, func(c *breaker.Config) { c.MinCalls = 1 << 30 })
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Go(func() {
			for i := range perG {
				fail := (i+g)%4 == 0
				_ = h.b.Execute(func() error {
					if fail {
						return errors.New("x")
					}
					return nil
				})
			}
		})
	}
	wg.Wait()
	s := h.b.Snapshot()
	if s.State != breaker.Closed || s.Calls != goroutines*perG || s.Failures != goroutines*perG/4 {
		t.Fatalf("Snapshot = %+v, want closed, %d calls, %d failures", s, goroutines*perG, goroutines*perG/4)
	}
}

// TestConcurrentProbes: however many goroutines race for them, a half-open
// breaker admits exactly Probes probes.
func TestConcurrentProbes(t *testing.T) {
	for round := range 20 {
		h := newHarness(t, func(c *breaker.Config) { c.MinCalls = 1; c.Probes = 3 })
		h.calls(t, 1, false)
		h.clk.Advance(30 * time.Second)
		var admitted, tooMany atomic.Int32
		var wg sync.WaitGroup
		start := make(chan struct{})
		for range 16 {
			wg.Go(func() {
				<-start
				for range 10 {
					var oe *breaker.OpenError
					if _, err := h.b.Allow(); err == nil {
						admitted.Add(1)
					} else if errors.As(err, &oe) && oe.State == breaker.HalfOpen {
						tooMany.Add(1)
					} else {
						t.Errorf("Allow() = %v, want a probe or a half-open rejection", err)
					}
				}
			})
		}
		close(start)
		wg.Wait()
		if admitted.Load() != 3 || tooMany.Load() != 160-3 {
			t.Fatalf("round %d: %d probes admitted, %d rejected; want 3 and 157", round, admitted.Load(), tooMany.Load())
		}
		if got := h.rec.get(); !slices.Equal(got, []string{"closed>open", "open>half-open"}) {
			t.Fatalf("round %d: state changes %q, want one open>half-open", round, got)
		}
	}
}

// TestConcurrentStress runs random outcomes from many goroutines while the
// clock moves, and checks that the state changes delivered form a valid
// path, one generation each.
func TestConcurrentStress(t *testing.T) {
	h := newHarness(t, func(c *breaker.Config) {
		c.MinCalls = 5
		c.Window = 100 * time.Millisecond
		c.OpenFor = 20 * time.Millisecond
		c.Probes = 2
	})
	valid := map[string]bool{"closed>open": true, "open>half-open": true, "half-open>closed": true, "half-open>open": true}
	stop := make(chan struct{})
	var watcher sync.WaitGroup
	watcher.Go(func() { // State() may move Open to HalfOpen concurrently
		for {
			select {
			case <-stop:
				return
			default:
				_ = h.b.State()
			}
		}
	})
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 3000 {
				h.clk.Advance(time.Millisecond) // fake time moves with the calls
				// Alternate bad spells (80% failures) and good ones (10%).
				fail := (i+g)%10 == 0
				if (i/300)%2 == 1 {
					fail = (i+g)%5 != 0
				}
				if i%2 == 0 {
					_ = h.b.Execute(func() error {
						if fail {
							return errors.New("x")
						}
						return nil
					})
					continue
				}
				if p, err := h.b.Allow(); err == nil {
					if i%11 == 0 {
						h.b.Cancel(p)
					} else {
						h.b.Done(p, !fail)
					}
				}
			}
		})
	}
	wg.Wait()
	close(stop)
	watcher.Wait()
	events := h.rec.get()
	if len(events) < 4 {
		t.Fatalf("only %d state changes (%+v): the stress test does not exercise the breaker", len(events), h.b.Snapshot())
	}
	t.Logf("%d state changes", len(events))
	prev := "closed"
	for i, e := range events {
		from, to, _ := cut(e)
		if !valid[e] || from != prev {
			t.Fatalf("state change %d is %q after %q: not a valid path (%q)", i, e, prev, events)
		}
		prev = to
	}
	if s := h.b.Snapshot(); s.State.String() != prev {
		t.Fatalf("Snapshot = %+v after %d changes ending in %s", s, len(events), prev)
	}
}

func cut(e string) (from, to string, ok bool) {
	i := slices.Index([]byte(e), '>')
	if i < 0 {
		return e, "", false
	}
	return e[:i], e[i+1:], true
}

func TestZeroAllocsClosed(t *testing.T) {
	h := newHarness(t, func(c *breaker.Config) { c.MinCalls = 1 << 30 })
	ok := func() error { return nil }
	boom := errors.New("boom")
	fail := func() error { return boom }
	tests := []struct {
		name string
		fn   func()
	}{
		{"Allow+Done(true)", func() { p, _ := h.b.Allow(); h.b.Done(p, true) }},
		{"Allow+Done(false)", func() { p, _ := h.b.Allow(); h.b.Done(p, false) }},
		{"Execute ok", func() { _ = h.b.Execute(ok) }},
		{"Execute failing", func() { _ = h.b.Execute(fail) }},
		{"Wait", func() { p, _ := h.b.Wait(context.Background(), time.Second); h.b.Done(p, true) }},
		{"State", func() { _ = h.b.State() }},
		{"moving clock", func() { h.clk.Advance(time.Second); p, _ := h.b.Allow(); h.b.Done(p, true) }},
	}
	for _, tt := range tests {
		if n := testing.AllocsPerRun(1000, tt.fn); n != 0 {
			t.Errorf("%s: %v allocs per run, want 0", tt.name, n)
		}
	}
	if s := h.b.State(); s != breaker.Closed {
		t.Fatalf("State() = %v, want closed throughout", s)
	}
}

// TestRealClockDefault checks that a nil Now means time.Now, inside a
// synctest bubble where time is fake and sleeping costs nothing.
func TestRealClockDefault(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := testConfig()
		c.MinCalls = 1
		b, err := breaker.New(c)
		if err != nil {
			t.Fatal(err)
		}
		_ = b.Execute(func() error { return errors.New("boom") })
		time.Sleep(10 * time.Second)
		_, err = b.Allow()
		var oe *breaker.OpenError
		if !errors.As(err, &oe) || oe.Wait != 20*time.Second {
			t.Fatalf("Allow() 10 s after tripping = %v, want *OpenError with Wait 20s", err)
		}
		time.Sleep(20 * time.Second)
		if s := b.State(); s != breaker.HalfOpen {
			t.Fatalf("State() 30 s after tripping = %v, want half-open", s)
		}
	})
}
