package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/stormguard/stormguard/internal/sim"
	"gonum.org/v1/plot/vg"
)

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

func runLayers(args []string, e *env) error {
	c := sim.DefaultLayersConfig()
	var out output
	fs := newFlagSet("sim layers",
		"Calls reaching a failing bottom dependency per user request when L layers each retry up\n"+
			"to A attempts: naive (A^L), with the don't-retry signal (A), with a per-client retry\n"+
			"budget at every layer (simulated over many requests), and with both.", e)
	fs.IntVar(&c.Layers, "layers", c.Layers, "deepest chain (rows 1..layers)")
	fs.IntVar(&c.Attempts, "attempts", c.Attempts, "attempts per layer, the first included")
	fs.Float64Var(&c.Rate, "rate", c.Rate, "user requests per second (budget columns)")
	fs.DurationVar(&c.Duration, "duration", c.Duration, "simulated time (budget columns)")
	fs.DurationVar(&c.Warmup, "warmup", c.Warmup, "initial time left out of the budget columns")
	fs.Float64Var(&c.Budget.Ratio, "budget-ratio", c.Budget.Ratio, "retries allowed per request over the budget window")
	fs.Uint64Var(&c.Seed, "seed", c.Seed, "seed of the arrival stream")
	out.register(fs)
	if err := fs.parse(args); err != nil {
		return err
	}
	if err := out.validate(); err != nil {
		return err
	}
	r, err := sim.Layers(c)
	if err != nil {
		return usageError{err}
	}
	return emit(e, out, r, func(file string) error {
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
		return drawPanels(file, fmt.Sprintf("%d attempts per layer against a failing bottom", c.Attempts), []panel{p})
	})
}

func runOutage(args []string, e *env) error {
	c := sim.DefaultOutageConfig()
	var out output
	lowVolume := false
	policies := ""
	fs := newFlagSet("sim outage",
		"A fleet sends a steady load to a provider with finite capacity that answers 503 to\n"+
			"everything during the trigger; each policy of retries runs against it in turn. Prints\n"+
			"peak load per window, attempts per offered request, goodput and the time to recover\n"+
			"after the trigger ends (\"never\": the metastable failure).", e)
	fs.BoolVar(&lowVolume, "low-volume", false, "the fleet of many low-volume clients (8000 x 0.1 req/s) instead of 8 x 100 req/s")
	fs.IntVar(&c.Clients, "clients", c.Clients, "clients in the fleet (overrides --low-volume's)")
	fs.Float64Var(&c.RatePerClient, "rate", c.RatePerClient, "requests per second per client (overrides --low-volume's)")
	fs.Float64Var(&c.Capacity, "capacity", c.Capacity, "requests per second the provider completes")
	fs.IntVar(&c.Queue, "queue", c.Queue, "requests that may wait at the provider")
	fs.DurationVar(&c.Timeout, "timeout", c.Timeout, "client timeout per attempt")
	fs.DurationVar(&c.TriggerStart, "trigger-start", c.TriggerStart, "when the provider starts failing")
	fs.DurationVar(&c.TriggerEnd, "trigger-end", c.TriggerEnd, "when it stops failing")
	fs.DurationVar(&c.RetryAfter, "retry-after", c.RetryAfter, "Retry-After the provider sends during the trigger")
	fs.DurationVar(&c.Horizon, "horizon", c.Horizon, "simulated time")
	fs.DurationVar(&c.Window, "window", c.Window, "width of a load window")
	fs.StringVar(&policies, "policies", "", "comma-separated policy names to run (default: all of "+policyNames(sim.DefaultOutagePolicies())+")")
	fs.Uint64Var(&c.Seed, "seed", c.Seed, "seed")
	out.register(fs)
	if err := fs.parse(args); err != nil {
		return err
	}
	if err := out.validate(); err != nil {
		return err
	}
	if lowVolume {
		lv := sim.DefaultLowVolumeOutageConfig()
		set := map[string]bool{}
		fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
		if !set["clients"] {
			c.Clients = lv.Clients
		}
		if !set["rate"] {
			c.RatePerClient = lv.RatePerClient
		}
	}
	if policies != "" {
		byName := map[string]sim.OutagePolicy{}
		for _, p := range sim.DefaultOutagePolicies() {
			byName[p.Name] = p
		}
		ps, err := parseList(policies, func(name string) (sim.OutagePolicy, error) {
			p, ok := byName[name]
			if !ok {
				return p, fmt.Errorf("unknown policy %q (want some of %s)", name, policyNames(sim.DefaultOutagePolicies()))
			}
			return p, nil
		})
		if err != nil {
			return usageError{err}
		}
		c.Policies = ps
	}
	c.Progress = e.progress(out.quiet, "outage")
	r, err := sim.Outage(c)
	if err != nil {
		return usageError{err}
	}
	return emit(e, out, r, func(file string) error {
		p := panel{title: fmt.Sprintf("attempts reaching the provider per %v window (capacity %g/s, 503 from %v to %v)",
			c.Window, c.Capacity, c.TriggerStart, c.TriggerEnd), xLabel: "time (s)", yLabel: "attempts per window",
			height: 13 * vg.Centimeter, legendLeft: true}
		for _, pr := range r.Policies {
			s := series{name: pr.Policy.Name}
			for i, n := range pr.Load {
				s.x = append(s.x, (time.Duration(i) * c.Window).Seconds())
				s.y = append(s.y, float64(n))
			}
			p.lines = append(p.lines, s)
		}
		return drawPanels(file, fmt.Sprintf("outage: %d clients x %g req/s", c.Clients, c.RatePerClient), []panel{p})
	})
}

func policyNames(ps []sim.OutagePolicy) string {
	names := make([]string, len(ps))
	for i, p := range ps {
		names[i] = p.Name
	}
	return strings.Join(names, ", ")
}

func runContention(args []string, e *env) error {
	c := sim.DefaultContentionConfig()
	var out output
	clients := ""
	strategies := ""
	fs := newFlagSet("sim contention",
		"The AWS Architecture Blog experiment: N clients each update one shared row once with\n"+
			"optimistic concurrency, backing off on conflict. Prints total write calls and time to\n"+
			"completion, averaged over the runs, per backoff strategy and N.", e)
	fs.StringVar(&clients, "clients", "10-150/10", "values of N: a list (10,20,50) or a range FROM-TO/STEP")
	fs.IntVar(&c.Runs, "runs", c.Runs, "runs averaged per point")
	fs.DurationVar(&c.Base, "base", c.Base, "backoff base")
	fs.DurationVar(&c.Cap, "cap", c.Cap, "backoff cap")
	fs.DurationVar(&c.DelayMean, "delay", c.DelayMean, "mean network delay per hop")
	fs.DurationVar(&c.DelayStdDev, "delay-stddev", c.DelayStdDev, "standard deviation of the delay per hop")
	fs.StringVar(&strategies, "strategies", "", "comma-separated strategies among none, exponential, full, equal, decorrelated (default all)")
	fs.Uint64Var(&c.Seed, "seed", c.Seed, "seed")
	out.register(fs)
	if err := fs.parse(args); err != nil {
		return err
	}
	if err := out.validate(); err != nil {
		return err
	}
	ns, err := parseInts(clients)
	if err != nil {
		return usageError{fmt.Errorf("-clients: %w", err)}
	}
	c.Clients = ns
	if strategies != "" {
		ss, err := parseList(strategies, sim.ParseContentionStrategy)
		if err != nil {
			return usageError{err}
		}
		c.Strategies = ss
	}
	c.Progress = e.progress(out.quiet, "contention")
	r, err := sim.Contention(c)
	if err != nil {
		return usageError{err}
	}
	return emit(e, out, r, func(file string) error {
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
		return drawPanels(file, fmt.Sprintf("optimistic concurrency, %d runs per point", c.Runs), []panel{calls, done})
	})
}

// parseList parses a comma-separated list, each item (spaces trimmed) with
// parse.
func parseList[T any](s string, parse func(string) (T, error)) ([]T, error) {
	var out []T
	for _, item := range strings.Split(s, ",") {
		v, err := parse(strings.TrimSpace(item))
		if err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	return out, nil
}

// parseInts parses "10,20,50" or "10-150/10".
func parseInts(s string) ([]int, error) {
	if from, rest, ok := strings.Cut(s, "-"); ok {
		to, step, hasStep := strings.Cut(rest, "/")
		if !hasStep {
			step = "1"
		}
		a, err1 := strconv.Atoi(from)
		b, err2 := strconv.Atoi(to)
		d, err3 := strconv.Atoi(step)
		if err1 != nil || err2 != nil || err3 != nil || d <= 0 || b < a || (b-a)/d > 10000 {
			return nil, fmt.Errorf("bad range %q (want FROM-TO/STEP, e.g. 10-150/10)", s)
		}
		var out []int
		for n := a; n <= b; n += d {
			out = append(out, n)
		}
		return out, nil
	}
	return parseList(s, func(f string) (int, error) {
		n, err := strconv.Atoi(f)
		if err != nil {
			return 0, fmt.Errorf("bad number %q in %q", f, s)
		}
		return n, nil
	})
}
