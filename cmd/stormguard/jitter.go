package main

import (
	"fmt"
	"time"

	"github.com/stormguard/stormguard/backoff"
	"github.com/stormguard/stormguard/internal/sim"
)

func runJitter(args []string, e *env) error {
	c := sim.DefaultJitterConfig()
	var out output
	strategies := "none,full,equal,decorrelated"
	var seed uint
	fs := newFlagSet("sim jitter",
		"Clients that all failed at t=0 retry ROUNDS times, each sleeping its backoff delay after\n"+
			"its own previous retry; retries are counted per window. With the defaults this prints\n"+
			"the seed's table (mulberry32 seeded 42, a fresh generator per strategy).", e)
	fs.IntVar(&c.Clients, "clients", c.Clients, "number of clients")
	fs.IntVar(&c.Rounds, "rounds", c.Rounds, "retries per client")
	fs.DurationVar(&c.Window, "window", c.Window, "width of a counting window")
	fs.DurationVar(&c.Base, "base", c.Base, "backoff base")
	fs.DurationVar(&c.Cap, "cap", c.Cap, "backoff cap")
	fs.UintVar(&seed, "seed", uint(c.Seed), "mulberry32 seed (0 to 4294967295)")
	fs.StringVar(&strategies, "strategies", strategies, "comma-separated strategies among none, full, equal, decorrelated")
	out.register(fs)
	if err := fs.parse(args); err != nil {
		return err
	}
	if err := out.validate(); err != nil {
		return err
	}
	if seed > 1<<32-1 {
		return usageError{fmt.Errorf("-seed %d does not fit in 32 bits", seed)}
	}
	c.Seed = uint32(seed)
	ss, err := parseList(strategies, backoff.ParseStrategy)
	if err != nil {
		return usageError{err}
	}
	c.Strategies = ss
	r, err := sim.Jitter(c)
	if err != nil {
		return usageError{err}
	}
	return emit(e, out, r, func(file string) error { return jitterChart(r, file) })
}

// jitterChart draws, per strategy, retries per window for each round.
func jitterChart(r *sim.JitterResult, file string) error {
	panels := make([]panel, 0, len(r.Strategies))
	window := float64(r.Config.Window) / float64(time.Millisecond)
	for _, s := range r.Strategies {
		p := panel{title: s.Strategy.String() + " jitter", xLabel: "time since all failed (ms)", yLabel: "retries per " + r.Config.Window.String() + " window"}
		for _, rr := range s.Rounds {
			ser := series{name: fmt.Sprintf("retry %d", rr.Round)}
			for _, b := range rr.Histogram {
				ser.x = append(ser.x, float64(b.Start)/float64(time.Millisecond))
				ser.y = append(ser.y, float64(b.Count))
			}
			p.bars = append(p.bars, ser)
		}
		p.barWidth = window
		panels = append(panels, p)
	}
	return drawPanels(file, fmt.Sprintf("%d clients fail at t=0: retries per window (seed %d)", r.Config.Clients, r.Config.Seed), panels)
}
