package main

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/cmd/stormguard/internal/live"
	"github.com/stormguard/stormguard/httpretry"
)

// sampleEvery is how often a running run's circuit breakers are read for
// the live page.
const sampleEvery = 100 * time.Millisecond

// board is the demo as it happens, for the live page (--serve): for each
// run, what its provider has counted so far, the state of its clients'
// circuit breakers and the calls waiting behind them, and its fleet's
// calls; the run's summary once it is over. It is safe for concurrent use.
type board struct {
	cfg  demoConfig
	runs []*runWatch
	done atomic.Bool
}

// newBoard returns a board of runs named names, none started yet.
func newBoard(cfg demoConfig, names []string) *board {
	b := &board{cfg: cfg}
	for _, n := range names {
		b.runs = append(b.runs, &runWatch{name: n})
	}
	return b
}

// runWatch is one run of the board.
type runWatch struct {
	name string
	// guards reads the run's circuit breakers; set before the run starts.
	guards *guardWatch
	// offered, succeeded and failed count the fleet's calls so far.
	offered, succeeded, failed atomic.Int64

	mu       sync.Mutex
	provider *live.Provider // nil until the run starts
	start    time.Time
	samples  []breakerSample
	result   *live.Result // set when the run is over
	took     time.Duration
}

// watchCall counts the calls of call in w.
func (w *runWatch) watchCall(call live.Call) live.Call {
	return func(ctx context.Context) error {
		w.offered.Add(1)
		err := call(ctx)
		if err == nil {
			w.succeeded.Add(1)
		} else {
			w.failed.Add(1)
		}
		return err
	}
}

// started records the run's provider and samples its breakers every
// sampleEvery until stop is closed.
func (w *runWatch) started(p *live.Provider, start time.Time, stop <-chan struct{}) {
	w.mu.Lock()
	w.provider, w.start = p, start
	w.mu.Unlock()
	if w.guards == nil {
		return
	}
	go func() {
		t := time.NewTicker(sampleEvery)
		defer t.Stop()
		for {
			w.sample(start)
			select {
			case <-stop:
				return
			case <-t.C:
			}
		}
	}()
}

// sample reads the run's breakers once.
func (w *runWatch) sample(start time.Time) {
	s, ok := w.guards.sample()
	if !ok {
		return
	}
	s.At = time.Since(start)
	w.mu.Lock()
	w.samples = append(w.samples, s)
	w.mu.Unlock()
}

// finished records the run's result.
func (w *runWatch) finished(r *live.Result) {
	w.mu.Lock()
	w.result, w.took = r, time.Since(w.start)
	w.mu.Unlock()
}

// guardWatch holds the stormguard transports a run made, to read their
// circuit breakers. It is safe for concurrent use.
type guardWatch struct {
	mu sync.Mutex
	ts []*httpretry.Transport
}

// add watches t.
func (g *guardWatch) add(t *httpretry.Transport) {
	g.mu.Lock()
	g.ts = append(g.ts, t)
	g.mu.Unlock()
}

// breakerSample counts a run's circuit breakers by state, and the calls
// waiting behind them, at one moment.
type breakerSample struct {
	// At is the moment, since the run's start.
	At       time.Duration `json:"at_ns"`
	Closed   int           `json:"closed"`
	HalfOpen int           `json:"half_open"`
	Open     int           `json:"open"`
	// Waiting is the calls waiting for an open breaker.
	Waiting int `json:"waiting"`
}

// sample counts the breakers of every host of every transport; ok is
// false when there is none yet.
func (g *guardWatch) sample() (s breakerSample, ok bool) {
	g.mu.Lock()
	ts := g.ts
	g.mu.Unlock()
	for _, t := range ts {
		for _, g := range t.Hosts() {
			if g.Breaker == nil {
				continue
			}
			ok = true
			b := g.Breaker.Snapshot()
			switch b.State {
			case breaker.Open:
				s.Open++
			case breaker.HalfOpen:
				s.HalfOpen++
			default:
				s.Closed++
			}
			s.Waiting += b.Waiters
		}
	}
	return s, ok
}

// boardJSON is the board as the page reads it (GET /data.json).
type boardJSON struct {
	Config demoConfig `json:"config"`
	// Done reports whether every run is over.
	Done bool      `json:"done"`
	Runs []runJSON `json:"runs"`
}

// runJSON is one run on the page.
type runJSON struct {
	Name string `json:"name"`
	// State is "waiting" (not started), "running" or "done".
	State string `json:"state"`
	// Elapsed is the time since the run started (its length once done).
	Elapsed time.Duration `json:"elapsed_ns"`
	// Attempts counts the attempts that reached the provider per window
	// (config.window_ns), from the run's start up to Elapsed.
	Attempts []int64 `json:"attempts"`
	// Breakers samples the run's circuit breakers; empty for a client
	// without one.
	Breakers []breakerSample `json:"breakers"`
	// Offered, Succeeded and Failed count the fleet's calls so far
	// (Offered - Succeeded - Failed are under way).
	Offered   int64 `json:"offered"`
	Succeeded int64 `json:"succeeded"`
	Failed    int64 `json:"failed"`
	// Summary is the run's summary, once it is done: the headline figures
	// are its outage_amplification and goodput.
	Summary *live.Summary `json:"summary,omitempty"`
}

// snapshot returns the board as it is now.
func (b *board) snapshot() boardJSON {
	out := boardJSON{Config: b.cfg, Done: b.done.Load(), Runs: make([]runJSON, len(b.runs))}
	for i, w := range b.runs {
		out.Runs[i] = w.snapshot(b.cfg.Window)
	}
	return out
}

func (w *runWatch) snapshot(window time.Duration) runJSON {
	w.mu.Lock()
	p, start, res, took := w.provider, w.start, w.result, w.took
	r := runJSON{Name: w.name, State: "waiting", Attempts: []int64{}, Breakers: append([]breakerSample{}, w.samples...)}
	w.mu.Unlock()
	// Counted after the lock, so that the result (if set) holds every call
	// counted here.
	r.Offered, r.Succeeded, r.Failed = w.offered.Load(), w.succeeded.Load(), w.failed.Load()
	if p == nil {
		return r
	}
	ws := p.Windows()
	r.State, r.Elapsed = "running", time.Since(start)
	if res != nil {
		ws, r.State, r.Elapsed, r.Summary = res.Windows, "done", took, &res.Summary
		r.Offered, r.Succeeded, r.Failed = res.Stats.Offered, res.Stats.Succeeded, res.Stats.Failed
	}
	n := min(len(ws), int(r.Elapsed/window)+1)
	for _, win := range ws[:n] {
		r.Attempts = append(r.Attempts, win.Attempts)
	}
	return r
}
