package sim_test

import (
	"errors"
	"testing"
	"time"

	"github.com/stormguard/stormguard/cmd/stormguard/internal/sim"
)

// shortMeta is a small, fast matrix: 450 req/s offered to a provider of
// 500 req/s (25 workers of 50 ms, a queue of 2 s of work), a 5 s trigger
// at 5 s of a 30 s run, a 1 s attempt timeout and a 10 s deadline.
func shortMeta() sim.MetaConfig {
	c := sim.DefaultMetaConfig()
	c.Capacity, c.Workers = 500, 25
	c.TriggerStart, c.TriggerFor, c.Horizon = 5*time.Second, 5*time.Second, 30*time.Second
	c.Deadline = 10 * time.Second
	return c
}

// metaRow returns the result of the policy named name in run.
func metaRow(t *testing.T, run sim.MetaRun, name string) sim.OutagePolicyResult {
	t.Helper()
	for _, p := range run.Policies {
		if p.Policy.Name == name {
			return p
		}
	}
	t.Fatalf("no result for policy %s", name)
	return sim.OutagePolicyResult{}
}

// TestMetaPhases checks the phase figures against the run's own counts.
func TestMetaPhases(t *testing.T) {
	t.Parallel()
	c := shortMeta()
	c.Triggers = []sim.Trigger{sim.TriggerHang}
	c.Policies = sim.MetaPolicies()[:1]
	r, err := sim.Meta(c)
	if err != nil {
		t.Fatal(err)
	}
	p := r.Runs[0].Policies[0]
	if got, want := p.Phases.Bound, sim.PhysicalBound(c.Rho, c.Deadline, c.TriggerFor); got != want || want <= 0 || want >= 1 {
		t.Errorf("bound %v, want %v in (0, 1)", got, want)
	}
	if p.Phases.Served != p.OutageGoodput {
		t.Errorf("served %v, want the outage goodput %v", p.Phases.Served, p.OutageGoodput)
	}
	var done int
	for _, n := range p.Done {
		done += n
	}
	if done != p.Succeeded {
		t.Errorf("Done sums to %d, want the %d successes", done, p.Succeeded)
	}
}

func TestMetaInvalidConfig(t *testing.T) {
	for _, tt := range []struct {
		name string
		edit func(*sim.MetaConfig)
	}{
		{"rho 0", func(c *sim.MetaConfig) { c.Rho = 0 }},
		{"rho 3", func(c *sim.MetaConfig) { c.Rho = 3 }},
		{"no capacity", func(c *sim.MetaConfig) { c.Capacity = 0 }},
		{"empty queue", func(c *sim.MetaConfig) { c.QueueSeconds = 0 }},
		{"no timeout", func(c *sim.MetaConfig) { c.Timeout = 0 }},
		{"trigger past the horizon", func(c *sim.MetaConfig) { c.TriggerStart = c.Horizon }},
		{"cut with 4 workers", func(c *sim.MetaConfig) { c.Workers = 4 }},
		{"no clients", func(c *sim.MetaConfig) { c.Clients = 0 }},
		{"unknown trigger", func(c *sim.MetaConfig) { c.Triggers = []sim.Trigger{9} }},
		{"limit in a fleet", func(c *sim.MetaConfig) {
			p := sim.MetaPolicies()[4]
			p.Fleet = true
			c.Policies = []sim.OutagePolicy{p}
		}},
	} {
		c := shortMeta()
		tt.edit(&c)
		if r, err := sim.Meta(c); r != nil || !errors.Is(err, sim.ErrInvalidConfig) {
			t.Errorf("Meta(%s) = %v, %v; want nil, ErrInvalidConfig", tt.name, r != nil, err)
		}
	}
}

func TestTriggerText(t *testing.T) {
	for _, tr := range sim.Triggers() {
		b, err := tr.MarshalText()
		var back sim.Trigger
		if err != nil || back.UnmarshalText(b) != nil || back != tr {
			t.Errorf("%v: MarshalText %q, %v; round trip %v", tr, b, err, back)
		}
	}
	var tr sim.Trigger
	if err := tr.UnmarshalText([]byte("flood")); !errors.Is(err, sim.ErrInvalidConfig) {
		t.Errorf("UnmarshalText(flood) = %v, want ErrInvalidConfig", err)
	}
	if _, err := sim.Trigger(9).MarshalText(); err == nil {
		t.Error("MarshalText(9) succeeded")
	}
}
