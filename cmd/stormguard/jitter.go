package main

import (
	"fmt"
	"time"

	"github.com/stormguard/stormguard/cmd/stormguard/internal/sim"
)

// Limits of `sim jitter`. A retry costs well under a microsecond to draw
// and count but, with windows so narrow that every retry has its own, a
// histogram bin of about 90 bytes of --json: at the limit, 4 strategies x
// 250,000 retries print about 90 MB of JSON in a few seconds with a peak
// of about 400 MB. Durations stay far from overflowing a client's clock
// (100 rounds x 1 h).
const (
	maxJitterRetries  = 250_000 // clients x rounds, per strategy
	maxJitterRounds   = 100
	maxJitterDuration = time.Hour
)

func prepareJitter(args []string, e *env) (func() error, error) {
	c := sim.DefaultJitterConfig()
	var out output
	strategies := "none,full,equal,decorrelated"
	seed := uint64(c.Seed)
	fs := newFlagSet("sim jitter",
		"Clients that all failed at t=0 retry ROUNDS times, each sleeping its backoff delay after\n"+
			"its own previous retry; retries are counted per window. With the defaults this prints\n"+
			"the reference table of docs/backoff.md (mulberry32 seeded 42, a fresh generator per strategy).",
		fmt.Sprintf("clients x rounds at most %d (a few seconds and a few hundred MB at most).", maxJitterRetries), e)
	fs.intVar(&c.Clients, "clients", 1, maxJitterRetries, "number of clients")
	fs.intVar(&c.Rounds, "rounds", 1, maxJitterRounds, "retries per client")
	fs.durationVar(&c.Window, "window", time.Microsecond, maxJitterDuration, "width of a counting window")
	fs.durationVar(&c.Base, "base", time.Microsecond, maxJitterDuration, "backoff base")
	fs.durationVar(&c.Cap, "cap", time.Microsecond, maxJitterDuration, "backoff cap, at least the base")
	fs.uint64Var(&seed, "seed", 1<<32-1, "mulberry32 seed")
	fs.StringVar(&strategies, "strategies", strategies, "comma-separated strategies among none, full, equal, decorrelated")
	out.register(fs)
	if err := fs.parse(args); err != nil {
		return nil, err
	}
	if err := out.validate(); err != nil {
		return nil, err
	}
	switch {
	case c.Cap < c.Base:
		return nil, usageError{fmt.Errorf("-cap %v must be at least -base %v", fmtDuration(c.Cap), fmtDuration(c.Base))}
	case c.Clients*c.Rounds > maxJitterRetries: // at most 250,000 x 100: no overflow
		return nil, usageError{fmt.Errorf("-clients %d x -rounds %d is %d retries per strategy, at most %d",
			c.Clients, c.Rounds, c.Clients*c.Rounds, maxJitterRetries)}
	}
	c.Seed = uint32(seed)
	ss, err := parseList("strategies", strategies, byName("strategy", sim.JitterStrategies()))
	if err != nil {
		return nil, usageError{err}
	}
	c.Strategies = ss
	return simWork(e, out, func() (*sim.JitterResult, error) { return sim.Jitter(c) }, jitterChart), nil
}

// maxBars is the most bars a chart draws per series over its time axis:
// more would be narrower than a pixel.
const maxBars = 1000

// jitterChart draws, per strategy, retries per window for each round. When
// a strategy's retries span more than maxBars windows, its bars merge
// neighbouring windows (and say so on the axis).
func jitterChart(r *sim.JitterResult, file string) error {
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	panels := make([]panel, 0, len(r.Strategies))
	for _, s := range r.Strategies {
		var last time.Duration
		for _, rr := range s.Rounds {
			if n := len(rr.Histogram); n > 0 {
				last = max(last, rr.Histogram[n-1].Start)
			}
		}
		width := r.Config.Window * (last/r.Config.Window/maxBars + 1)
		p := panel{title: s.Strategy.String() + " jitter", xLabel: "time since all failed (ms)",
			yLabel: "retries per " + fmtDuration(width) + " window", barWidth: ms(width)}
		for _, rr := range s.Rounds {
			ser := series{name: fmt.Sprintf("retry %d", rr.Round)}
			for _, b := range rr.Histogram { // in time order
				x := ms(b.Start / width * width)
				if n := len(ser.x); n > 0 && ser.x[n-1] == x {
					ser.y[n-1] += float64(b.Count)
					continue
				}
				ser.x = append(ser.x, x)
				ser.y = append(ser.y, float64(b.Count))
			}
			p.bars = append(p.bars, ser)
		}
		panels = append(panels, p)
	}
	return drawPanels(file, fmt.Sprintf("%d clients fail at t=0: retries per window (seed %d)", r.Config.Clients, r.Config.Seed), panels)
}
