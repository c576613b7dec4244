package sim_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"math"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stormguard/stormguard/cmd/stormguard/internal/sim"
)

// contention runs c and fails the test on error.
func contention(t *testing.T, c sim.ContentionConfig) *sim.ContentionResult {
	t.Helper()
	r, err := sim.Contention(c)
	if err != nil {
		t.Fatalf("Contention(%+v) = %v", c, err)
	}
	return r
}

// point returns the point of strategy s at n clients.
func point(t *testing.T, r *sim.ContentionResult, s sim.ContentionStrategy, n int) sim.ContentionPoint {
	t.Helper()
	for _, series := range r.Series {
		if series.Strategy != s {
			continue
		}
		for _, p := range series.Points {
			if p.Clients == n {
				return p
			}
		}
	}
	t.Fatalf("Contention result has no point for %v at N=%d", s, n)
	return sim.ContentionPoint{}
}

// With no network variance every round is a dead heat: all clients read
// the same version, the first write wins, the rest conflict. That makes the
// outcome exact: N + (N-1) + ... + 1 calls, and each round costs four hops
// plus the sleep before it.
func TestContentionExactWithoutVariance(t *testing.T) {
	t.Parallel()
	tests := []struct {
		strategy       sim.ContentionStrategy
		clients        int
		wantCalls      float64
		wantCompletion time.Duration
	}{
		{sim.ContentionNone, 1, 1, 40 * time.Millisecond},
		{sim.ContentionNone, 10, 55, 400 * time.Millisecond},
		// Sleeps 10 ms then 20 ms (base 5 ms, exp(n) = 5·2^n).
		{sim.ContentionExponential, 3, 6, (40 + 10 + 40 + 20 + 40) * time.Millisecond},
	}
	for _, tt := range tests {
		c := sim.DefaultContentionConfig()
		c.DelayStdDev = 0
		c.Runs = 3
		c.Clients = []int{tt.clients}
		c.Strategies = []sim.ContentionStrategy{tt.strategy}
		p := point(t, contention(t, c), tt.strategy, tt.clients)
		if p.Calls != tt.wantCalls || p.Completion != tt.wantCompletion {
			t.Errorf("Contention(%v, N=%d, no variance) = %v calls in %v, want %v calls in %v",
				tt.strategy, tt.clients, p.Calls, p.Completion, tt.wantCalls, tt.wantCompletion)
		}
	}
}

// The shape the AWS post published: full jitter does clearly less work
// than exponential backoff without jitter, equal jitter takes longer than
// full jitter, and with no backoff the work grows about as N².
func TestContentionMatchesPublishedShape(t *testing.T) {
	t.Parallel()
	c := sim.DefaultContentionConfig()
	c.Clients = []int{50, 100}
	c.Runs = 30
	r := contention(t, c)

	full := point(t, r, sim.ContentionFull, 100)
	expo := point(t, r, sim.ContentionExponential, 100)
	equal := point(t, r, sim.ContentionEqual, 100)
	if full.Calls > 0.6*expo.Calls {
		t.Errorf("Contention(N=100): full jitter %.1f calls, want clearly fewer than exponential's %.1f (<= 60%%)", full.Calls, expo.Calls)
	}
	if equal.Completion <= full.Completion {
		t.Errorf("Contention(N=100): equal jitter completes in %v, want longer than full jitter's %v", equal.Completion, full.Completion)
	}
	// Work exponent between N=50 and N=100 with no backoff.
	n50, n100 := point(t, r, sim.ContentionNone, 50), point(t, r, sim.ContentionNone, 100)
	if k := math.Log2(n100.Calls / n50.Calls); k < 1.6 || k > 2.2 {
		t.Errorf("Contention(none): calls %.1f at N=50, %.1f at N=100: exponent %.2f, want about 2", n50.Calls, n100.Calls, k)
	}
	for _, s := range r.Series {
		for _, p := range s.Points {
			if p.Calls < float64(p.Clients) {
				t.Errorf("Contention(%v, N=%d) = %.1f calls, want at least one per client", s.Strategy, p.Clients, p.Calls)
			}
			if p.Completion < 40*time.Millisecond {
				t.Errorf("Contention(%v, N=%d) completes in %v, want at least four hops", s.Strategy, p.Clients, p.Completion)
			}
		}
	}
}

func TestContentionDeterministic(t *testing.T) {
	t.Parallel()
	c := sim.DefaultContentionConfig()
	c.Clients = []int{10, 40}
	c.Runs = 5
	a, b := contention(t, c), contention(t, c)
	if !reflect.DeepEqual(a, b) {
		t.Errorf("Contention(seed %d) differs between two runs:\n%+v\n%+v", c.Seed, a, b)
	}
	c.Seed++
	if d := contention(t, c); reflect.DeepEqual(a.Series, d.Series) {
		t.Errorf("Contention(seed %d) = Contention(seed %d); the seed has no effect", c.Seed, c.Seed-1)
	}
}

func TestContentionDefaults(t *testing.T) {
	t.Parallel()
	c := sim.DefaultContentionConfig()
	c.Clients, c.Strategies, c.Runs = nil, nil, 1
	r := contention(t, c)
	if got, want := r.Config.Clients, sim.DefaultContentionConfig().Clients; !reflect.DeepEqual(got, want) {
		t.Errorf("Contention(no clients).Config.Clients = %v, want %v", got, want)
	}
	if got, want := len(r.Series), len(sim.ContentionStrategies()); got != want {
		t.Errorf("Contention(no strategies) has %d series, want %d", got, want)
	}
}

func TestContentionInvalidConfig(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		modify func(*sim.ContentionConfig)
	}{
		{"zero runs", func(c *sim.ContentionConfig) { c.Runs = 0 }},
		{"too many runs", func(c *sim.ContentionConfig) { c.Runs = sim.MaxContentionRuns + 1 }},
		{"zero clients", func(c *sim.ContentionConfig) { c.Clients = []int{10, 0} }},
		{"too many clients", func(c *sim.ContentionConfig) { c.Clients = []int{sim.MaxContentionClients + 1} }},
		{"negative delay", func(c *sim.ContentionConfig) { c.DelayMean = -time.Millisecond }},
		{"negative stddev", func(c *sim.ContentionConfig) { c.DelayStdDev = -time.Millisecond }},
		{"negative base", func(c *sim.ContentionConfig) { c.Base = -time.Millisecond }},
		{"too much work", func(c *sim.ContentionConfig) {
			c.Clients, c.Runs = []int{sim.MaxContentionClients}, sim.MaxContentionRuns
		}},
		{"just over the work limit", func(c *sim.ContentionConfig) {
			// 1000² x 20 runs x 5 strategies = MaxContentionWork; one more client tips it.
			c.Clients, c.Runs = []int{1000, 1}, sim.MaxContentionWork/(1000*1000*5)
		}},
		{"one N listed many times", func(c *sim.ContentionConfig) {
			c.Clients, c.Runs = make([]int, 1001), 100
			for i := range c.Clients {
				c.Clients[i] = 100
			}
		}},
		{"cap below base", func(c *sim.ContentionConfig) { c.Cap = c.Base / 2 }},
		{"unknown strategy", func(c *sim.ContentionConfig) { c.Strategies = []sim.ContentionStrategy{99} }},
	}
	for _, tt := range tests {
		c := sim.DefaultContentionConfig()
		tt.modify(&c)
		r, err := sim.Contention(c)
		if !errors.Is(err, sim.ErrInvalidConfig) || r != nil {
			t.Errorf("Contention(%s) = %v, %v; want nil, error wrapping ErrInvalidConfig", tt.name, r, err)
		}
	}
}

func TestContentionStrategyText(t *testing.T) {
	t.Parallel()
	for _, s := range sim.ContentionStrategies() {
		b, err := json.Marshal(s)
		if err != nil {
			t.Fatalf("json.Marshal(%v) = %v", s, err)
		}
		var got sim.ContentionStrategy
		if err := json.Unmarshal(b, &got); err != nil || got != s {
			t.Errorf("json.Unmarshal(%s) = %v, %v; want %v", b, got, err, s)
		}
	}
	if _, err := sim.ParseContentionStrategy("jitter"); !errors.Is(err, sim.ErrInvalidConfig) {
		t.Errorf("ParseContentionStrategy(jitter) = %v, want ErrInvalidConfig", err)
	}
	if _, err := sim.ContentionStrategy(9).MarshalText(); err == nil {
		t.Errorf("ContentionStrategy(9).MarshalText() = nil error, want one")
	}
	if got, want := sim.ContentionStrategy(9).String(), "ContentionStrategy(9)"; got != want {
		t.Errorf("ContentionStrategy(9).String() = %q, want %q", got, want)
	}
}

func TestContentionWriteText(t *testing.T) {
	t.Parallel()
	c := sim.DefaultContentionConfig()
	c.Clients = []int{10, 20}
	c.Runs = 2
	var buf bytes.Buffer
	if err := contention(t, c).WriteText(&buf); err != nil {
		t.Fatalf("WriteText = %v", err)
	}
	out := buf.String()
	for _, want := range []string{"write calls", "completion time", "decorrelated", "\n      20 "} {
		if !strings.Contains(out, want) {
			t.Errorf("WriteText output lacks %q:\n%s", want, out)
		}
	}
	if got, want := strings.Count(out, "\n"), 1+2*(3+2); got != want {
		t.Errorf("WriteText wrote %d lines, want %d:\n%s", got, want, out)
	}
}

// BenchmarkContention100Runs measures one AWS point for every strategy:
// 100 runs at N = 100.
func BenchmarkContention100Runs(b *testing.B) {
	c := sim.DefaultContentionConfig()
	c.Clients = []int{100}
	for b.Loop() {
		if _, err := sim.Contention(c); err != nil {
			b.Fatal(err)
		}
	}
}

// Contention may be called from several goroutines at once, and computes
// its points on several goroutines itself: the result must not depend on
// either.
func TestContentionConcurrentCalls(t *testing.T) {
	t.Parallel()
	c := sim.DefaultContentionConfig()
	c.Clients = []int{5, 10, 15}
	c.Runs = 3
	want := contention(t, c)
	got := make([]*sim.ContentionResult, 4)
	errs := make([]error, len(got))
	var wg sync.WaitGroup
	for i := range got {
		wg.Go(func() { got[i], errs[i] = sim.Contention(c) })
	}
	wg.Wait()
	for i := range got {
		if errs[i] != nil || !reflect.DeepEqual(got[i], want) {
			t.Errorf("concurrent Contention #%d = %+v, %v; want %+v", i, got[i], errs[i], want)
		}
	}
}
