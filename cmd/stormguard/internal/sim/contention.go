package sim

import (
	"bufio"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"runtime"
	"sync"
	"time"

	"github.com/stormguard/stormguard/backoff"
)

// ContentionStrategy is what a contention client does after a conflicting
// write, before it starts over. Its zero value is [ContentionNone].
//
// Note the naming: ContentionNone ("none") is no backoff at all, as in the
// AWS experiment, while ContentionExponential ("exponential") is capped
// exponential backoff without jitter, which package backoff calls
// [backoff.NoJitter] and whose String is also "none" there.
type ContentionStrategy uint8

const (
	// ContentionNone starts over at once, with no backoff.
	ContentionNone ContentionStrategy = iota
	// ContentionExponential sleeps exp(n) = min(cap, base·2^n): [backoff.NoJitter].
	ContentionExponential
	// ContentionFull sleeps U·exp(n): [backoff.FullJitter].
	ContentionFull
	// ContentionEqual sleeps exp(n)/2 + U·exp(n)/2: [backoff.EqualJitter].
	ContentionEqual
	// ContentionDecorrelated sleeps min(cap, base + U·(prev·3 − base)):
	// [backoff.Decorrelated].
	ContentionDecorrelated

	numContentionStrategies
)

var contentionNames = [numContentionStrategies]string{
	ContentionNone:         "none",
	ContentionExponential:  "exponential",
	ContentionFull:         "full",
	ContentionEqual:        "equal",
	ContentionDecorrelated: "decorrelated",
}

// ContentionStrategies returns every contention strategy in the order of
// the AWS post's charts: none, exponential, full, equal, decorrelated.
func ContentionStrategies() []ContentionStrategy {
	return []ContentionStrategy{
		ContentionNone, ContentionExponential, ContentionFull, ContentionEqual, ContentionDecorrelated,
	}
}

// String returns the strategy's name ("none", "exponential", "full",
// "equal", "decorrelated"), or "ContentionStrategy(N)" for an unknown value.
func (s ContentionStrategy) String() string {
	if s < numContentionStrategies {
		return contentionNames[s]
	}
	return fmt.Sprintf("ContentionStrategy(%d)", uint8(s))
}

// ParseContentionStrategy returns the strategy named s, as printed by
// [ContentionStrategy.String]. It is case-sensitive.
func ParseContentionStrategy(s string) (ContentionStrategy, error) {
	for i, name := range contentionNames {
		if name == s {
			return ContentionStrategy(i), nil
		}
	}
	return 0, fmt.Errorf("%w: unknown contention strategy %q (want none, exponential, full, equal or decorrelated)", ErrInvalidConfig, s)
}

// MarshalText implements [encoding.TextMarshaler].
func (s ContentionStrategy) MarshalText() ([]byte, error) {
	if s >= numContentionStrategies {
		return nil, fmt.Errorf("%w: unknown contention strategy %d", ErrInvalidConfig, uint8(s))
	}
	return []byte(s.String()), nil
}

// UnmarshalText implements [encoding.TextUnmarshaler], so a
// ContentionStrategy works with flag.TextVar and encoding/json.
func (s *ContentionStrategy) UnmarshalText(b []byte) error {
	v, err := ParseContentionStrategy(string(b))
	if err != nil {
		return err
	}
	*s = v
	return nil
}

// backoffStrategy maps a contention strategy with a backoff to package
// backoff's strategy; ok is false for ContentionNone.
func (s ContentionStrategy) backoffStrategy() (b backoff.Strategy, ok bool) {
	switch s {
	case ContentionExponential:
		return backoff.NoJitter, true
	case ContentionFull:
		return backoff.FullJitter, true
	case ContentionEqual:
		return backoff.EqualJitter, true
	case ContentionDecorrelated:
		return backoff.Decorrelated, true
	}
	return 0, false
}

// Limits on a [ContentionConfig], so that a sweep finishes in reasonable
// time: the cost of a run grows with the square of the number of clients.
const (
	// MaxContentionClients bounds each ContentionConfig.Clients entry.
	MaxContentionClients = 1000
	// MaxContentionRuns bounds ContentionConfig.Runs.
	MaxContentionRuns = 10_000
	// MaxContentionDuration bounds Cap, DelayMean and DelayStdDev.
	MaxContentionDuration = time.Hour
	// MaxContentionWork bounds Runs·len(Strategies)·ΣN² (the sum over the
	// Clients entries), the work of a sweep: a run with N clients makes at
	// most about N² write calls (N(N+1)/2 when every round is a dead heat),
	// and a unit of N² costs at most about 200 ns of simulation. At the
	// limit a sweep takes up to about 20 s on one core; the default sweep
	// is 62,000,000.
	MaxContentionWork = 100_000_000
)

// ContentionConfig describes the optimistic-concurrency experiment of the
// AWS Architecture Blog post "Exponential Backoff And Jitter" (Marc Brooker,
// 2015), rebuilt on package backoff.
//
// The model, as in the post's simulator: N clients start at t=0 and each
// updates one shared row exactly once. A client reads the row's version
// (one network hop to the server, one back), then sends a write conditional
// on that version (one hop there, one back). The server applies the write
// and bumps the version if the version still matches; otherwise the write is
// a conflict, and the client, once it hears so, sleeps its backoff delay
// for retry n (n = 1 after the first conflict) and starts over with a read.
// Every hop takes |Normal(DelayMean, DelayStdDev)|. The server does no work
// of its own and never queues: the model measures contention only, not load.
type ContentionConfig struct {
	// Clients lists the numbers of clients to simulate (the x axis). Each
	// entry must be in [1, MaxContentionClients]. Empty means 10, 20, ...,
	// 150.
	Clients []int `json:"clients"`
	// Runs is how many independent runs each (strategy, N) point averages;
	// it must be in [1, MaxContentionRuns], and Runs·len(Strategies)·ΣN²
	// at most MaxContentionWork.
	Runs int `json:"runs"`
	// Base and Cap configure the backoff (see package backoff); they are
	// checked even for ContentionNone. Cap is at most
	// MaxContentionDuration.
	Base time.Duration `json:"base_ns"`
	Cap  time.Duration `json:"cap_ns"`
	// DelayMean and DelayStdDev describe the network delay of one hop; both
	// must be in [0, MaxContentionDuration].
	DelayMean   time.Duration `json:"delay_mean_ns"`
	DelayStdDev time.Duration `json:"delay_stddev_ns"`
	// Seed seeds every run: run r of strategy s at N clients draws from a
	// math/rand/v2 PCG seeded with (Seed, s<<48 | N<<16 | r), so each point
	// is reproducible on its own.
	Seed uint64 `json:"seed"`
	// Strategies are simulated in this order; empty means
	// [ContentionStrategies].
	Strategies []ContentionStrategy `json:"strategies"`
	// Progress, if set, is called after each point (strategy, N) with the
	// number of points done and the total, never concurrently. It is not
	// part of the result.
	Progress func(done, total int) `json:"-"`
}

// DefaultContentionConfig returns the AWS post's settings: N = 10, 20, ...,
// 150, 100 runs per point, base 5 ms, cap 2 s, hop delay |Normal(10 ms,
// 2 ms)|, seed 42, all five strategies.
func DefaultContentionConfig() ContentionConfig {
	clients := make([]int, 0, 15)
	for n := 10; n <= 150; n += 10 {
		clients = append(clients, n)
	}
	return ContentionConfig{
		Clients:     clients,
		Runs:        100,
		Base:        5 * time.Millisecond,
		Cap:         2 * time.Second,
		DelayMean:   10 * time.Millisecond,
		DelayStdDev: 2 * time.Millisecond,
		Seed:        42,
		Strategies:  ContentionStrategies(),
	}
}

// ContentionResult is the outcome of [Contention]: one series per strategy,
// each with one point per number of clients, in the order of the config.
type ContentionResult struct {
	// Config is the configuration that ran, with defaults filled in.
	Config ContentionConfig `json:"config"`
	// Series holds one entry per strategy.
	Series []ContentionSeries `json:"results"`
}

// ContentionSeries holds one strategy's points.
type ContentionSeries struct {
	// Strategy is the strategy every client of these runs used.
	Strategy ContentionStrategy `json:"strategy"`
	// Points holds one point per ContentionConfig.Clients entry, in order.
	Points []ContentionPoint `json:"points"`
}

// ContentionPoint is one (strategy, N) cell, averaged over the runs.
type ContentionPoint struct {
	// Clients is N.
	Clients int `json:"clients"`
	// Calls is the mean number of conditional writes the server received
	// per run (the post's "work"); at least N, since every client succeeds
	// exactly once.
	Calls float64 `json:"calls"`
	// Completion is the mean time from t=0 until the last client heard
	// that its write succeeded.
	Completion time.Duration `json:"completion_ns"`
}

// Contention runs the optimistic-concurrency experiment described at
// [ContentionConfig]. It is deterministic for a given config, whatever the
// number of CPUs: the points are computed on up to GOMAXPROCS goroutines,
// each from its own seeds. It returns an error wrapping [ErrInvalidConfig]
// for settings it cannot run. It is safe for concurrent use.
func Contention(c ContentionConfig) (*ContentionResult, error) {
	if len(c.Clients) == 0 {
		c.Clients = DefaultContentionConfig().Clients
	}
	if len(c.Strategies) == 0 {
		c.Strategies = ContentionStrategies()
	}
	switch {
	case c.Runs <= 0 || c.Runs > MaxContentionRuns:
		return nil, fmt.Errorf("%w: runs %d must be in [1, %d]", ErrInvalidConfig, c.Runs, MaxContentionRuns)
	case c.DelayMean < 0 || c.DelayMean > MaxContentionDuration:
		return nil, fmt.Errorf("%w: delay mean %v must be in [0, %v]", ErrInvalidConfig, c.DelayMean, MaxContentionDuration)
	case c.DelayStdDev < 0 || c.DelayStdDev > MaxContentionDuration:
		return nil, fmt.Errorf("%w: delay stddev %v must be in [0, %v]", ErrInvalidConfig, c.DelayStdDev, MaxContentionDuration)
	case c.Cap > MaxContentionDuration:
		return nil, fmt.Errorf("%w: cap %v must be at most %v", ErrInvalidConfig, c.Cap, MaxContentionDuration)
	}
	var squares float64 // ΣN²
	for _, n := range c.Clients {
		if n < 1 || n > MaxContentionClients {
			return nil, fmt.Errorf("%w: clients %d must be in [1, %d]", ErrInvalidConfig, n, MaxContentionClients)
		}
		squares += float64(n) * float64(n)
	}
	if work := float64(c.Runs) * float64(len(c.Strategies)) * squares; work > MaxContentionWork {
		return nil, fmt.Errorf("%w: %d runs x %d strategies x %.0f (the sum of the squared clients) is more than %d",
			ErrInvalidConfig, c.Runs, len(c.Strategies), squares, MaxContentionWork)
	}
	for _, s := range c.Strategies {
		if s >= numContentionStrategies {
			return nil, fmt.Errorf("%w: unknown contention strategy %d", ErrInvalidConfig, uint8(s))
		}
	}
	// Validate Base and Cap once, whatever the strategies.
	if _, err := backoff.New(backoff.Config{Base: c.Base, Cap: c.Cap}); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}

	res := &ContentionResult{Config: c, Series: make([]ContentionSeries, len(c.Strategies))}
	res.Config.Progress = nil // the result is plain data
	for i, s := range c.Strategies {
		res.Series[i] = ContentionSeries{Strategy: s, Points: make([]ContentionPoint, len(c.Clients))}
	}
	// Every point has its own seeds, so the points can be computed in any
	// order, on any number of goroutines, with the same result.
	cells := len(c.Strategies) * len(c.Clients)
	next := make(chan int, cells)
	for k := range cells {
		next <- k
	}
	close(next)
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex // serialises Progress
		done int
	)
	for range min(runtime.GOMAXPROCS(0), cells) {
		wg.Go(func() {
			var occ occSim
			for k := range next {
				i, j := k/len(c.Clients), k%len(c.Clients)
				res.Series[i].Points[j] = occ.point(c, c.Strategies[i], c.Clients[j])
				if c.Progress != nil {
					mu.Lock()
					done++
					c.Progress(done, cells)
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	return res, nil
}

// point runs c.Runs runs of strategy s with n clients and averages them.
func (o *occSim) point(c ContentionConfig, s ContentionStrategy, n int) ContentionPoint {
	var calls, total float64
	for r := range c.Runs {
		rng := rand.New(rand.NewPCG(c.Seed, uint64(s)<<48|uint64(n)<<16|uint64(r)))
		w, done := o.run(c, s, n, rng)
		calls += float64(w)
		total += float64(done)
	}
	runs := float64(c.Runs)
	return ContentionPoint{
		Clients:    n,
		Calls:      calls / runs,
		Completion: time.Duration(math.Round(total / runs)),
	}
}

// Event kinds of the contention simulation.
const (
	occRead  = iota // a read reaches the server
	occWrite        // a conditional write reaches the server
	occReply        // the write's answer reaches the client
)

// occClient is one contention client's state.
type occClient struct {
	version int              // version it read
	ok      bool             // whether its last write succeeded
	delays  backoff.Sequence // its backoff delays, one per conflict
}

// occSim runs contention runs, reusing its buffers from run to run. It is
// not safe for concurrent use.
type occSim struct {
	q       eventQueue
	clients []occClient
}

// run simulates one run and returns the number of write calls and the time
// the last client heard of its success.
func (o *occSim) run(c ContentionConfig, s ContentionStrategy, n int, rng *rand.Rand) (writes int, done time.Duration) {
	var b *backoff.Backoff
	if bs, ok := s.backoffStrategy(); ok {
		// Validated in Contention; cannot fail.
		b, _ = backoff.New(backoff.Config{Strategy: bs, Base: c.Base, Cap: c.Cap, Rand: rng.Float64})
	}
	hop := func() time.Duration {
		return time.Duration(math.Abs(float64(c.DelayMean) + rng.NormFloat64()*float64(c.DelayStdDev)))
	}
	if cap(o.clients) < n {
		o.clients = make([]occClient, n)
	}
	o.clients = o.clients[:n]
	clear(o.clients)
	if b != nil {
		for i := range o.clients {
			o.clients[i].delays = b.Sequence()
		}
	}
	o.q.reset()
	for i := range n {
		o.q.push(hop(), int32(i), occRead)
	}
	version := 0
	for o.q.len() > 0 {
		e := o.q.pop()
		cl := &o.clients[e.who]
		switch e.kind {
		case occRead:
			cl.version = version
			// The answer travels back, then the write travels out.
			o.q.push(e.at+hop()+hop(), e.who, occWrite)
		case occWrite:
			writes++
			cl.ok = cl.version == version
			if cl.ok {
				version++
			}
			o.q.push(e.at+hop(), e.who, occReply)
		case occReply:
			if cl.ok {
				done = max(done, e.at)
				continue
			}
			var sleep time.Duration
			if b != nil {
				sleep = cl.delays.Next()
			}
			o.q.push(e.at+sleep+hop(), e.who, occRead)
		}
	}
	return writes, done
}

// WriteText writes the result as two tables, calls then completion time,
// with one row per N and one column per strategy.
func (r *ContentionResult) WriteText(w io.Writer) error {
	c := r.Config
	bw := bufio.NewWriter(w)
	fmt.Fprintf(bw, "optimistic concurrency, one row: base=%sms cap=%sms, hop delay=|N(%sms, %sms)|, runs=%d, seed=%d\n",
		millis(c.Base), millis(c.Cap), millis(c.DelayMean), millis(c.DelayStdDev), c.Runs, c.Seed)
	table := func(title string, cell func(p ContentionPoint) string) {
		fmt.Fprintf(bw, "\n%s\n%8s", title, "clients")
		for _, s := range r.Series {
			fmt.Fprintf(bw, " %13s", s.Strategy)
		}
		fmt.Fprintln(bw)
		for i, n := range c.Clients {
			fmt.Fprintf(bw, "%8d", n)
			for _, s := range r.Series {
				fmt.Fprintf(bw, " %13s", cell(s.Points[i]))
			}
			fmt.Fprintln(bw)
		}
	}
	table("write calls (mean per run)", func(p ContentionPoint) string {
		return fmt.Sprintf("%.1f", p.Calls)
	})
	table("completion time (mean per run, ms)", func(p ContentionPoint) string {
		return fmt.Sprintf("%.1f", float64(p.Completion)/float64(time.Millisecond))
	})
	return bw.Flush()
}
