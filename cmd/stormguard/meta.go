package main

import (
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/stormguard/stormguard/cmd/stormguard/internal/sim"
	"gonum.org/v1/plot/vg"
)

// Limits of `sim meta`: like sim outage's, per trigger. The naive rows
// make up to about 30 attempts per request, as many as the deadline holds
// attempt timeouts, so the attempts are bounded too: runs at the limits
// measured 14-25 s on the development machine (the requests' bound alone
// let one run two minutes: 200,000 requests of 30 attempts each, a 1 ms
// timeout and a 1 h deadline).
const (
	maxMetaRequests = 200_000   // rho x capacity x horizon, per trigger
	maxMetaAttempts = 4_000_000 // the requests x min(30, deadline / 1 s), per trigger
	metaMaxTries    = 30        // the most attempts a naive row makes per request
)

// metaAfter is the least time sim meta leaves after the trigger: one span
// of the recovery column (a trigger that ended at the horizon left every
// row "stuck", its phases after it empty). The recovery is judged over 10
// s, or half the time after the trigger if less (see sim.MetaRow).
const metaAfter = time.Second

func prepareMeta(args []string, e *env) (func() error, error) {
	c := sim.DefaultMetaConfig()
	var out output
	wide := false
	triggers, policies := "", ""
	all := sim.MetaPolicies()
	fs := newFlagSet("sim meta",
		"The metastability matrix: a provider near its capacity, whose queue serves work for\n"+
			"callers who left, is hit by each trigger in turn (503, hang, service time x5, capacity\n"+
			"cut by 80%); each client setup runs against it. Prints goodput before, during, the first\n"+
			"10 s after and the rest, attempts per offered request and wasted work after the trigger,\n"+
			"the time to recover (or \"stuck\") and the share of the trigger's requests served.",
		fmt.Sprintf("rho x capacity x horizon at most %d requests, and those x min(%d, deadline / 1s:\n"+
			"the naive loop's pace when attempts fail at once) at most %d attempts;\n"+
			"trigger-start + trigger-for <= horizon - 1s;\n"+
			"queue-seconds x capacity at least 1; the capacity cut needs at least 5 workers.", maxMetaRequests, metaMaxTries, maxMetaAttempts), e)
	fs.floatVar(&c.Rho, "rho", 0.01, 2, "offered load as a share of the provider's capacity")
	fs.intVar(&c.Clients, "clients", 1, 1000, "clients sharing the load, each with its own guards")
	fs.floatVar(&c.Capacity, "capacity", 1, 1e5, "requests per second the provider serves")
	fs.intVar(&c.Workers, "workers", 1, sim.MaxOutageWorkers, "the provider's workers (each request takes workers/capacity s of one)")
	fs.floatVar(&c.QueueSeconds, "queue-seconds", 0.001, 600, "work the provider's queue holds, in seconds")
	fs.durationVar(&c.Timeout, "timeout", time.Millisecond, time.Hour, "client timeout per attempt")
	fs.durationVar(&c.Deadline, "deadline", time.Millisecond, time.Hour, "deadline of each request, retries included")
	fs.durationVar(&c.TriggerStart, "trigger-start", 0, time.Hour, "when the trigger starts")
	fs.durationVar(&c.TriggerFor, "trigger-for", 0, time.Hour, "how long it lasts")
	fs.durationVar(&c.Horizon, "horizon", time.Second, time.Hour, "simulated time of each run")
	fs.StringVar(&triggers, "triggers", "", "comma-separated triggers among 503, hang, slow5x, cut80 (default all)")
	fs.StringVar(&policies, "policies", "", "comma-separated client setups to run (default all of "+policyNames(all)+"); each setup's random streams follow its place in the list, so a setup run alone or elsewhere gives figures of another draw")
	fs.BoolVar(&wide, "wide", false, "more columns: goodput, p99, attempts in the trigger, shed, timed out, limited")
	fs.uint64Var(&c.Seed, "seed", math.MaxUint64, "seed")
	out.register(fs)
	if err := fs.parse(args); err != nil {
		return nil, err
	}
	if err := out.validate(); err != nil {
		return nil, err
	}
	requests := c.Rho * c.Capacity * c.Horizon.Seconds()
	if requests > maxMetaRequests {
		return nil, usageError{fmt.Errorf("-rho %g x -capacity %g x -horizon %v is %.0f requests, at most %d", c.Rho, c.Capacity, fmtDuration(c.Horizon), requests, maxMetaRequests)}
	}
	// The naive loop retries a second after each failure, and a failure
	// can come at once (a 503, a full queue), whatever -timeout is.
	tries := math.Max(1, math.Min(metaMaxTries, math.Ceil(c.Deadline.Seconds())))
	if attempts := requests * tries; attempts > maxMetaAttempts {
		return nil, usageError{fmt.Errorf("-rho %g x -capacity %g x -horizon %v is %.0f requests of up to %.0f attempts each (-deadline %v / 1s, at most %d): %.0f attempts, at most %d",
			c.Rho, c.Capacity, fmtDuration(c.Horizon), requests, tries, fmtDuration(c.Deadline), metaMaxTries, attempts, maxMetaAttempts)}
	}
	if c.TriggerStart+c.TriggerFor+metaAfter > c.Horizon {
		return nil, usageError{fmt.Errorf("-trigger-start %v + -trigger-for %v must end at least %v before -horizon %v (the recovery is judged over the time after the trigger)",
			fmtDuration(c.TriggerStart), fmtDuration(c.TriggerFor), fmtDuration(metaAfter), fmtDuration(c.Horizon))}
	}
	if fs.isSet("triggers") {
		ts, err := parseList("triggers", triggers, byName("trigger", sim.Triggers()))
		if err != nil {
			return nil, usageError{err}
		}
		c.Triggers = ts
	}
	if c.QueueSeconds*c.Capacity < 1 {
		return nil, usageError{fmt.Errorf("-queue-seconds %g x -capacity %g: a queue of %g s at %g/s must hold at least one request", c.QueueSeconds, c.Capacity, c.QueueSeconds, c.Capacity)}
	}
	if c.Workers < 5 && (len(c.Triggers) == 0 || slices.Contains(c.Triggers, sim.TriggerCut)) {
		return nil, usageError{fmt.Errorf("-workers %d: the capacity cut needs at least 5 workers, not %d (or leave cut80 out of -triggers)", c.Workers, c.Workers)}
	}
	if fs.isSet("policies") {
		ps, err := parseList("policies", policies, policyByName(all))
		if err != nil {
			return nil, usageError{err}
		}
		c.Policies = ps
	}
	return func() error {
		c.Progress = e.progress(out.quiet, "meta")
		r, err := sim.Meta(c)
		if err != nil {
			return usageError{err}
		}
		if out.chart != "" {
			if err := metaChart(r, out.chart); err != nil {
				return err
			}
		}
		switch {
		case out.json:
			enc := json.NewEncoder(e.stdout)
			enc.SetIndent("", "  ")
			return enc.Encode(r)
		case wide:
			return r.WriteWide(e.stdout)
		}
		return r.WriteText(e.stdout)
	}, nil
}

// policyByName returns a parser of the names of all, for parseList.
func policyByName(all []sim.OutagePolicy) func(string) (sim.OutagePolicy, error) {
	return func(name string) (sim.OutagePolicy, error) {
		for _, p := range all {
			if p.Name == name {
				return p, nil
			}
		}
		return sim.OutagePolicy{}, fmt.Errorf("unknown policy %.60q (want some of %s)", name, policyNames(all))
	}
}

// metaChart draws one panel per trigger: each policy's goodput per second
// (requests that succeeded in the second per request offered in it), the
// trigger shaded.
func metaChart(r *sim.MetaResult, file string) error {
	c := r.Config
	panels := make([]panel, 0, len(r.Runs))
	for i, run := range r.Runs {
		p := panel{title: fmt.Sprintf("%s at rho %g", run.Trigger, c.Rho), xLabel: "time (s)", yLabel: "goodput (% of offered)",
			height: 6 * vg.Centimeter, legendBelow: i == len(r.Runs)-1, noLegend: i < len(r.Runs)-1}
		p.shade = []span{{name: "trigger", from: c.TriggerStart.Seconds(), to: (c.TriggerStart + c.TriggerFor).Seconds()}}
		for _, pr := range run.Policies {
			p.lines = append(p.lines, goodputSeries(pr, r.Window))
		}
		for k := range p.lines {
			p.lines[k].bold = run.Policies[k].Policy.Limit
		}
		panels = append(panels, p)
	}
	return drawPanels(file, fmt.Sprintf("metastability: %g req/s offered to %g req/s", c.Rho*c.Capacity, c.Capacity), panels)
}

// goodputSeries returns pr's goodput per second, in percent, at the start
// of each second (window is the run's window).
func goodputSeries(pr sim.OutagePolicyResult, window time.Duration) series {
	s := series{name: pr.Policy.Name}
	k := int(time.Second / window)
	for i := 0; i+k <= len(pr.Arrivals); i += k {
		var n, ok int
		for j := i; j < i+k; j++ {
			n += pr.Arrivals[j]
			ok += pr.Done[j]
		}
		y := 0.0
		if n > 0 {
			y = 100 * float64(ok) / float64(n)
		}
		s.x = append(s.x, (time.Duration(i) * window).Seconds())
		s.y = append(s.y, y)
	}
	return s
}
