package live

import (
	"context"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"
)

// FleetConfig describes a fleet of clients each sending one logical request
// every Every, for Duration.
type FleetConfig struct {
	// Clients is the number of clients; it must be positive.
	Clients int `json:"clients"`
	// Every is the interval between a client's logical requests; it must
	// be positive. Clients start evenly spread over the first interval,
	// or at random points of it with RandomPhase.
	Every time.Duration `json:"every_ns"`
	// Duration is how long clients keep sending new requests; it must be
	// positive. RunFleet returns when the last request has finished.
	Duration time.Duration `json:"duration_ns"`
	// Deadline bounds each logical request, retries included (a context
	// deadline). Zero means none.
	Deadline time.Duration `json:"deadline_ns"`
	// RandomPhase starts each client at a point of [0, Every) drawn
	// uniformly from a generator seeded with Seed (math/rand/v2 PCG), as
	// independent terminals would, instead of spreading them evenly.
	RandomPhase bool   `json:"random_phase,omitempty"`
	Seed        uint64 `json:"seed,omitempty"`
}

// FleetStats counts the fleet's logical requests.
type FleetStats struct {
	// Offered is the number of logical requests started.
	Offered int64 `json:"offered"`
	// Succeeded ended with a nil error.
	Succeeded int64 `json:"succeeded"`
	// Failed ended with an error (or a panic).
	Failed int64 `json:"failed"`
	// Panics counts the calls that panicked (the client under test has a
	// bug); Panic is the first panic's value and stack. A panicking call
	// counts as failed, and the run goes on.
	Panics int64  `json:"panics,omitempty"`
	Panic  string `json:"panic,omitempty"`
	// Calls records every logical request, in no particular order (not
	// part of the JSON form).
	Calls []CallRecord `json:"-"`
}

// CallRecord is one logical request of a fleet.
type CallRecord struct {
	// Start is when the call was made, since the fleet started.
	Start time.Duration
	// Took is how long it ran, retries and waits included.
	Took time.Duration
	// Late is how much later than scheduled the call was made: the
	// fleet's own lag (a busy machine), which its figures cannot hide.
	Late time.Duration
	// OK reports whether it succeeded.
	OK bool
}

// Call performs one logical request (with whatever retries the client under
// test makes) and reports whether it succeeded.
type Call func(ctx context.Context) error

// RunFleet runs the fleet: every client calls call once per Every, each call
// in its own goroutine so that slow retry loops overlap as they do in real
// clients. Client i starts at i·Every/Clients (or at a random phase, see
// FleetConfig.RandomPhase) and sends at fixed times: the number of calls
// offered is exactly the number of scheduled times before Duration. It
// returns when every call has returned; ctx cancels the run.
func RunFleet(ctx context.Context, c FleetConfig, call Call) (FleetStats, error) {
	return runFleet(ctx, c, call, time.Now())
}

// offsets returns each client's first send time.
func (c FleetConfig) offsets() []time.Duration {
	out := make([]time.Duration, c.Clients)
	var rng *mrand.Rand
	if c.RandomPhase {
		rng = mrand.New(mrand.NewPCG(c.Seed, 0x5eed))
	}
	for i := range out {
		if rng != nil {
			out[i] = time.Duration(rng.Int64N(int64(c.Every)))
		} else {
			out[i] = time.Duration(int64(c.Every) * int64(i) / int64(c.Clients))
		}
	}
	return out
}

func runFleet(ctx context.Context, c FleetConfig, call Call, start time.Time) (FleetStats, error) {
	switch {
	case c.Clients <= 0:
		return FleetStats{}, fmt.Errorf("%w: clients %d must be positive", ErrInvalidConfig, c.Clients)
	case c.Every <= 0 || c.Duration <= 0 || c.Deadline < 0:
		return FleetStats{}, fmt.Errorf("%w: every %v and duration %v must be positive, deadline %v not negative",
			ErrInvalidConfig, c.Every, c.Duration, c.Deadline)
	}
	// Each client sends at offset + k·Every for every such time before
	// Duration: a fixed schedule, so the offered load does not depend on
	// how busy the machine is (a late request is sent late, not dropped).
	offsets := c.offsets()
	total := 0
	for _, offset := range offsets {
		if offset < c.Duration {
			total += int((c.Duration-offset-1)/c.Every) + 1
		}
	}
	var (
		calls      sync.WaitGroup
		clients    sync.WaitGroup
		ok, bad    atomic.Int64
		sent       atomic.Int64
		records    = make([]CallRecord, total)
		firstPanic panicLog
	)
	for _, offset := range offsets {
		if offset >= c.Duration {
			continue
		}
		n := int((c.Duration-offset-1)/c.Every) + 1
		clients.Add(1)
		go func() {
			defer clients.Done()
			t := time.NewTimer(time.Until(start.Add(offset)))
			defer t.Stop()
			for k := range n {
				select {
				case <-ctx.Done():
					return
				case <-t.C:
				}
				rec := &records[sent.Add(1)-1]
				scheduled := start.Add(offset + time.Duration(k)*c.Every)
				calls.Add(1)
				go func() {
					defer calls.Done()
					cctx, cancel := ctx, context.CancelFunc(func() {})
					if c.Deadline > 0 {
						cctx, cancel = context.WithTimeout(ctx, c.Deadline)
					}
					defer cancel()
					began := time.Now()
					err := guard(cctx, call, &firstPanic)
					*rec = CallRecord{Start: began.Sub(start), Took: time.Since(began), Late: began.Sub(scheduled), OK: err == nil}
					if err == nil {
						ok.Add(1)
					} else {
						bad.Add(1)
					}
				}()
				t.Reset(time.Until(start.Add(offset + time.Duration(k+1)*c.Every)))
			}
		}()
	}
	clients.Wait()
	calls.Wait()
	st := FleetStats{Offered: sent.Load(), Succeeded: ok.Load(), Failed: bad.Load(), Calls: records[:sent.Load()]}
	st.Panics, st.Panic = firstPanic.n.Load(), firstPanic.first
	return st, ctx.Err()
}

// panicLog counts the calls that panicked and keeps the first panic.
type panicLog struct {
	n     atomic.Int64
	once  sync.Once
	first string
}

// errPanicked is what a call that panicked returns.
var errPanicked = errors.New("live: the call panicked")

// guard runs call, turning a panic into errPanicked logged in log.
func guard(ctx context.Context, call Call, log *panicLog) (err error) {
	defer func() {
		if v := recover(); v != nil {
			log.n.Add(1)
			log.once.Do(func() { log.first = fmt.Sprintf("%v\n%s", v, debug.Stack()) })
			err = errPanicked
		}
	}()
	return call(ctx)
}
