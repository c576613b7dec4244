package sim_test

import (
	"bytes"
	"errors"
	"math"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stormguard/stormguard/backoff"
	"github.com/stormguard/stormguard/cmd/stormguard/internal/sim"
)

// outage runs c and fails the test on error.
func outage(t *testing.T, c sim.OutageConfig) *sim.OutageResult {
	t.Helper()
	r, err := sim.Outage(c)
	if err != nil {
		t.Fatalf("Outage(%+v) = %v", c, err)
	}
	return r
}

// policy returns the result of the policy named name.
func policy(t *testing.T, r *sim.OutageResult, name string) sim.OutagePolicyResult {
	t.Helper()
	for _, p := range r.Policies {
		if p.Policy.Name == name {
			return p
		}
	}
	t.Fatalf("Outage result has no policy %q", name)
	return sim.OutagePolicyResult{}
}

// policies returns the default policies with these names.
func policies(t *testing.T, names ...string) []sim.OutagePolicy {
	t.Helper()
	var ps []sim.OutagePolicy
	for _, name := range names {
		for _, p := range sim.DefaultOutagePolicies() {
			if p.Name == name {
				ps = append(ps, p)
			}
		}
	}
	if len(ps) != len(names) {
		t.Fatalf("DefaultOutagePolicies() lacks some of %v", names)
	}
	return ps
}

const (
	naive   = "fixed-1s"
	guarded = "full+budget+breaker+retry-after"
)

// checkInvariants checks what must hold for every policy of any run.
func checkInvariants(t *testing.T, r *sim.OutageResult) {
	t.Helper()
	offered := r.Policies[0].Offered
	for _, p := range r.Policies {
		name := p.Policy.Name
		if p.Offered != offered {
			t.Errorf("Outage %s: offered %d, want %d like the first policy (same arrivals)", name, p.Offered, offered)
		}
		var load, ok int
		for w := range p.Load {
			load += p.Load[w]
			ok += p.Successes[w]
			if p.Successes[w] > p.Load[w] {
				t.Errorf("Outage %s: window %d has %d successes of %d attempts", name, w, p.Successes[w], p.Load[w])
			}
		}
		if load != p.Attempts {
			t.Errorf("Outage %s: load windows sum to %d, want attempts %d", name, load, p.Attempts)
		}
		if ok < p.Succeeded || p.Succeeded > p.Offered {
			t.Errorf("Outage %s: %d successful attempts, %d succeeded requests of %d offered", name, ok, p.Succeeded, p.Offered)
		}
		if p.Retries > p.Attempts || p.Attempts > p.Offered*max(p.Policy.Attempts, 1) {
			t.Errorf("Outage %s: %d attempts with %d retries for %d requests of at most %d attempts",
				name, p.Attempts, p.Retries, p.Offered, p.Policy.Attempts)
		}
		if p.RecoverAfter < 0 || (!p.Recovered && p.RecoverAfter != 0) {
			t.Errorf("Outage %s: recovered %v after %v", name, p.Recovered, p.RecoverAfter)
		}
	}
}

const (
	patient = "full+budget+breaker+retry-after+wait"
	fleet   = "fleet+retry-after+wait"
)

// Patience helps only once the breaker is open: a fleet whose breaker has
// a 2 s window trips sooner in a total outage and serves no fewer of the
// outage's requests than one with the default 10 s window, whose failures
// must outnumber the successes still in its window (how many more depends
// on how the breaker reads its window); the difference is the calls the
// budget refused in between.
func TestOutageBreakerWindow(t *testing.T) {
	t.Parallel()
	run := func(window time.Duration) sim.OutagePolicyResult {
		c := sim.DefaultLowVolumeOutageConfig()
		c.Capacity, c.Horizon = 2400, 30*time.Second
		c.Breaker.Window = window
		c.Policies = policies(t, fleet)
		r := outage(t, c)
		checkInvariants(t, r)
		return r.Policies[0]
	}
	long, short := run(10*time.Second), run(2*time.Second)
	t.Logf("fleet, breaker window 10 s: %.3fx in the outage, %.1f%% of its requests served, %d refused by the budget", long.OutageAmplification, 100*long.OutageGoodput, long.BudgetDenied)
	t.Logf("fleet, breaker window 2 s: %.3fx in the outage, %.1f%% of its requests served, %d refused by the budget", short.OutageAmplification, 100*short.OutageGoodput, short.BudgetDenied)
	if short.OutageGoodput < long.OutageGoodput || short.BudgetDenied > long.BudgetDenied || short.OutageAmplification > 1.1 {
		t.Errorf("fleet: 2 s window serves %.3f of the outage's requests (%d budget refusals, %.3fx), 10 s window %.3f (%d); want the short window no worse, at <= 1.1x",
			short.OutageGoodput, short.BudgetDenied, short.OutageAmplification, long.OutageGoodput, long.BudgetDenied)
	}
}

// When the breaker closes, the calls that waited are released at the
// release rate, not all at once.
func TestOutageReleaseIsPaced(t *testing.T) {
	t.Parallel()
	peak := func(rate float64) (int, sim.OutagePolicyResult) {
		c := sim.DefaultLowVolumeOutageConfig()
		c.Capacity, c.Queue = 1e5, 1e6 // room for any spike: measure the clients only
		c.RetryAfter, c.Horizon = 0, 40*time.Second
		c.Breaker.ReleaseRate = rate
		c.Policies = policies(t, fleet)
		r := outage(t, c)
		checkInvariants(t, r)
		p := r.Policies[0]
		m := 0
		for _, x := range p.Load[int(c.TriggerEnd/c.Window):] {
			m = max(m, x)
		}
		return m, p
	}
	paced, p := peak(500)
	burst, _ := peak(-1)
	// 80 new requests per 100 ms window plus 50 released, with Poisson
	// noise; all at once, thousands.
	if paced > 250 || burst < 10*paced {
		t.Errorf("Outage fleet: peak after the outage %d per window released at 500/s, %d all at once; want <= 250 and at least 10x less than all at once", paced, burst)
	}
	if p.OutageGoodput < 0.5 || 100*p.BreakerRejected > p.Waited {
		t.Errorf("Outage fleet released at 500/s: outage goodput %.3f, %d of %d waiting requests gave up; want most served and nearly none", p.OutageGoodput, p.BreakerRejected, p.Waited)
	}
}

// A policy that honours Retry-After never retries sooner than asked: with
// the provider down from t=0 and asking for 5 s, the first 5 s see only
// first attempts.
func TestOutageRetryAfterIsAFloor(t *testing.T) {
	t.Parallel()
	c := sim.DefaultOutageConfig()
	c.Horizon, c.TriggerStart, c.TriggerEnd = 12*time.Second, 0, 12*time.Second
	c.Policies = []sim.OutagePolicy{
		{Name: "once", Attempts: 1},
		{Name: "honours", Attempts: 3, RetryAfter: true},
		{Name: "ignores", Attempts: 3},
	}
	r := outage(t, c)
	checkInvariants(t, r)
	first5 := func(p sim.OutagePolicyResult) (n int) {
		for _, x := range p.Load[:int(c.RetryAfter/c.Window)] {
			n += x
		}
		return n
	}
	once, honours, ignores := first5(policy(t, r, "once")), first5(policy(t, r, "honours")), first5(policy(t, r, "ignores"))
	if honours != once {
		t.Errorf("Outage: %d attempts in the first %v honouring Retry-After, want %d (first attempts only)", honours, c.RetryAfter, once)
	}
	if ignores < 2*once {
		t.Errorf("Outage: %d attempts in the first %v ignoring Retry-After, want about 3x %d", ignores, c.RetryAfter, once)
	}
}

// With no trigger and capacity above the load, every policy just works.
func TestOutageNoTrigger(t *testing.T) {
	t.Parallel()
	c := sim.DefaultOutageConfig()
	c.Horizon, c.TriggerStart, c.TriggerEnd = 10*time.Second, 0, 0
	r := outage(t, c)
	checkInvariants(t, r)
	for _, p := range r.Policies {
		if p.Goodput < 0.999 || p.Amplification > 1.001 || !p.Recovered || p.RecoverAfter != 0 {
			t.Errorf("Outage(no trigger) %s: goodput %.4f, %.4fx, recovered=%v after %v; want all served at once",
				p.Policy.Name, p.Goodput, p.Amplification, p.Recovered, p.RecoverAfter)
		}
	}
}

func TestOutageInvalidConfig(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		modify func(*sim.OutageConfig)
	}{
		{"no clients", func(c *sim.OutageConfig) { c.Clients = 0 }},
		{"too many clients", func(c *sim.OutageConfig) { c.Clients = sim.MaxOutageClients + 1 }},
		{"zero rate", func(c *sim.OutageConfig) { c.RatePerClient = 0 }},
		{"NaN rate", func(c *sim.OutageConfig) { c.RatePerClient = math.NaN() }},
		{"infinite capacity", func(c *sim.OutageConfig) { c.Capacity = math.Inf(1) }},
		{"capacity beyond 1/ns", func(c *sim.OutageConfig) { c.Capacity = 1e10 }},
		{"zero queue", func(c *sim.OutageConfig) { c.Queue = 0 }},
		{"zero timeout", func(c *sim.OutageConfig) { c.Timeout = 0 }},
		{"zero horizon", func(c *sim.OutageConfig) { c.Horizon = 0 }},
		{"trigger reversed", func(c *sim.OutageConfig) { c.TriggerStart, c.TriggerEnd = 10*time.Second, 5*time.Second }},
		{"trigger after horizon", func(c *sim.OutageConfig) { c.TriggerEnd = 2 * c.Horizon }},
		{"negative retry-after", func(c *sim.OutageConfig) { c.RetryAfter = -time.Second }},
		{"zero window", func(c *sim.OutageConfig) { c.Window = 0 }},
		{"tiny window", func(c *sim.OutageConfig) { c.Window = time.Microsecond }},
		{"recovery window not a multiple", func(c *sim.OutageConfig) { c.RecoveryWindow = 150 * time.Millisecond }},
		{"recovery ratio 0", func(c *sim.OutageConfig) { c.RecoveryRatio = 0 }},
		{"too many requests", func(c *sim.OutageConfig) { c.RatePerClient = 1e6 }},
		{"zero base", func(c *sim.OutageConfig) { c.Base = 0 }},
		{"bad budget", func(c *sim.OutageConfig) { c.Budget.Ratio = -1 }},
		{"unnamed policy", func(c *sim.OutageConfig) { c.Policies = []sim.OutagePolicy{{Attempts: 3}} }},
		{"negative interval", func(c *sim.OutageConfig) { c.Policies = []sim.OutagePolicy{{Name: "x", Interval: -1}} }},
		{"too many attempts", func(c *sim.OutageConfig) {
			c.Policies = []sim.OutagePolicy{{Name: "x", Attempts: sim.MaxOutageAttempts + 1}}
		}},
		{"unknown backoff", func(c *sim.OutageConfig) { c.Policies = []sim.OutagePolicy{{Name: "x", Backoff: backoff.Strategy(9)}} }},
		{"cap below base", func(c *sim.OutageConfig) { c.Cap = c.Base / 2 }},
		{"negative deadline", func(c *sim.OutageConfig) { c.Deadline = -time.Second }},
		{"bad breaker", func(c *sim.OutageConfig) { c.Breaker.FailureRatio = 2 }},
		{"budget floor NaN", func(c *sim.OutageConfig) { c.Budget.MinPerSecond = math.NaN() }},
		{"wait without breaker", func(c *sim.OutageConfig) { c.Policies = []sim.OutagePolicy{{Name: "x", Attempts: 3, Wait: true}} }},
		{"fleet of nothing", func(c *sim.OutageConfig) { c.Policies = []sim.OutagePolicy{{Name: "x", Attempts: 3, Fleet: true}} }},
		{"fleet that never syncs", func(c *sim.OutageConfig) {
			c.SyncEvery = 0
			c.Policies = []sim.OutagePolicy{{Name: "x", Attempts: 3, Budget: true, Fleet: true}}
		}},
		{"negative sync interval", func(c *sim.OutageConfig) { c.SyncEvery = -time.Second }},
	}
	for _, tt := range tests {
		c := sim.DefaultOutageConfig()
		tt.modify(&c)
		r, err := sim.Outage(c)
		if !errors.Is(err, sim.ErrInvalidConfig) || r != nil {
			t.Errorf("Outage(%s) = %v, %v; want nil, error wrapping ErrInvalidConfig", tt.name, r, err)
		}
	}
}

func BenchmarkOutage(b *testing.B) {
	c := sim.DefaultOutageConfig()
	for b.Loop() {
		if _, err := sim.Outage(c); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkOutagePatience runs the two policies that wait behind the
// breaker (one breaker per terminal, one for the fleet) over 8000
// terminals: the model's heaviest paths.
func BenchmarkOutagePatience(b *testing.B) {
	c := sim.DefaultLowVolumeOutageConfig()
	c.Policies = nil
	for _, p := range sim.DefaultOutagePolicies() {
		if p.Wait {
			c.Policies = append(c.Policies, p)
		}
	}
	for b.Loop() {
		if _, err := sim.Outage(c); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkOutageLowVolume(b *testing.B) {
	c := sim.DefaultLowVolumeOutageConfig()
	for b.Loop() {
		if _, err := sim.Outage(c); err != nil {
			b.Fatal(err)
		}
	}
}

func TestOutageWriteLoad(t *testing.T) {
	t.Parallel()
	c := sim.DefaultOutageConfig()
	c.Horizon, c.TriggerStart, c.TriggerEnd = 3*time.Second, time.Second, 2*time.Second
	c.Policies = policies(t, "full", naive)
	r := outage(t, c)
	var buf bytes.Buffer
	if err := r.WriteLoad(&buf, time.Second); err != nil {
		t.Fatalf("WriteLoad(1s) = %v", err)
	}
	lines := strings.Split(strings.TrimSuffix(buf.String(), "\n"), "\n")
	if len(lines) != 2+3 {
		t.Fatalf("WriteLoad(1s) wrote %d lines, want a title, a header and 3 rows:\n%s", len(lines), buf.String())
	}
	var sum int
	for _, x := range r.Policies[1].Load[:10] {
		sum += x
	}
	if f := strings.Fields(lines[2]); len(f) != 3 || f[0] != "0s" || f[2] != strconv.Itoa(sum) {
		t.Errorf("WriteLoad(1s) first row = %q, want 0s and %s's %d attempts", lines[2], naive, sum)
	}
	for _, bad := range []time.Duration{0, -time.Second, 150 * time.Millisecond} {
		buf.Reset()
		if err := r.WriteLoad(&buf, bad); !errors.Is(err, sim.ErrInvalidConfig) || buf.Len() != 0 {
			t.Errorf("WriteLoad(%v) = %v and %d bytes, want ErrInvalidConfig and nothing written", bad, err, buf.Len())
		}
	}
}

// TestWriteTextP99WithoutSuccess: a policy none of whose requests succeeded
// has no time to success to rank: its p99 cell says "-", not "0.0s" (which
// reads as every request served at once).
func TestWriteTextP99WithoutSuccess(t *testing.T) {
	r := &sim.OutageResult{Policies: []sim.OutagePolicyResult{
		{Policy: sim.OutagePolicy{Name: "none"}, Offered: 10},
		{Policy: sim.OutagePolicy{Name: "some"}, Offered: 10, Succeeded: 1, P99: 1500 * time.Millisecond},
	}}
	var b strings.Builder
	if err := r.WriteText(&b); err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(b.String(), "\n") {
		f := strings.Fields(line)
		if len(f) < 9 {
			continue
		}
		switch f[0] {
		case "none":
			if f[7] != "-" {
				t.Errorf("p99 of a policy with no success: %q, want \"-\" (%q)", f[7], line)
			}
		case "some":
			if f[7] != "1.5s" {
				t.Errorf("p99 of a policy with a success: %q, want \"1.5s\" (%q)", f[7], line)
			}
		}
	}
}
