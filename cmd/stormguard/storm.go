package main

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"strings"
	"time"

	"github.com/stormguard/stormguard/cmd/stormguard/internal/sim"
	"gonum.org/v1/plot/vg"
)

// simWork returns the work of a simulation command: simulate, then draw
// the chart (with --chart) and print the result. A simulation's own
// validation error is a usage error; the command's checks come first.
func simWork[R interface{ WriteText(io.Writer) error }](e *env, out output, simulate func() (R, error), chart func(R, string) error) func() error {
	return func() error {
		r, err := simulate()
		if err != nil {
			return usageError{err}
		}
		return emit(e, out, r, func(file string) error { return chart(r, file) })
	}
}

// emit writes r as JSON or as its table, after drawing its chart.
func emit(e *env, out output, r interface{ WriteText(io.Writer) error }, chart func(file string) error) error {
	if out.chart != "" {
		if err := chart(out.chart); err != nil {
			return err
		}
	}
	if out.json {
		enc := json.NewEncoder(e.stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(r)
	}
	return r.WriteText(e.stdout)
}

// Limits of `sim layers`: the budget columns simulate every call of every
// user request, up to about 100 ns each; at the limit a run takes up to
// about 10 s.
const (
	maxLayersRequests = 1_000_000   // rate x duration
	maxLayersCalls    = 100_000_000 // estimated by layersCalls
)

func prepareLayers(args []string, e *env) (func() error, error) {
	c := sim.DefaultLayersConfig()
	var out output
	fs := newFlagSet("sim layers",
		"Calls reaching a failing bottom dependency per user request when L layers each retry up\n"+
			"to A attempts: naive (A^L), with the don't-retry signal (A), with a per-client retry\n"+
			"budget at every layer (simulated over many requests), and with both.",
		fmt.Sprintf("attempts^layers at most %d; rate x duration at most %d requests; the calls the budget\n"+
			"columns simulate (about requests x (1+budget-ratio)^layers, summed over the rows) at most %d\n"+
			"(up to about 10 s).", sim.MaxLayerCalls, maxLayersRequests, maxLayersCalls), e)
	fs.intVar(&c.Layers, "layers", 1, sim.MaxLayers, "deepest chain (rows 1..layers)")
	fs.intVar(&c.Attempts, "attempts", 1, sim.MaxLayerCalls, "attempts per layer, the first included")
	fs.floatVar(&c.Rate, "rate", 0.001, 1e6, "user requests per second (budget columns)")
	fs.durationVar(&c.Duration, "duration", time.Millisecond, 24*time.Hour, "simulated time (budget columns)")
	fs.durationVar(&c.Warmup, "warmup", 0, 24*time.Hour, "initial time left out of the budget columns, less than the duration")
	fs.floatVar(&c.Budget.Ratio, "budget-ratio", 0, 1, "retries allowed per request over the budget window")
	fs.uint64Var(&c.Seed, "seed", math.MaxUint64, "seed of the arrival stream")
	out.register(fs)
	if err := fs.parse(args); err != nil {
		return nil, err
	}
	if err := out.validate(); err != nil {
		return nil, err
	}
	requests := c.Rate * c.Duration.Seconds()
	switch {
	case math.Pow(float64(c.Attempts), float64(c.Layers)) > sim.MaxLayerCalls:
		return nil, usageError{fmt.Errorf("-attempts %d ^ -layers %d is more than %d calls per request", c.Attempts, c.Layers, sim.MaxLayerCalls)}
	case c.Warmup >= c.Duration:
		return nil, usageError{fmt.Errorf("-warmup %v must be less than -duration %v", fmtDuration(c.Warmup), fmtDuration(c.Duration))}
	case requests > maxLayersRequests:
		return nil, usageError{fmt.Errorf("-rate %g x -duration %v is %.0f requests, at most %d", c.Rate, fmtDuration(c.Duration), requests, maxLayersRequests)}
	}
	if n := layersCalls(c); n > maxLayersCalls {
		return nil, usageError{fmt.Errorf("-layers %d with -attempts %d, -budget-ratio %g and %.0f requests (-rate x -duration) is about %.3g simulated calls, at most %d",
			c.Layers, c.Attempts, c.Budget.Ratio, requests, n, maxLayersCalls)}
	}
	return simWork(e, out, func() (*sim.LayersResult, error) { return sim.Layers(c) }, layersChart), nil
}

// layersCalls bounds the calls the budget columns of sim.Layers simulate:
// for each chain depth, in both columns, layer k makes at most Attempts
// calls per call it handles, and at most (1+Ratio) per call plus the
// budget floor's retries over the run.
func layersCalls(c sim.LayersConfig) float64 {
	requests := c.Rate * c.Duration.Seconds()
	floor := c.Budget.MinPerSecond * (c.Duration + c.Budget.Window).Seconds()
	var total float64
	for l := 1; l <= c.Layers; l++ {
		calls := requests
		for range l {
			calls = min(calls*float64(c.Attempts), calls*(1+c.Budget.Ratio)+floor)
			total += 2 * calls
		}
	}
	return total
}

func layersChart(r *sim.LayersResult, file string) error {
	p := panel{title: "calls at the failing bottom per user request", xLabel: "layers retrying", yLabel: "calls per user request"}
	naive := series{name: "every layer retries"}
	signal := series{name: "don't-retry signal"}
	bud := series{name: "budget at every layer"}
	both := series{name: "signal + budget"}
	for _, row := range r.Rows {
		x := float64(row.Layers)
		naive.x, naive.y = append(naive.x, x), append(naive.y, float64(row.Naive))
		signal.x, signal.y = append(signal.x, x), append(signal.y, float64(row.Signal))
		bud.x, bud.y = append(bud.x, x), append(bud.y, row.Budget)
		both.x, both.y = append(both.x, x), append(both.y, row.SignalBudget)
	}
	p.lines = []series{naive, signal, bud, both}
	return drawPanels(file, fmt.Sprintf("%d attempts per layer against a failing bottom", r.Config.Attempts), []panel{p})
}

// Limits of `sim outage`, tighter than the simulation's own: every client
// runs the library's retry loop, breaker and budget, about 100 to 200 µs of
// simulation per request over all the policies, so at the limit a run takes
// up to about 10 s and, with 100,000 clients, about 400 MB.
const (
	maxOutageRequests = 100_000 // clients x rate x horizon
	maxOutageWindows  = 100_000 // horizon / window, each a few ints per policy
)

func prepareOutage(args []string, e *env) (func() error, error) {
	c := sim.DefaultOutageConfig()
	var out output
	lowVolume := false
	policies := ""
	all := sim.DefaultOutagePolicies()
	fs := newFlagSet("sim outage",
		"A fleet sends a steady load to a provider with finite capacity that answers 503 to\n"+
			"everything during the trigger; each policy of retries runs against it in turn. Prints\n"+
			"peak load per window, attempts per offered request, goodput and the time to recover\n"+
			"after the trigger ends (\"never\": the metastable failure).",
		fmt.Sprintf("clients x rate x horizon at most %d requests; horizon / window at most %d windows;\n"+
			"0 <= trigger-start <= trigger-end <= horizon - %[3]v; the window divides the %[3]v recovery window.",
			maxOutageRequests, maxOutageWindows, fmtDuration(c.RecoveryWindow)), e)
	fs.BoolVar(&lowVolume, "low-volume", false, "the fleet of many low-volume clients (8000 x 0.1 req/s) instead of 8 x 100 req/s")
	fs.intVar(&c.Clients, "clients", 1, sim.MaxOutageClients, "clients in the fleet (overrides --low-volume's)")
	fs.floatVar(&c.RatePerClient, "rate", 0.001, 1e6, "requests per second per client (overrides --low-volume's)")
	fs.floatVar(&c.Capacity, "capacity", 0.01, 1e7, "requests per second the provider completes")
	fs.intVar(&c.Queue, "queue", 1, 10_000_000, "requests that may wait at the provider")
	fs.durationVar(&c.Timeout, "timeout", time.Millisecond, time.Hour, "client timeout per attempt")
	fs.durationVar(&c.TriggerStart, "trigger-start", 0, sim.MaxOutageHorizon, "when the provider starts failing")
	fs.durationVar(&c.TriggerEnd, "trigger-end", 0, sim.MaxOutageHorizon, "when it stops failing")
	fs.durationVar(&c.RetryAfter, "retry-after", 0, time.Hour, "Retry-After the provider sends during the trigger (0: none)")
	fs.durationVar(&c.Horizon, "horizon", time.Millisecond, sim.MaxOutageHorizon, "simulated time")
	fs.durationVar(&c.Window, "window", time.Millisecond, c.RecoveryWindow, "width of a load window")
	fs.StringVar(&policies, "policies", "", "comma-separated policy names to run (default: all of "+policyNames(all)+"); each policy's random streams follow its place in the list, so a policy run alone or elsewhere gives figures of another draw")
	fs.uint64Var(&c.Seed, "seed", math.MaxUint64, "seed")
	out.register(fs)
	if err := fs.parse(args); err != nil {
		return nil, err
	}
	if err := out.validate(); err != nil {
		return nil, err
	}
	if lowVolume {
		lv := sim.DefaultLowVolumeOutageConfig()
		if !fs.isSet("clients") {
			c.Clients = lv.Clients
		}
		if !fs.isSet("rate") {
			c.RatePerClient = lv.RatePerClient
		}
	}
	requests := float64(c.Clients) * c.RatePerClient * c.Horizon.Seconds()
	switch {
	case c.TriggerStart > c.TriggerEnd:
		return nil, usageError{fmt.Errorf("-trigger-start %v must not be after -trigger-end %v", fmtDuration(c.TriggerStart), fmtDuration(c.TriggerEnd))}
	case c.RecoveryWindow%c.Window != 0:
		return nil, usageError{fmt.Errorf("-window %v must divide the recovery window %v (e.g. 1ms, 10ms, 100ms)", fmtDuration(c.Window), fmtDuration(c.RecoveryWindow))}
	case c.Window > c.Horizon:
		return nil, usageError{fmt.Errorf("-window %v must not be longer than -horizon %v", fmtDuration(c.Window), fmtDuration(c.Horizon))}
	case c.TriggerEnd+c.RecoveryWindow > c.Horizon:
		return nil, usageError{fmt.Errorf("-trigger-end %v must end at least the recovery window %v before -horizon %v (the time to recover is measured after it)",
			fmtDuration(c.TriggerEnd), fmtDuration(c.RecoveryWindow), fmtDuration(c.Horizon))}
	case c.Horizon/c.Window > maxOutageWindows:
		return nil, usageError{fmt.Errorf("-horizon %v / -window %v is %d windows, at most %d", fmtDuration(c.Horizon), fmtDuration(c.Window), c.Horizon/c.Window, maxOutageWindows)}
	case requests > maxOutageRequests:
		return nil, usageError{fmt.Errorf("-clients %d x -rate %g x -horizon %v is %.0f requests, at most %d", c.Clients, c.RatePerClient, fmtDuration(c.Horizon), requests, maxOutageRequests)}
	}
	if fs.isSet("policies") {
		byPolicy := make(map[string]sim.OutagePolicy, len(all))
		for _, p := range all {
			byPolicy[p.Name] = p
		}
		ps, err := parseList("policies", policies, func(name string) (sim.OutagePolicy, error) {
			p, ok := byPolicy[name]
			if !ok {
				return p, fmt.Errorf("unknown policy %.60q (want some of %s)", name, policyNames(all))
			}
			return p, nil
		})
		if err != nil {
			return nil, usageError{err}
		}
		c.Policies = ps
	}
	return simWork(e, out, func() (*sim.OutageResult, error) {
		c.Progress = e.progress(out.quiet, "outage")
		return sim.Outage(c)
	}, outageChart), nil
}

func outageChart(r *sim.OutageResult, file string) error {
	c := r.Config
	p := panel{xLabel: "time (s)", height: 13 * vg.Centimeter, legendLeft: true}
	k := 1
	for _, pr := range r.Policies {
		k = max(k, mergeFactor(len(pr.Load)))
	}
	for _, pr := range r.Policies {
		p.lines = append(p.lines, windowSeries(pr.Policy.Name, c.Window, pr.Load, k))
	}
	p.title = fmt.Sprintf("attempts reaching the provider per %v window (capacity %g/s, 503 from %v to %v)",
		fmtDuration(c.Window*time.Duration(k)), c.Capacity, fmtDuration(c.TriggerStart), fmtDuration(c.TriggerEnd))
	p.yLabel = "attempts per window"
	return drawPanels(file, fmt.Sprintf("outage: %d clients x %g req/s", c.Clients, c.RatePerClient), []panel{p})
}

// mergeFactor returns how many neighbouring windows a chart merges into
// one point so that n windows make at most maxBars points.
func mergeFactor(n int) int { return n/maxBars + 1 }

// windowSeries returns counts per window as a line over time (s), each
// point the sum of k neighbouring windows, at the start of the first.
func windowSeries[T int | int64](name string, window time.Duration, counts []T, k int) series {
	s := series{name: name}
	for i := 0; i < len(counts); i += k {
		var n T
		for _, v := range counts[i:min(i+k, len(counts))] {
			n += v
		}
		s.x = append(s.x, (time.Duration(i) * window).Seconds())
		s.y = append(s.y, float64(n))
	}
	return s
}

func policyNames(ps []sim.OutagePolicy) string {
	names := make([]string, len(ps))
	for i, p := range ps {
		names[i] = p.Name
	}
	return strings.Join(names, ", ")
}

func prepareContention(args []string, e *env) (func() error, error) {
	c := sim.DefaultContentionConfig()
	var out output
	clients := "10-150/10"
	strategies := ""
	fs := newFlagSet("sim contention",
		"The AWS Architecture Blog experiment: N clients each update one shared row once with\n"+
			"optimistic concurrency, backing off on conflict. Prints total write calls and time to\n"+
			"completion, averaged over the runs, per backoff strategy and N.",
		fmt.Sprintf("runs x strategies x the sum of N² over the N values at most %d (a run with N clients\n"+
			"makes up to about N² write calls; at the limit, up to about 20 s). The default is 100 x 5 x 124000.", sim.MaxContentionWork), e)
	fs.StringVar(&clients, "clients", clients, fmt.Sprintf("values of N, each 1 to %d: a list (10,20,50) or a range FROM-TO/STEP", sim.MaxContentionClients))
	fs.intVar(&c.Runs, "runs", 1, sim.MaxContentionRuns, "runs averaged per point")
	fs.durationVar(&c.Base, "base", time.Microsecond, sim.MaxContentionDuration, "backoff base")
	fs.durationVar(&c.Cap, "cap", time.Microsecond, sim.MaxContentionDuration, "backoff cap, at least the base")
	fs.durationVar(&c.DelayMean, "delay", 0, sim.MaxContentionDuration, "mean network delay per hop")
	fs.durationVar(&c.DelayStdDev, "delay-stddev", 0, sim.MaxContentionDuration, "standard deviation of the delay per hop")
	fs.StringVar(&strategies, "strategies", "", "comma-separated strategies among none, exponential, full, equal, decorrelated (default all)")
	fs.uint64Var(&c.Seed, "seed", math.MaxUint64, "seed")
	out.register(fs)
	if err := fs.parse(args); err != nil {
		return nil, err
	}
	if err := out.validate(); err != nil {
		return nil, err
	}
	if c.Cap < c.Base {
		return nil, usageError{fmt.Errorf("-cap %v must be at least -base %v", fmtDuration(c.Cap), fmtDuration(c.Base))}
	}
	ns, err := parseInts("clients", clients, 1, sim.MaxContentionClients)
	if err != nil {
		return nil, usageError{err}
	}
	c.Clients = ns
	if fs.isSet("strategies") {
		ss, err := parseList("strategies", strategies, byName("strategy", sim.ContentionStrategies()))
		if err != nil {
			return nil, usageError{err}
		}
		c.Strategies = ss
	}
	var squares int64
	for _, n := range c.Clients {
		squares += int64(n) * int64(n) // at most 1000 values of at most 1000
	}
	if work := int64(c.Runs) * int64(len(c.Strategies)) * squares; work > sim.MaxContentionWork {
		return nil, usageError{fmt.Errorf("-runs %d x %d -strategies x %d (the sum of the squared -clients) is %d, at most %d",
			c.Runs, len(c.Strategies), squares, work, sim.MaxContentionWork)}
	}
	return simWork(e, out, func() (*sim.ContentionResult, error) {
		c.Progress = e.progress(out.quiet, "contention")
		return sim.Contention(c)
	}, contentionChart), nil
}

func contentionChart(r *sim.ContentionResult, file string) error {
	calls := panel{title: "total write calls", xLabel: "clients (N)", yLabel: "calls"}
	done := panel{title: "time to completion", xLabel: "clients (N)", yLabel: "seconds"}
	for _, s := range r.Series {
		a, b := series{name: s.Strategy.String()}, series{name: s.Strategy.String()}
		for _, pt := range s.Points {
			a.x, a.y = append(a.x, float64(pt.Clients)), append(a.y, pt.Calls)
			b.x, b.y = append(b.x, float64(pt.Clients)), append(b.y, pt.Completion.Seconds())
		}
		calls.lines, done.lines = append(calls.lines, a), append(done.lines, b)
	}
	return drawPanels(file, fmt.Sprintf("optimistic concurrency, %d runs per point", r.Config.Runs), []panel{calls, done})
}
