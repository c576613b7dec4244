// Package sim shows retry storms by simulation: how retries of many clients
// cluster in time, multiply across layers, and keep a recovering dependency
// down, and how each stormguard measure tames them.
//
// Every simulation is deterministic for a given seed and uses the library's
// own building blocks (the backoff strategies, the budget, the breaker), so a
// figure it prints is a figure of the code you would deploy.
package sim

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"time"

	"github.com/stormguard/stormguard/backoff"
)

// Limits on a [JitterConfig], so that a run stays within memory and time
// and no client's simulated time overflows.
const (
	// MaxJitterRounds bounds JitterConfig.Rounds.
	MaxJitterRounds = 1000
	// MaxJitterCap bounds JitterConfig.Base and Cap: MaxJitterRounds
	// delays of at most MaxJitterCap each add up to far less than the
	// largest time.Duration.
	MaxJitterCap = 24 * time.Hour
	// MaxJitterRetries bounds Clients·Rounds·len(Strategies), the retries
	// drawn. It also bounds the histogram bins of the result (one per
	// occupied window, 16 bytes each): 256 MB at most.
	MaxJitterRetries = 16_000_000
)

// JitterConfig describes the jitter clustering experiment: Clients clients
// all fail at t=0; each then retries Rounds times, sleeping its backoff delay
// after its own previous retry; retries are counted per Window.
type JitterConfig struct {
	// Clients is the number of clients; it must be positive, and
	// Clients·Rounds·len(Strategies) at most MaxJitterRetries.
	Clients int `json:"clients"`
	// Rounds is the number of retries per client, in [1,
	// MaxJitterRounds].
	Rounds int `json:"rounds"`
	// Window is the width of a counting window; it must be positive.
	Window time.Duration `json:"window_ns"`
	// Base and Cap configure the backoff (see package backoff, which
	// gives 0 its default); neither may exceed MaxJitterCap.
	Base time.Duration `json:"base_ns"`
	Cap  time.Duration `json:"cap_ns"`
	// Seed seeds a fresh mulberry32 generator (the original JavaScript
	// simulation's, reproduced bit for bit) for each strategy.
	Seed uint32 `json:"seed"`
	// Strategies are simulated in this order; empty means
	// [JitterStrategies] (none, full, equal, decorrelated). A strategy
	// listed twice is simulated twice.
	Strategies []backoff.Strategy `json:"strategies"`
}

// DefaultJitterConfig returns the experiment of the reference table in
// docs/backoff.md: 1000 clients, 4 rounds, 50 ms windows, base 100 ms, cap
// 10 s, seed 42, all four strategies.
func DefaultJitterConfig() JitterConfig {
	return JitterConfig{
		Clients:    1000,
		Rounds:     4,
		Window:     50 * time.Millisecond,
		Base:       100 * time.Millisecond,
		Cap:        10 * time.Second,
		Seed:       42,
		Strategies: JitterStrategies(),
	}
}

// JitterStrategies returns every backoff strategy in the order of the
// reference table in docs/backoff.md: none, full, equal, decorrelated.
func JitterStrategies() []backoff.Strategy {
	return []backoff.Strategy{backoff.NoJitter, backoff.FullJitter, backoff.EqualJitter, backoff.Decorrelated}
}

// ErrInvalidConfig is wrapped by the errors simulations return for settings
// they cannot run.
var ErrInvalidConfig = errors.New("sim: invalid config")

// JitterResult is the outcome of [Jitter].
type JitterResult struct {
	Config     JitterConfig     `json:"config"`
	Strategies []StrategyResult `json:"results"`
}

// StrategyResult holds one strategy's rounds.
type StrategyResult struct {
	Strategy backoff.Strategy `json:"strategy"`
	Rounds   []RoundResult    `json:"rounds"`
}

// RoundResult describes where the retries of one round landed.
type RoundResult struct {
	// Round is the retry number, 1 for the first retry.
	Round int `json:"round"`
	// Occupied is the number of windows that received at least one retry.
	Occupied int `json:"occupied_windows"`
	// Peak is the largest number of retries in one window.
	Peak int `json:"peak"`
	// Histogram lists the occupied windows in time order.
	Histogram []Bin `json:"histogram"`
}

// Bin is one occupied window: it starts at Start (time since t=0) and holds
// Count retries.
type Bin struct {
	Start time.Duration `json:"start_ns"`
	Count int           `json:"count"`
}

// Jitter runs the jitter clustering experiment. Draws are made round by
// round (retry 1 of every client, then retry 2 of every client, ...) from a
// fresh mulberry32 per strategy, which is how the reference table was made.
func Jitter(c JitterConfig) (*JitterResult, error) {
	if len(c.Strategies) == 0 {
		c.Strategies = JitterStrategies()
	}
	switch {
	case c.Clients <= 0:
		return nil, fmt.Errorf("%w: clients %d must be positive", ErrInvalidConfig, c.Clients)
	case c.Rounds <= 0 || c.Rounds > MaxJitterRounds:
		return nil, fmt.Errorf("%w: rounds %d must be in [1, %d]", ErrInvalidConfig, c.Rounds, MaxJitterRounds)
	case c.Clients > MaxJitterRetries/(c.Rounds*len(c.Strategies)):
		return nil, fmt.Errorf("%w: %d clients x %d rounds x %d strategies is more than %d retries",
			ErrInvalidConfig, c.Clients, c.Rounds, len(c.Strategies), MaxJitterRetries)
	case c.Window <= 0:
		return nil, fmt.Errorf("%w: window %v must be positive", ErrInvalidConfig, c.Window)
	case c.Base > MaxJitterCap || c.Cap > MaxJitterCap:
		return nil, fmt.Errorf("%w: base %v and cap %v must be at most %v", ErrInvalidConfig, c.Base, c.Cap, MaxJitterCap)
	}
	res := &JitterResult{Config: c}
	at := make([]time.Duration, c.Clients)      // time of each client's last retry
	seqs := make([]backoff.Sequence, c.Clients) // each client's delays
	windows := make([]int64, c.Clients)
	var counter windowCounter
	for _, s := range c.Strategies {
		b, err := backoff.New(backoff.Config{
			Strategy: s, Base: c.Base, Cap: c.Cap, Rand: (&mulberry32{state: c.Seed}).float64,
		})
		if err != nil {
			return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
		}
		clear(at)
		for i := range seqs {
			seqs[i] = b.Sequence()
		}
		sr := StrategyResult{Strategy: s, Rounds: make([]RoundResult, 0, c.Rounds)}
		for round := 1; round <= c.Rounds; round++ {
			for i := range at {
				at[i] += seqs[i].Next()
				windows[i] = int64(at[i] / c.Window)
			}
			rr := counter.count(windows, c.Window)
			rr.Round = round
			sr.Rounds = append(sr.Rounds, rr)
		}
		res.Strategies = append(res.Strategies, sr)
	}
	return res, nil
}

// windowCounter turns window indices into a histogram, reusing its buffers.
type windowCounter struct {
	dense  []int
	sorted []int64
}

func (w *windowCounter) count(idx []int64, width time.Duration) RoundResult {
	lo, hi := slices.Min(idx), slices.Max(idx)
	var rr RoundResult
	add := func(win int64, n int) {
		rr.Occupied++
		rr.Peak = max(rr.Peak, n)
		rr.Histogram = append(rr.Histogram, Bin{Start: time.Duration(win) * width, Count: n})
	}
	if span := hi - lo + 1; span <= int64(4*len(idx)+1024) {
		// Dense: one counter per window in range.
		if cap(w.dense) < int(span) {
			w.dense = make([]int, span)
		}
		dense := w.dense[:span]
		clear(dense)
		for _, x := range idx {
			dense[x-lo]++
		}
		for i, n := range dense {
			if n > 0 {
				add(lo+int64(i), n)
			}
		}
		return rr
	}
	// Sparse: sort and count runs.
	w.sorted = append(w.sorted[:0], idx...)
	slices.Sort(w.sorted)
	for i := 0; i < len(w.sorted); {
		j := i
		for j < len(w.sorted) && w.sorted[j] == w.sorted[i] {
			j++
		}
		add(w.sorted[i], j-i)
		i = j
	}
	return rr
}

// WriteText writes the result in the reference table's format: a header
// line, then for each strategy its name and one line per round.
func (r *JitterResult) WriteText(w io.Writer) error {
	c := r.Config
	bw := bufio.NewWriter(w)
	fmt.Fprintf(bw, "clients=%d all fail at t=0, base=%sms cap=%sms, window=%sms, seed=%d\n",
		c.Clients, millis(c.Base), millis(c.Cap), millis(c.Window), c.Seed)
	for _, s := range r.Strategies {
		fmt.Fprintf(bw, "\n%s\n", s.Strategy)
		for _, rr := range s.Rounds {
			fmt.Fprintf(bw, "  retry %d: occupied windows=%d, peak retries in one window=%d\n", rr.Round, rr.Occupied, rr.Peak)
		}
	}
	return bw.Flush()
}

// millis formats d as a number of milliseconds without trailing zeros.
func millis(d time.Duration) string {
	return strconv.FormatFloat(float64(d)/float64(time.Millisecond), 'f', -1, 64)
}
