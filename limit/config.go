package limit

import (
	"fmt"
	"math"
	"time"
)

// Defaults of a [Config]'s zero fields, documented there.
const (
	defaultMax     = 1000
	defaultWaiting = 10_000
	// maxMax bounds Config.Max: the in-flight count shares a word with a
	// sequence number.
	maxMax = 1 << 30
)

// Config is the plain-data description of a [Limiter]; build one with
// [New]. Zero fields take the defaults, so Config{} learns a limit between
// 1 and 1000 attempts in flight, with no latency ceiling, no throttling,
// and up to 10,000 waiting calls. A Config is a value: [New] copies it.
type Config struct {
	// Max is the most attempts in flight the limit may grow to, from 1
	// to 2^30; 0 means 1000. A cold limiter starts at min(Max, 10).
	Max int
	// Timeout is the attempt timeout the callers use. Half of it is the
	// latency ceiling: an attempt released after Timeout/2 or later
	// counts as a drop, not as a latency sample, so that latency sitting
	// near the timeout lowers the limit. 0 means no ceiling (a caller's
	// timeout still counts as a drop when Release is told so); negative
	// is an error.
	Timeout time.Duration
	// Throttle is K of client-side adaptive throttling (Google SRE book,
	// "Handling Overload"): Acquire rejects locally a share
	// max(0, (requests − K·accepts) / (requests + 1)) of the calls, counted
	// over the last 500 ms (in 50 ms buckets), where requests counts the
	// calls it rejected and the permits released (an attempt counts when
	// it ends, not while in flight), and accepts the permits released as
	// not dropped. A destination that accepts more than 1/K of the
	// attempts sees no rejection, nor does a burst of calls after an idle
	// spell or at a cold start. Exactly 1/K is the formula's edge: the
	// calls it rejects count as requests, so a share of rejections, once
	// drawn, sustains itself (K = 2, every other attempt accepted, 1,000
	// calls a second for 10 s: 0.1-0.4% rejected in 239 runs of 240, 10%
	// in one). One that accepts less gets
	// fewer and fewer attempts, about one per 500 ms when it accepts
	// none (a call that waited for a slot longer than the 500 ms history
	// is judged again when its slot comes: one let through before the
	// destination stopped accepting does not go at the pace of the
	// slots). The short history lets healthy traffic through again about
	// 2.5 s after a recovery at K = 2 (measured at 1,000 and 10,000 calls
	// per second; 4.4 s at 100,000), later the closer K is to 1, since the
	// calls it rejects count as requests: about 3.5 s at 1.5, 7.5 s at
	// 1.1, and over a minute and a half at exactly 1 (after a 10 s outage,
	// 1,000 calls a second). 2 is the usual value, lower rejects more; it
	// must be 0 (off, the default) or at least 1.
	Throttle float64
	// Waiting bounds the calls that may wait at once for a slot, with
	// and without a deadline together; beyond it Acquire fails at once.
	// 0 means 10,000; a negative value turns waiting off (a call over the
	// limit fails at once).
	Waiting int
}

// New validates c and returns a cold [Limiter] (limit min(Max, 10), slow
// start). It returns an error naming the field when Max is negative or
// above 2^30, Timeout is negative, or Throttle is NaN, infinite, negative
// or in (0, 1). Every Waiting is valid. A Limiter that was built never
// fails or panics later (used as documented: see [Limiter.Release]).
func New(c Config) (*Limiter, error) {
	switch {
	case c.Max < 0 || c.Max > maxMax:
		return nil, fmt.Errorf("limit: Config.Max is %d, want 0 (default 1000) to %d", c.Max, maxMax)
	case c.Timeout < 0:
		return nil, fmt.Errorf("limit: Config.Timeout is %v, want 0 (no ceiling) or positive", c.Timeout)
	case math.IsNaN(c.Throttle) || math.IsInf(c.Throttle, 0) || c.Throttle < 0 || (c.Throttle > 0 && c.Throttle < 1):
		return nil, fmt.Errorf("limit: Config.Throttle is %v, want 0 (off) or at least 1", c.Throttle)
	}
	if c.Max == 0 {
		c.Max = defaultMax
	}
	if c.Waiting == 0 {
		c.Waiting = defaultWaiting
	}
	return newLimiter(c), nil
}
