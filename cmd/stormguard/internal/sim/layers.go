package sim

import (
	"bufio"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"time"

	"github.com/stormguard/stormguard/budget"
)

// Limits on [LayersConfig], so that the exact columns are counted, not
// estimated, in reasonable time.
const (
	// MaxLayers is the largest LayersConfig.Layers.
	MaxLayers = 10
	// MaxLayerCalls bounds Attempts^Layers, the calls one user request can
	// cause at the bottom.
	MaxLayerCalls = 1_000_000
)

// LayersConfig describes the layer amplification experiment: a user request
// enters layer 1 (say a gateway), which calls layer 2 (orders), and so on;
// layer L calls the bottom dependency (the bank API), which fails every
// call with a retryable error. Each layer tries its dependency up to
// Attempts times per request it handles.
//
// Four ways to run the chain are counted, for each L from 1 to Layers:
//
//   - naive: every layer retries; the bottom sees Attempts^L calls per
//     user request (exact: one request is walked through the chain);
//   - signal: a layer that gives up tells its caller "overloaded; don't
//     retry" and honours that signal from below, so only the layer right
//     above the bottom retries: Attempts calls (exact);
//   - budget: every layer has its own per-client retry budget (package
//     budget, a ratio of retries to requests over a sliding window, plus a
//     small floor of retries per second); simulated over a Poisson stream
//     of user requests at Rate for Duration;
//   - signal+budget: both.
//
// The model does not sleep between attempts: backoff delays move calls in
// time but do not change how many reach the bottom, so every call caused by
// one user request happens at that request's arrival time. Latency,
// timeouts and the load's effect on the bottom are left out (see [Outage]
// for those).
type LayersConfig struct {
	// Layers is the deepest chain simulated (rows 1..Layers); it must be
	// in [1, MaxLayers].
	Layers int `json:"layers"`
	// Attempts is every layer's limit of tries per request, the first
	// included; it must be positive and Attempts^Layers at most
	// MaxLayerCalls.
	Attempts int `json:"attempts"`
	// Rate is the user requests per second of the one high-volume client in
	// the budget columns; it must be positive.
	Rate float64 `json:"rate_per_s"`
	// Duration is the simulated time of the budget columns; it must be
	// positive and greater than Warmup.
	Duration time.Duration `json:"duration_ns"`
	// Warmup is left out of the budget columns' figures: the budgets start
	// empty, so the first window is not steady state. It must not be
	// negative.
	Warmup time.Duration `json:"warmup_ns"`
	// Budget configures every layer's retry budget.
	Budget BudgetSettings `json:"budget"`
	// Seed seeds the arrival stream (math/rand/v2 PCG).
	Seed uint64 `json:"seed"`
}

// DefaultLayersConfig returns 4 layers of 3 attempts (the story's 3, 9, 27,
// 81) and, for the budget columns, a client sending 1000 requests/s for
// 20 s of which the first 10 s (the warm-up) are left out, budgets as
// [DefaultBudgetSettings], seed 42.
func DefaultLayersConfig() LayersConfig {
	return LayersConfig{
		Layers:   4,
		Attempts: 3,
		Rate:     1000,
		Duration: 20 * time.Second,
		Warmup:   10 * time.Second,
		Budget:   DefaultBudgetSettings(),
		Seed:     42,
	}
}

// LayersResult is the outcome of [Layers].
type LayersResult struct {
	// Config is the configuration that ran.
	Config LayersConfig `json:"config"`
	// Rows holds one row per chain depth L = 1..Layers.
	Rows []LayersRow `json:"rows"`
}

// LayersRow gives the calls that reach the failing bottom per user request
// with L layers between the user and the bottom, each way of running the
// chain (see [LayersConfig]).
type LayersRow struct {
	// Layers is L.
	Layers int `json:"layers"`
	// Naive is the calls per user request when every layer retries:
	// Attempts^L, exact.
	Naive int64 `json:"naive"`
	// Signal is the calls per user request when layers pass the don't-retry
	// signal up: Attempts, exact.
	Signal int64 `json:"signal"`
	// Budget is the mean calls per user request, in steady state, when
	// every layer has its own retry budget: about (1+Ratio)^L.
	Budget float64 `json:"budget"`
	// SignalBudget is Budget with the don't-retry signal as well: only the
	// bottom layer retries, within its budget, about 1+Ratio.
	SignalBudget float64 `json:"signal_budget"`
}

// Layers runs the layer amplification experiment described at
// [LayersConfig]. It is deterministic for a given config, and returns an
// error wrapping [ErrInvalidConfig] for settings it cannot run. It shares
// no state between calls, so it is safe for concurrent use.
func Layers(c LayersConfig) (*LayersResult, error) {
	switch {
	case c.Layers < 1 || c.Layers > MaxLayers:
		return nil, fmt.Errorf("%w: layers %d must be in [1, %d]", ErrInvalidConfig, c.Layers, MaxLayers)
	case c.Attempts < 1:
		return nil, fmt.Errorf("%w: attempts %d must be positive", ErrInvalidConfig, c.Attempts)
	case math.Pow(float64(c.Attempts), float64(c.Layers)) > MaxLayerCalls:
		return nil, fmt.Errorf("%w: attempts^layers = %d^%d exceeds %d", ErrInvalidConfig, c.Attempts, c.Layers, MaxLayerCalls)
	case !(c.Rate > 0) || math.IsInf(c.Rate, 0):
		return nil, fmt.Errorf("%w: rate %v must be positive and finite", ErrInvalidConfig, c.Rate)
	case c.Warmup < 0:
		return nil, fmt.Errorf("%w: warmup %v must not be negative", ErrInvalidConfig, c.Warmup)
	case c.Duration <= c.Warmup:
		return nil, fmt.Errorf("%w: duration %v must exceed warmup %v", ErrInvalidConfig, c.Duration, c.Warmup)
	case float64(c.Duration)/float64(time.Second)*c.Rate > maxLayerRequests:
		return nil, fmt.Errorf("%w: rate %v for %v is more than %d requests", ErrInvalidConfig, c.Rate, c.Duration, maxLayerRequests)
	}
	if _, err := c.Budget.build(fixedClock); err != nil {
		return nil, err
	}
	res := &LayersResult{Config: c, Rows: make([]LayersRow, 0, c.Layers)}
	for l := 1; l <= c.Layers; l++ {
		row := LayersRow{Layers: l}
		// The exact columns: walk one user request through the chain.
		row.Naive = chain{layers: l, attempts: c.Attempts}.request(epoch)
		row.Signal = chain{layers: l, attempts: c.Attempts, signal: true}.request(epoch)
		var err error
		if row.Budget, err = c.simulate(l, false); err != nil {
			return nil, err
		}
		if row.SignalBudget, err = c.simulate(l, true); err != nil {
			return nil, err
		}
		res.Rows = append(res.Rows, row)
	}
	return res, nil
}

// maxLayerRequests bounds the user requests of one budget simulation.
const maxLayerRequests = 10_000_000

// epoch is t=0 of every simulation's clock, as a time.Time for the budget
// and the breaker.
var epoch = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// fixedClock reads epoch, for guards built only to check their settings.
func fixedClock() time.Time { return epoch }

// simulate runs the budget column for l layers and returns the mean calls
// at the bottom per user request arriving after the warm-up.
func (c LayersConfig) simulate(l int, signal bool) (float64, error) {
	ch := chain{layers: l, attempts: c.Attempts, signal: signal, budgets: make([]*budget.Budget, l)}
	now := epoch // the budgets' clock: slice 0 starts at epoch
	for i := range ch.budgets {
		b, err := c.Budget.build(func() time.Time { return now })
		if err != nil {
			return 0, err
		}
		ch.budgets[i] = b
	}
	rng := rand.New(rand.NewPCG(c.Seed, uint64(l)))
	mean := float64(time.Second) / c.Rate // mean gap between requests, ns
	var calls, requests int64
	// Arrival times are summed in float64, so a very long gap cannot
	// overflow.
	for t := rng.ExpFloat64() * mean; t < float64(c.Duration); t += rng.ExpFloat64() * mean {
		at := time.Duration(t)
		now = epoch.Add(at)
		n := ch.request(now)
		if at >= c.Warmup {
			calls += n
			requests++
		}
	}
	if requests == 0 {
		return 0, fmt.Errorf("%w: no user request arrived after the warm-up (%v of %v at %v a second): nothing to average", ErrInvalidConfig, c.Warmup, c.Duration, c.Rate)
	}
	return float64(calls) / float64(requests), nil
}

// chain is a stack of layers over a failing bottom. It is not safe for
// concurrent use (the budgets are, but the model runs on one goroutine).
type chain struct {
	layers   int
	attempts int
	signal   bool             // layers pass "don't retry" up, and honour it
	budgets  []*budget.Budget // per layer; nil means no budget
}

// request sends one user request into layer 1 at t and returns how many
// calls reached the bottom.
func (ch chain) request(t time.Time) int64 {
	var calls int64
	ch.handle(0, t, &calls)
	return calls
}

// handle is layer k (0-based) handling one request at t. Every request
// fails in the end, since the bottom always fails; handle reports whether
// the failure carries the don't-retry signal.
func (ch chain) handle(k int, t time.Time, calls *int64) (dontRetry bool) {
	var b *budget.Budget
	if ch.budgets != nil {
		b = ch.budgets[k]
		b.Deposit() // at t: the budgets' clock reads it
	}
	for attempt := 1; attempt <= ch.attempts; attempt++ {
		if attempt > 1 && b != nil && !b.Withdraw() {
			break // budget spent: fail fast
		}
		var stop bool
		if k+1 == ch.layers {
			*calls++ // the bottom fails with a plain retryable error
		} else {
			stop = ch.handle(k+1, t, calls)
		}
		if stop && ch.signal {
			break // the layer below said: overloaded, don't retry
		}
	}
	return ch.signal
}

// WriteText writes the result as a table: one row per number of layers,
// the calls at the bottom per user request for each way of running the
// chain.
func (r *LayersResult) WriteText(w io.Writer) error {
	c := r.Config
	bw := bufio.NewWriter(w)
	fmt.Fprintf(bw, "calls at a failing bottom per user request, %d attempts per layer\n", c.Attempts)
	fmt.Fprintf(bw, "budget: ratio %g, floor %g/s, window %v, one client at %g req/s for %v (first %v left out), seed %d\n\n",
		c.Budget.Ratio, c.Budget.MinPerSecond, c.Budget.Window, c.Rate, c.Duration, c.Warmup, c.Seed)
	fmt.Fprintf(bw, "%6s %10s %10s %10s %14s\n", "layers", "naive", "signal", "budget", "signal+budget")
	for _, row := range r.Rows {
		fmt.Fprintf(bw, "%6d %10d %10d %9.3fx %13.3fx\n", row.Layers, row.Naive, row.Signal, row.Budget, row.SignalBudget)
	}
	return bw.Flush()
}
