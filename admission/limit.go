package admission

import (
	"context"
	"math"
	"sync"
	"sync/atomic"
	"time"
)

// The adaptive in-flight limit (Config.LatencyCeiling > 0).
//
// It keeps the time requests take to run under what their callers wait,
// by the latency of the requests that complete, with the guardrails that
// latency-only limiters lack:
//   - a request that ran for LatencyCeiling or longer is a drop, never a
//     latency sample, and so is one that ran longer than the reference
//     (below) and ended past its caller's deadline or with its context
//     ended (its caller left): the limit is cut by a tenth, at most once
//     per LatencyCeiling/10 (so that one slow burst does not collapse it,
//     and a hang, whose requests all end as drops, lowers the limit and
//     never raises it);
//   - a request whose caller left but that ran within the reference is no
//     sample at all: it neither grows the limit (a limiter must not grow
//     on work for callers who left) nor cuts it. Its caller's time went
//     before it got its slot (in the queue, the network, a lagging
//     client), which fewer slots would only make worse: counted as a
//     drop, such requests cut the limit, the queue's wait grew, more
//     callers left before their answer, and the limit fell to 1 and stayed
//     there (live, after a hang: every request admitted at limit 1 was for
//     a caller who left, so every sample was a drop; see
//     TestLimiterCallerGoneFastIsNoSample);
//   - the reference latency is fixed, LatencyCeiling/2, not learned: a
//     request that ran faster than that is fast, and grows the limit by
//     1/√limit (about √limit per limit's worth of requests) while the
//     limit is in use (at least half of it in flight); a slower one
//     shrinks it by a fifth of its excess, limit·(1 - (1-ref/latency)/5).
//
// A learned baseline (the lowest latency seen, as gradient limiters use)
// was not chosen: re-learned, it drifts up to an incident's latency
// (failsafe-go#127); never re-learned, it takes a service that became
// slower (five times the work per request) for a queue, and cuts its
// limit to a fraction of what it can serve. The fixed reference has no
// baseline to drift, and it cuts the limit only when requests take longer
// than half of what their callers wait.
//
// The limit starts at MaxInFlight, its ceiling, and stays in [1,
// MaxInFlight].
type limiter struct {
	mu      sync.Mutex
	ceiling time.Duration // the latency ceiling
	top     float64       // MaxInFlight
	limit   float64       // guarded by mu
	lastCut time.Time     // guarded by mu
}

const (
	limitCut    = 0.9 // factor of a cut on a drop
	slowShrink  = 0.2 // share of a slow sample's excess taken off the limit
	cutInterval = 10  // at most one cut per LatencyCeiling/cutInterval
)

// newLimiter returns the limiter of an effective config with a positive
// LatencyCeiling and MaxInFlight.
func newLimiter(eff Config) *limiter {
	return &limiter{ceiling: eff.LatencyCeiling, top: float64(eff.MaxInFlight), limit: float64(eff.MaxInFlight)}
}

// sample takes the outcome of one request that ran from start to now, with
// inFlight requests in flight (itself included), and returns the new limit,
// a whole number in [1, MaxInFlight], stored in to (if not nil) under the
// limiter's lock, so that of two samples at once the later one's limit is
// the one in force. ctx is the request's (nil: none), dl its caller's
// deadline (zero: none).
func (l *limiter) sample(ctx context.Context, now, start, dl time.Time, inFlight int64, to *atomic.Int64) int64 {
	lat := now.Sub(start)
	ref := l.ceiling / 2
	gone := (!dl.IsZero() && now.After(dl)) || (ctx != nil && ctx.Err() != nil)
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case lat >= l.ceiling || (gone && lat > ref):
		if l.lastCut.IsZero() || now.Sub(l.lastCut) >= l.ceiling/cutInterval {
			l.limit = max(1, l.limit*limitCut)
			l.lastCut = now
		}
	case gone:
		// Fast, for a caller who left: no sample (see above).
	case lat <= ref:
		if float64(inFlight) >= l.limit/2 {
			l.limit = min(l.top, l.limit+1/math.Sqrt(l.limit))
		}
	default:
		l.limit = max(1, l.limit*(1-slowShrink*(1-float64(ref)/float64(lat))))
	}
	n := int64(math.MaxInt64) // float64(MaxInt64) is 2^63: int64 of it overflows
	if l.limit < math.MaxInt64 {
		n = int64(l.limit)
	}
	if to != nil {
		to.Store(n)
	}
	return n
}
