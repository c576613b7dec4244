package httpretry

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"sync/atomic"
	"time"

	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/internal/guards"
	"github.com/stormguard/stormguard/internal/lathist"
	"github.com/stormguard/stormguard/limit"
	"github.com/stormguard/stormguard/observe"
	"github.com/stormguard/stormguard/retry"
	"github.com/stormguard/stormguard/wire"
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
// never hedged.
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
// has not pushed back in the last 5 s (429, 503, a Retry-After or a
// don't-retry mark; a longer Retry-After holds for as long), and its recent
// median latency is at most 3 times its baseline (a tail caused by overload
// is not helped by more load). Each hedge is an attempt on the wire: it
// carries the next wire.AttemptHeader number, and an observer hears its
// own AttemptStart and AttemptEnd (Event.Hedge set; a canceled loser ends
// with Outcome "canceled"). The retry loop counts the race as one attempt
// with the winner's answer; a retry after it carries the wire number after
// the hedges'. Off by default.
func WithHedging(delay time.Duration, q float64, max int) Option {
	return option(func(c *config) error {
		switch {
		case delay < 0:
			return invalid("hedge delay %v must not be negative", delay)
		case q < 0 || q >= 1 || q != q:
			return invalid("hedge quantile %v must be in [0, 1)", q)
		case max < 0 || max > maxHedges:
			return invalid("hedges %d must be in [0, %d]", max, maxHedges)
		}
		if q == 0 {
			q = 0.95
		}
		if max == 0 {
			max = 1
		}
		c.hedge = &hedgeConfig{delay: delay, q: q, max: max}
		return nil
	})
}

// hedgeConfig is what WithHedging set.
type hedgeConfig struct {
	delay time.Duration // 0: learned
	q     float64
	max   int
}

// hedgeHost is what hedging keeps per destination host.
type hedgeHost struct {
	lat      *lathist.Hist
	base     time.Time    // when the host was first seen: the origin of pushedTo
	pushedTo atomic.Int64 // no hedge before this time (since base), ns
}

// hedgeTable returns the table of the hosts' hedging state, nil without
// hedging.
func hedgeTable(c *config) *guards.Table[*hedgeHost] {
	if c.hedge == nil {
		return nil
	}
	q := c.hedge.q
	return guards.NewTable(c.maxHosts, func(string) (*hedgeHost, error) {
		return &hedgeHost{lat: lathist.New(hedgeWindow, q), base: time.Now()}, nil
	})
}

// hedgeState returns the hedging state of the request's host, nil if the
// request is never hedged.
func (t *Transport) hedgeState(req *http.Request) *hedgeHost {
	if t.hedges == nil {
		return nil
	}
	switch req.Method {
	case "", http.MethodGet, http.MethodHead, http.MethodOptions:
	default:
		return nil
	}
	if req.Body != nil && req.Body != http.NoBody {
		return nil
	}
	hh, _ := t.hedges.Get(strings.ToLower(req.URL.Host))
	return hh
}

// pushback notes an answer of the host that asks for less load: a 429 or
// 503, a Retry-After (hint), a don't-retry mark. No hedge goes to the host
// for pushbackHold, or hint if longer.
func (hh *hedgeHost) pushback(code int, hint time.Duration, h http.Header) {
	if hh == nil {
		return
	}
	if code != http.StatusTooManyRequests && code != http.StatusServiceUnavailable && hint <= 0 && !dontRetry(h) {
		return
	}
	to := int64(time.Since(hh.base) + max(hint, pushbackHold))
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
	p, err := g.Limiter.Acquire(context.Background()) // no deadline: no wait
	return p, err == nil
}

// releaseSlot gives back a hedge's slot: as a drop when it failed or timed
// out, not when the race canceled it (a loser is no sign of overload).
func releaseSlot(g retry.Guards, p limit.Permit, parent, lctx context.Context, resp *http.Response, err error) {
	if g.Limiter == nil {
		return
	}
	ours := errors.Is(lctx.Err(), context.Canceled) && parent.Err() == nil
	g.Limiter.Release(p, !good(resp, err) && !ours)
}

// good reports whether an answer wins a race: a response that is not a
// retryable status or a 500.
func good(resp *http.Response, err error) bool {
	return err == nil && !isRetryableStatus(resp.StatusCode) && resp.StatusCode != http.StatusInternalServerError
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
	if delay <= 0 || !guardsAllow(h.Guards) || !hh.quiet() {
		resp, err := c.send(ctx, n)
		if good(resp, err) {
			hh.lat.Record(start)
		}
		return resp, err
	}
	return c.race(ctx, n, h, delay, start)
}

// leg is the end of one request of a race.
type leg struct {
	i    int
	resp *http.Response
	err  error
}

// raceState is what one race uses: its legs' results and cancels, and
// its timer. A Transport keeps a pool of them: a race takes one and the
// last of its legs to be received gives it back, so that a race the first
// attempt wins allocates none of it.
type raceState struct {
	results chan leg
	cancels [1 + maxHedges]context.CancelFunc
	n       int // legs launched
	timer   *time.Timer
}

// getRace returns a race state from t's pool, its timer stopped and its
// channel empty.
func (t *Transport) getRace() *raceState {
	if rs, ok := t.races.Get().(*raceState); ok {
		return rs
	}
	tm := time.NewTimer(time.Hour)
	tm.Stop()
	return &raceState{results: make(chan leg, 1+maxHedges), timer: tm}
}

// putRace gives rs back to the pool once every leg it launched has been
// received.
func (t *Transport) putRace(rs *raceState) {
	rs.timer.Stop() // no stale tick after Stop (Go 1.23 timers)
	clear(rs.cancels[:])
	rs.n = 0
	t.races.Put(rs)
}

// race sends attempt n and, each time delay passes without a good answer,
// a hedge while the guards allow one, up to the configured number; the
// first good answer wins, and the others are canceled and closed.
//
//stormguard:long the race's select owns its legs' contexts, results and the timer
func (c *call) race(ctx context.Context, n int, h *host, delay time.Duration, start time.Time) (*http.Response, error) {
	cfg := &c.t.cfg
	rs := c.t.getRace()
	c.launch(rs, ctx, n+c.extra, false, limit.Permit{})
	pending, hedges := 1, 0
	rs.timer.Reset(delay)
	held := leg{i: -1} // the latest failure, returned if every leg fails
	for {
		select {
		case l := <-rs.results:
			pending--
			if good(l.resp, l.err) {
				c.hh.lat.Record(start)
				c.cur, c.curCancel = l.resp, rs.cancels[l.i]
				c.closeLeg(held, rs)
				c.reap(rs, pending, l.i)
				return l.resp, nil
			}
			if l.resp != nil {
				c.hh.pushback(l.resp.StatusCode, retryAfterOf(l.resp), l.resp.Header)
			}
			c.closeLeg(held, rs)
			held = l
			hedges = cfg.hedge.max // a failure: no more hedges in this race
			if pending > 0 {
				continue
			}
			cancel := rs.cancels[l.i]
			c.t.putRace(rs)
			if l.err != nil {
				cancel()
				return nil, l.err
			}
			c.cur, c.curCancel = l.resp, cancel
			return l.resp, nil
		case <-rs.timer.C:
			if hedges >= cfg.hedge.max || !guardsAllow(h.Guards) || !c.hh.quiet() || !h.Guards.Budget.Withdraw() {
				continue
			}
			slot, ok := hedgeSlot(h.Guards) // after the budget: a refused slot wastes a withdrawal, never a sample
			if !ok {
				continue
			}
			hedges++
			pending++
			c.extra++
			c.launch(rs, ctx, n+c.extra, true, slot)
			if hedges < cfg.hedge.max {
				rs.timer.Reset(delay)
			}
		case <-ctx.Done():
			c.closeLeg(held, rs)
			c.reap(rs, pending, -1)
			return nil, ctx.Err()
		}
	}
}

// launch sends leg rs.n of a race, numbered num on the wire, on a
// goroutine of its own that hands its end to rs.results.
func (c *call) launch(rs *raceState, ctx context.Context, num int, hedge bool, slot limit.Permit) {
	cfg := &c.t.cfg
	lctx, cancel := context.WithCancel(ctx)
	if d := cfg.attemptTimeout; d > 0 {
		lctx, cancel = withTimeoutCancel(lctx, cancel, d)
	}
	i := rs.n
	rs.cancels[i] = cancel
	rs.n++
	if hedge && cfg.observer != nil {
		lctx = c.hedgeStart(lctx, num)
	}
	r := c.legRequest(lctx, num, !hedge)
	c.sends++
	go runLeg(c.t, c.dest, rs, i, r, ctx, lctx, num, hedge, slot)
}

// runLeg is one leg's goroutine, a request to dest through t. It takes no
// *call: a call that a goroutine could reach would be moved to the heap by
// the compiler, and every RoundTrip would allocate it.
func runLeg(t *Transport, dest *host, rs *raceState, i int, r *http.Request, ctx, lctx context.Context, num int, hedge bool, slot limit.Permit) {
	t0 := time.Now()
	resp, err := t.roundTrip(r) // an observer of HTTP requests sees every leg
	if hedge {
		releaseSlot(dest.Guards, slot, ctx, lctx, resp, err)
		if t.cfg.observer != nil {
			hedgeEnd(t.cfg.observer, dest, lctx, num, resp, err, t0)
		}
	}
	rs.results <- leg{i: i, resp: resp, err: err}
}

// withTimeoutCancel caps ctx (whose cancel is cancel) at d, returning a
// cancel that releases both.
func withTimeoutCancel(ctx context.Context, cancel context.CancelFunc, d time.Duration) (context.Context, context.CancelFunc) {
	tctx, tcancel := context.WithTimeout(ctx, d)
	return tctx, func() { tcancel(); cancel() }
}

// closeLeg closes a leg that lost the race after failing; one with i < 0
// is none.
func (c *call) closeLeg(l leg, rs *raceState) {
	if l.i < 0 {
		return
	}
	if l.resp != nil && l.resp.Body != nil {
		drainClose(l.resp.Body)
	}
	rs.cancels[l.i]()
}

// reap cancels every leg but the winner (keep; -1 for none), closes the
// answers of the pending ones as they come, on a goroutine of its own that
// ends with the last of them, and gives rs back to the pool.
func (c *call) reap(rs *raceState, pending int, keep int) {
	for i, cancel := range rs.cancels[:rs.n] {
		if i != keep {
			cancel()
		}
	}
	if pending == 0 {
		c.t.putRace(rs)
		return
	}
	t := c.t // not c: see runLeg
	go func() {
		for range pending {
			l := <-rs.results
			if l.resp != nil && l.resp.Body != nil {
				_ = l.resp.Body.Close()
			}
		}
		t.putRace(rs)
	}()
}

// retryAfterOf returns the Retry-After of resp, 0 if none.
func retryAfterOf(resp *http.Response) time.Duration {
	if v := resp.Header["Retry-After"]; len(v) > 0 {
		d, _ := ParseRetryAfter(v[0], time.Now())
		return d
	}
	return 0
}

// legRequest returns the request of one leg of a race: a copy of the source
// request on ctx, numbered num on the wire, marked as the breaker's probe
// if the primary is one, with the time its caller waits.
func (c *call) legRequest(ctx context.Context, num int, primary bool) *http.Request {
	r := c.src.WithContext(ctx)
	r.Header = c.header(num)
	if primary && retry.IsProbe(ctx) {
		r.Header[wire.ProbeHeader] = probeValue
	} else {
		delete(r.Header, wire.ProbeHeader)
	}
	if dl, ok := ctx.Deadline(); ok {
		r.Header[wire.TimeoutHeader] = timeoutValue(time.Until(dl))
	}
	return r
}

// hedgeStart reports the start of hedge num and returns its context
// (tagged by the observer, if it tags).
func (c *call) hedgeStart(ctx context.Context, num int) context.Context {
	o := c.t.cfg.observer
	e := observe.Event{Kind: observe.AttemptStart, Name: c.dest.Name, Attempt: num, Hedge: true}
	if tg, ok := o.(interface {
		TagAttempt(context.Context, observe.Event) context.Context
	}); ok {
		return tg.TagAttempt(ctx, e)
	}
	o.Observe(ctx, e)
	return ctx
}

// hedgeEnd reports the end of hedge num to dest to o.
func hedgeEnd(o observe.Observer, dest *host, ctx context.Context, num int, resp *http.Response, err error, t0 time.Time) {
	e := observe.Event{Kind: observe.AttemptEnd, Name: dest.Name, Attempt: num, Hedge: true, Elapsed: time.Since(t0), Err: err}
	switch {
	case ctx.Err() != nil && !good(resp, err):
		e.Outcome = "canceled"
	case good(resp, err):
		e.Outcome = "success"
	case err != nil || isRetryableStatus(resp.StatusCode) || resp.StatusCode == http.StatusInternalServerError:
		e.Outcome = "failure"
		if err == nil {
			e.Err = &StatusError{Code: resp.StatusCode}
		}
	}
	o.Observe(ctx, e)
}
