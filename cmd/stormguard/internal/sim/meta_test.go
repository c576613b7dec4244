package sim_test

import (
	"bytes"
	"errors"
	"reflect"
	"testing"
	"time"

	"github.com/stormguard/stormguard/cmd/stormguard/internal/sim"
)

// TestOutageRecommendedWins: `stormguard sim outage` with its default flags
// shows the recommended setup recovering, serving the most requests in all
// and the most of those made during the outage.
func TestOutageRecommendedWins(t *testing.T) {
	t.Parallel()
	r := outage(t, sim.DefaultOutageConfig())
	rec := policy(t, r, sim.RecommendedOutagePolicy)
	if !rec.Recovered {
		t.Errorf("Outage(defaults) %s: never recovered (goodput %.3f, after the trigger %.3f)", rec.Policy.Name, rec.Goodput, rec.AfterGoodput)
	}
	for _, p := range r.Policies {
		if p.Policy.Name != rec.Policy.Name && (p.Goodput >= rec.Goodput || p.OutageGoodput >= rec.OutageGoodput) {
			t.Errorf("Outage(defaults): %s served %.3f (%.3f of the outage's), the recommended %s %.3f (%.3f); want the recommended to serve the most",
				p.Policy.Name, p.Goodput, p.OutageGoodput, rec.Policy.Name, rec.Goodput, rec.OutageGoodput)
		}
	}
}

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

// TestMetaStory: the metastable failure and its cure, for every trigger.
// The naive loop keeps the provider down after the trigger, working mostly
// for callers who left; the limiter recovers within 5 s of the trigger's
// end, wastes at most 1% of the work after it (a hang: at most the queue
// it held), serves at least 90% of the physical bound of the trigger's
// requests, and keeps 95% goodput before the trigger and in the rest of
// the run. (The 1% holds at this seed; at others this short run wastes
// 2-3% after a 503: see "Where package limit still wastes work" in
// docs/metastability.md.)
func TestMetaStory(t *testing.T) {
	t.Parallel()
	c := shortMeta()
	r, err := sim.Meta(c)
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Runs) != len(sim.Triggers()) {
		t.Fatalf("Meta ran %d triggers, want %d", len(r.Runs), len(sim.Triggers()))
	}
	for _, run := range r.Runs {
		naive, lim := metaRow(t, run, "fixed-1s").Phases, metaRow(t, run, "+limit").Phases
		if naive.Recovered || naive.Wasted < 0.5 || naive.AfterAttempts < 3 {
			t.Errorf("%v: fixed-1s recovered=%v, wasted %.3f, %.2fx after; want stuck, mostly wasted, >= 3x",
				run.Trigger, naive.Recovered, naive.Wasted, naive.AfterAttempts)
		}
		// After a hang the provider (which has no admission control)
		// serves what it queued during the hang, for callers who left: at
		// most its queue, which no client can take back.
		maxWasted := 0.01
		if run.Trigger == sim.TriggerHang {
			maxWasted = c.QueueSeconds / (c.Horizon - c.TriggerStart - c.TriggerFor).Seconds()
		}
		if !lim.Recovered || lim.RecoverAfter > 5*time.Second || lim.Wasted > maxWasted || lim.Served < 0.9*lim.Bound {
			t.Errorf("%v: +limit recovered=%v after %v, wasted %.4f, served %.3f of the bound %.3f; want within 5 s, <= %.3f, >= 90%% of the bound",
				run.Trigger, lim.Recovered, lim.RecoverAfter, lim.Wasted, lim.Served, lim.Bound, maxWasted)
		}
		if lim.Before < 0.95 || lim.Rest < 0.95 {
			t.Errorf("%v: +limit goodput before %.3f, rest %.3f; want >= 95%%", run.Trigger, lim.Before, lim.Rest)
		}
	}
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

func TestMetaDeterministic(t *testing.T) {
	t.Parallel()
	c := shortMeta()
	c.Triggers = []sim.Trigger{sim.TriggerSlow}
	a, err := sim.Meta(c)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := sim.Meta(c)
	if !reflect.DeepEqual(a, b) {
		t.Error("two runs of the same config differ")
	}
	var wa, wb bytes.Buffer
	a.WriteText(&wa)
	b.WriteWide(&wb)
	if wa.Len() == 0 || wb.Len() <= wa.Len() {
		t.Errorf("WriteText wrote %d bytes, WriteWide %d; want the wide one longer", wa.Len(), wb.Len())
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
