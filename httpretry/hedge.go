package httpretry

import (
	"context"
	"errors"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/internal/guards"
	"github.com/stormguard/stormguard/internal/lathist"
	"github.com/stormguard/stormguard/internal/sat"
	"github.com/stormguard/stormguard/limit"
	"github.com/stormguard/stormguard/retry"
)

// The fixed parameters of hedging (docs/hedging.md).
const (
	// hedgeWindow is the period of a host's latency windows: the learned
	// delay reads the successes of the last 10 to 20 s.
	hedgeWindow = 10 * time.Second
	// inflatedFactor: no hedge while the host's recent median latency is
	// above this many times its baseline median (overload).
	inflatedFactor = 3
	// pushbackHold is the least time no hedge goes to a host after it
	// pushed back (429, 503, a Retry-After, a don't-retry mark); a longer
	// Retry-After holds for as long.
	pushbackHold = 5 * time.Second
	// maxHedges bounds WithHedging's max.
	maxHedges = 8
)

// WithHedging sends up to max hedges (0 means 1; at most 8) of a GET, HEAD
// or OPTIONS request without a body when an attempt has not answered
// within delay: further copies of the attempt, sent while it is still in
// flight, the first good answer (any response but a retryable status or a
// 500) winning and the others canceled, their bodies closed. A write is
// never hedged. The first copy runs on the caller's goroutine: a hedge's
// answer is returned once the canceled first copy's request returns, at
// once over a base that honours the request's context (as
// [http.Transport] does).
//
// delay = 0 learns the delay per host: the quantile q of the time to a
// good answer of the host's recent requests (the last 10 to 20 s; q = 0
// means 0.95); with fewer than 20 such answers, no hedge goes. A
// positive delay is fixed. A negative delay, or q outside [0, 1), is an
// error.
//
// A hedge is only sent when the host's retry budget grants it (each hedge
// is one withdrawal: no budget, no hedge), its breaker is closed, its
// concurrency limiter ([WithLimit]) has a free slot at once (the hedge
// holds it until it ends) and is not throttling, the host
// has not pushed back in the last 5 s (a 429 or a 503, or any failed
// answer, a 408, 500, 502 or 504, with a positive Retry-After or a don't-retry
// mark; a longer Retry-After holds for as long; a host that [WithMaxHosts]
// forgot starts afresh), and its recent
// median latency is at most 3 times its baseline (a tail caused by overload
// is not helped by more load). Nor does a hedge go while more of the
// host's races reached their delay in the last second (counted as the
// delay passes, answered or not) than 5 and than 3(1-q) of the races
// started in it (at most halfway between 1-q and all of them), or while
// more of its races in flight are past their delay than 5 and than that
// share of them (a burst queued behind a short stall), or while the host's
// last good answers in races, two or more in a row, each came after its
// race's delay, the last of them within half a delay (a queue at the
// host: a hedge would wait behind the same requests and lengthen it; an
// answer on time ends it): that is a
// stall or an overload, not a tail; a race held back looks again every half
// delay for three delays, then after one delay, doubling (the looks at least
// 1 ms and at most a minute apart), while its first copy is unanswered and a
// hedge could go but for the bound, and its hedge goes once the bound allows
// (a burst behind a few slow requests clears within a few delays, and a copy
// unanswered after it is most likely one of the slow ones); a held race that
// finds its hedge held for another reason as well (a push-back, inflated
// latency, a breaker not closed, no budget) stops looking, as a race not
// held gets no hedge then. With a fixed delay, q (0 meaning 0.95)
// is the share of answers the delay is expected to cover, for this bound
// only. The time of a race held back by this bound does not count in the
// learned delay (held by a queue alone, it does: a lasting one is the
// host's latency). Each hedge is an attempt on the wire: it
// carries the next wire.AttemptHeader number, and an observer hears its
// own AttemptStart and AttemptEnd (Event.Hedge set; a canceled loser ends
// with Outcome "canceled"). The retry loop counts the race as one attempt
// with the winner's answer; a retry after it carries the wire number after
// the hedges'. A race whose first copy answers before the delay
// allocates nothing beyond the same attempt without hedging when
// [WithAttemptTimeout] is set (the first copy is that attempt: same
// context, header and deadline); without it, 3 allocations more (4 on a
// cancelable request context, and 3 more on one no context was derived
// from yet: its Done channel and its list of children, which the first
// copy's context is then the first to make; 5 under [WithTimeout], whose
// deadline the transport puts on every request's context, however the
// caller's was made). An attempt that ends before the delay
// could pass (the request's deadline, or an attempt timeout, comes first)
// runs no race, and costs what it costs without hedging. Off by default.
func WithHedging(delay time.Duration, q float64, max int) Option {
	// The defaults, before the closure: an Option is a value, applied by
	// any number of constructors at once, and writes nothing it shares.
	if q == 0 {
		q = 0.95
	}
	if max == 0 {
		max = 1
	}
	return option(func(c *config) error {
		switch {
		case delay < 0:
			return invalid("hedge delay %v must not be negative", delay)
		case q < 0 || q >= 1 || q != q:
			return invalid("hedge quantile %v must be in [0, 1)", q)
		case max < 0 || max > maxHedges:
			return invalid("hedges %d must be in [0, %d]", max, maxHedges)
		}
		c.hedge = &hedgeConfig{delay: delay, q: q, max: max, share: dueShare(q)}
		return nil
	})
}

// hedgeConfig is what WithHedging set.
type hedgeConfig struct {
	delay time.Duration // 0: learned
	q     float64
	max   int
	share float64 // dueShare(q)
}

// hedgeHost is what hedging keeps per destination host.
type hedgeHost struct {
	lat      *lathist.Hist
	base     time.Time    // when the host was first seen: the origin of pushedTo
	pushedTo atomic.Int64 // no hedge before this time (since base), ns
	// dues counts the host's races, and those that reached their delay, per second.
	dues *lathist.Dues
}

// hedgeTable returns the table of the hosts' hedging state, nil without
// hedging.
func hedgeTable(c *config) *guards.Table[*hedgeHost] {
	if c.hedge == nil {
		return nil
	}
	q := c.hedge.q
	return guards.NewTable(c.maxHosts, func(string) (*hedgeHost, error) {
		return &hedgeHost{lat: lathist.New(hedgeWindow, q), dues: newDues(), base: time.Now()}, nil
	})
}

// hedgeState returns the hedging state of the request's host, named name
// (lower-cased, as the hosts table keys it), and whether the request may
// be hedged (a GET, HEAD or OPTIONS without a body). Every request gets
// the state, hedged or not: its host's push-back holds the hedges of the
// others (a 503 to a POST too).
func (t *Transport) hedgeState(req *http.Request, name string) (*hedgeHost, bool) {
	if t.hedges == nil {
		return nil, false
	}
	hh, _ := t.hedges.Get(name)
	switch req.Method {
	case "", http.MethodGet, http.MethodHead, http.MethodOptions:
	default:
		return hh, false
	}
	return hh, req.Body == nil || req.Body == http.NoBody
}

// pushback notes a failed answer of the host (a retryable status or a
// 500) that asks for less load: a 429 or 503, or one with a Retry-After
// (hint) or a don't-retry mark. No hedge goes to the host for
// pushbackHold, or hint if longer.
func (hh *hedgeHost) pushback(code int, hint time.Duration, h http.Header) {
	if hh == nil {
		return
	}
	if code != http.StatusTooManyRequests && code != http.StatusServiceUnavailable && hint <= 0 && !dontRetry(h) {
		return
	}
	to := int64(sat.Add(time.Since(hh.base), max(hint, pushbackHold))) // a Retry-After of years saturates (it wrapped negative: no hold)
	for {
		cur := hh.pushedTo.Load()
		if cur >= to || hh.pushedTo.CompareAndSwap(cur, to) {
			return
		}
	}
}

// quiet reports whether the host may get a hedge as far as its own answers
// say: no recent pushback, no inflated latency.
func (hh *hedgeHost) quiet() bool {
	return int64(time.Since(hh.base)) >= hh.pushedTo.Load() && !hh.lat.Inflated(inflatedFactor)
}

// guardsAllow reports whether g lets a hedge go now, short of spending the
// budget and taking a slot of the limiter: a budget to pay it and a closed
// breaker.
func guardsAllow(g retry.Guards) bool {
	if g.Budget == nil {
		return false
	}
	return g.Breaker == nil || g.Breaker.State() == breaker.Closed
}

// hedgeSlot takes a slot of the destination's concurrency limiter for a
// hedge, if it has one: at once or not at all (a limiter at its limit, or
// throttling, refuses). ok is false on a refusal.
func hedgeSlot(g retry.Guards) (p limit.Permit, ok bool) {
	if g.Limiter == nil {
		return p, true
	}
	p, err := g.Limiter.Acquire(noWait) // a free slot or none: never waits
	return p, err == nil
}

// releaseSlot gives back a hedge's slot: as a drop when it failed or timed
// out, not when the race canceled it (won: a good answer won the race; a
// loser is no sign of overload, even if its caller has left since).
func releaseSlot(g retry.Guards, p limit.Permit, parent, lctx context.Context, won bool, resp *http.Response, err error) {
	if g.Limiter == nil {
		return
	}
	ours := errors.Is(lctx.Err(), context.Canceled) && (won || parent.Err() == nil)
	g.Limiter.Release(p, !good(resp, err) && !ours)
}

// good reports whether an answer wins a race: a response that is not a
// retryable status, a 500 or a 409 with a Retry-After (the in-progress
// answer of an idempotency key's first request: a copy that would succeed
// must not be canceled for it).
func good(resp *http.Response, err error) bool {
	if err != nil {
		return false
	}
	code := resp.StatusCode
	return !isRetryableStatus(code) && code != http.StatusInternalServerError &&
		!(code == http.StatusConflict && len(resp.Header["Retry-After"]) > 0)
}

// first sends attempt n: raced against hedges when the request and its
// host allow them, else as send does. A good answer counts in the host's
// latencies.
func (c *call) first(ctx context.Context, n int) (*http.Response, error) {
	h := c.dest
	hh := c.hh
	if hh == nil || !c.retryable {
		return c.send(ctx, n)
	}
	start := time.Now()
	delay := c.t.cfg.hedge.delay
	if delay == 0 {
		delay = hh.lat.Quantile()
	}
	if delay <= 0 || !guardsAllow(h.Guards) || !hh.quiet() || endsBefore(ctx, start, delay, c.t.cfg.attemptTimeout) {
		resp, err := c.send(ctx, n)
		if good(resp, err) {
			hh.lat.Record(start)
		}
		return resp, err
	}
	hh.dues.Start(start) // counted for the due-share bound
	return c.race(ctx, n, h, delay, start)
}

// endsBefore reports whether an attempt that starts at start on ctx, with
// the attempt timeout d (0: none), ends before delay has passed: by ctx's
// deadline or by d. Its hedge could never go, so it runs no race.
func endsBefore(ctx context.Context, start time.Time, delay, d time.Duration) bool {
	if d > 0 && d <= delay {
		return true
	}
	dl, ok := ctx.Deadline()
	return ok && dl.Sub(start) <= delay
}
