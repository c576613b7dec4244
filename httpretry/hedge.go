package httpretry

import (
	"context"
	"errors"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/internal/guards"
	"github.com/stormguard/stormguard/internal/lathist"
	"github.com/stormguard/stormguard/internal/sat"
	"github.com/stormguard/stormguard/limit"
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
// answer, a 408, 500, 502 or 504, with a Retry-After or a don't-retry
// mark; a longer Retry-After holds for as long), and its recent
// median latency is at most 3 times its baseline (a tail caused by overload
// is not helped by more load). Nor does a hedge go while more of the
// host's races reached their delay in the last second (counted as the
// delay passes, answered or not) than 5 and than 3(1-q) of the races
// started in it (at most halfway between 1-q and all of them), or while
// more of its races in flight are past their delay than 5 and than that
// share of them (a burst queued behind a short stall): that is a
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
// learned delay. Each hedge is an attempt on the wire: it
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
// copy's context is then the first to make). An attempt that ends before the delay
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

// leg is the end of one request of a race: i is 0 for the first copy,
// the hedge's rank for a hedge.
type leg struct {
	i    int
	resp *http.Response
	err  error
}

// raceState is what one race uses: its copies' cancels, the hedges' ends
// and the timer that sends them. A Transport keeps a pool of them: a call
// whose first copy answers before the delay takes one, stops its timer
// before it fires and gives it back, allocating none of it. A race whose
// timer fired is never given back: a callback of its timer may still be
// running.
type raceState struct {
	timer   *time.Timer // time.AfterFunc(fire): sends a hedge; stopped in the pool
	results chan leg    // the hedges' ends, maxHedges deep: a hedge never waits

	mu      sync.Mutex
	p       raceParams
	cancels [1 + maxHedges]context.CancelFunc // 0: the first copy's
	hedges  int                               // hedges sent
	over    bool                              // the first copy answered: no more hedges, and none cancels it
	failed  bool                              // a hedge failed: no more hedges
	lost    bool                              // a hedge's good answer canceled the first copy
	held    bool                              // the due-share bound refused its first hedge: its time is not learned
	looks   int                               // the looks of a held race since its delay (see lathist.LookAgain)
	due     bool                              // the race reached its delay: counted as due until it ends
	won     atomic.Bool                       // a good answer won: the race canceled the other copies
}

// raceParams is what the hedges of a race are made from: copies of the
// call's fields (a *call that the timer's goroutine could reach would be
// moved to the heap by the compiler, and every RoundTrip would allocate
// it).
type raceParams struct {
	t     *Transport
	dest  *host
	hh    *hedgeHost
	ctx   context.Context // the attempt's context: every copy's parent
	src   *http.Request
	key   []string
	num   int // the first copy's wire number; hedge i carries num+i
	delay time.Duration
}

// getRace returns a race state from t's pool, its timer stopped.
func (t *Transport) getRace() *raceState {
	if rs, ok := t.races.Get().(*raceState); ok {
		return rs
	}
	rs := &raceState{results: make(chan leg, maxHedges)}
	rs.timer = time.AfterFunc(time.Hour, rs.fire)
	rs.timer.Stop()
	return rs
}

// race sends attempt n as its first copy, on the caller's goroutine, and
// arms rs's timer: each time delay passes without a good answer, the
// timer's goroutine sends a hedge while the guards allow one, up to the
// configured number. The first good answer wins; the others are canceled
// and closed. The first copy's context is the one send would make (the
// attempt timeout's, else a cancelable one), its cancel also what a
// winning hedge calls, and its answer is released as send's is (c.cur,
// c.curCancel): with an attempt timeout, a race the first copy wins
// before the delay costs what the same attempt costs without hedging;
// without one, the context, its request copy and the body wrapper that
// releases it.
func (c *call) race(ctx context.Context, n int, h *host, delay time.Duration, start time.Time) (*http.Response, error) {
	lctx, cancel := legContext(ctx, c.t.cfg.attemptTimeout)
	num := n + c.extra
	r := c.firstCopy(ctx, lctx, num)
	rs := c.t.getRace()
	rs.mu.Lock()
	rs.p = raceParams{t: c.t, dest: h, hh: c.hh, ctx: ctx, src: c.src, key: c.key, num: num, delay: delay}
	rs.cancels[0] = cancel
	rs.timer.Reset(delay)
	rs.mu.Unlock()

	c.sends++
	resp, err := rs.sendFirst(c.t, r)

	rs.mu.Lock()
	rs.over = true
	stopped := rs.timer.Stop()
	hedges, lost, due, held := rs.hedges, rs.lost, rs.due, rs.held
	rs.mu.Unlock()
	c.hh.dues.End(due) // the race is over as far as the due-share bound goes
	if stopped && hedges == 0 {
		// No hedge went, and the timer will not fire (it never did, or
		// only to find the race held, and was set again): rs is free again.
		rs.p = raceParams{}
		rs.cancels[0] = nil
		rs.over, rs.due, rs.held, rs.looks = false, false, false, 0
		c.t.races.Put(rs)
		if err != nil {
			cancel()
			return nil, err
		}
		if good(resp, nil) && !held {
			c.hh.lat.Record(start)
		}
		if c.t.cfg.attemptTimeout == 0 && ctx.Done() == nil {
			// No timer, and a parent that never ends keeps no list of
			// its children: lctx holds nothing to release, and the
			// response needs no body wrapper to release it.
			cancel = nil
		}
		c.cur, c.curCancel = resp, cancel
		return resp, nil
	}
	c.extra += hedges
	c.sends += hedges
	return c.settle(rs, ctx, leg{i: 0, resp: resp, err: err}, lost, hedges, start)
}

// sendFirst sends r, the first copy of rs's race, through t. A panic of
// the base ends the race before it leaves: no more hedges, those sent
// canceled and their answers closed.
func (rs *raceState) sendFirst(t *Transport, r *http.Request) (*http.Response, error) {
	sent := false
	defer func() {
		if sent {
			return
		}
		rs.mu.Lock()
		rs.over = true
		rs.timer.Stop()
		hedges, due := rs.hedges, rs.due
		rs.mu.Unlock()
		rs.p.hh.dues.End(due)
		reap(rs, 1+hedges, hedges, -1)
	}()
	resp, err := t.roundTrip(r)
	sent = true
	return resp, err
}

// firstCopy returns the request of a race's first copy, on lctx: the
// caller's request as send would send it when it would go as it is (same
// header), else a copy numbered num as a hedge's.
func (c *call) firstCopy(ctx, lctx context.Context, num int) *http.Request {
	if num == 1 && c.sends == 0 && c.src == c.req && c.key == nil && c.t.cfg.attemptTimeout == 0 && ctx == c.req.Context() && !callerMarks(c.req.Header) {
		return c.req.WithContext(lctx)
	}
	return legRequest(c.src, c.key, lctx, num, true, &c.t.timeouts)
}

// settle ends a race whose timer fired, once its first copy answered
// (first; lost if a hedge's good answer canceled it) and hedges were sent
// (none starts after that): the first good answer wins, or the last
// failure if every copy fails.
func (c *call) settle(rs *raceState, ctx context.Context, first leg, lost bool, hedges int, start time.Time) (*http.Response, error) {
	legs, pending := 1+hedges, hedges
	held := leg{i: -1} // the latest failure, returned if every copy fails
	switch {
	case lost: // its cancel was called by the hedge that won
		if first.resp != nil && first.resp.Body != nil {
			_ = first.resp.Body.Close()
		}
	case good(first.resp, first.err):
		return c.win(rs, first, legs, pending, start)
	default:
		if first.resp != nil {
			c.hh.pushback(first.resp.StatusCode, retryAfterOf(first.resp), first.resp.Header)
			capacityHint(c.dest, first.resp.StatusCode, first.resp.Header) // a losing copy's hint counts too
		}
		held = first
	}
	for pending > 0 {
		select {
		case l := <-rs.results:
			pending--
			c.closeLeg(held, rs)
			if good(l.resp, l.err) {
				return c.win(rs, l, legs, pending, start)
			}
			held = l
		case <-ctx.Done():
			c.closeLeg(held, rs)
			reap(rs, legs, pending, -1)
			return nil, ctx.Err()
		}
	}
	cancel := rs.cancels[held.i]
	if held.err != nil {
		cancel()
		return nil, held.err
	}
	c.cur, c.curCancel = held.resp, cancel
	return held.resp, nil
}

// win hands l, a race's first good answer, to the call, and cancels and
// closes the other legs.
func (c *call) win(rs *raceState, l leg, legs, pending int, start time.Time) (*http.Response, error) {
	if !rs.held {
		c.hh.lat.Record(start)
	}
	c.cur, c.curCancel = l.resp, rs.cancels[l.i]
	rs.won.Store(true) // before the cancels: a loser that sees its cancel sees it
	reap(rs, legs, pending, l.i)
	return l.resp, nil
}

// fire is rs's timer's callback: it sends a hedge, if the race still wants
// one and the guards allow it, and re-arms the timer for the next. The
// hedge runs on the timer's goroutine; a good answer cancels the first
// copy, still in flight, so that the race's caller gets the hedge's.
func (rs *raceState) fire() {
	rs.mu.Lock()
	p := rs.p
	g := p.dest.Guards
	cfg := &p.t.cfg
	if rs.over || rs.failed || rs.hedges >= cfg.hedge.max {
		rs.mu.Unlock()
		return
	}
	if !rs.dueAllows(p.hh, cfg.hedge.share) {
		// Held by the due-share bound: look again soon, while a hedge
		// could go but for the bound. A burst queued behind a few slow
		// requests clears within a few delays, and a copy still unanswered
		// then is most likely one of the slow ones, which its hedge
		// overtakes; a stall or an overload that lasts costs a few looks.
		if guardsAllow(g) && p.hh.quiet() {
			rs.timer.Reset(lathist.LookAgain(p.delay, rs.looks))
			rs.looks++
		}
		rs.mu.Unlock()
		return
	}
	if !guardsAllow(g) || !p.hh.quiet() || !g.Budget.Withdraw() {
		rs.mu.Unlock()
		return
	}
	slot, ok := hedgeSlot(g) // after the budget: a refused slot wastes a withdrawal, never a sample
	if !ok {
		rs.mu.Unlock()
		return
	}
	rs.hedges++
	i := rs.hedges
	lctx, cancel := legContext(p.ctx, cfg.attemptTimeout) // its own attempt timeout, from now
	rs.cancels[i] = cancel
	if rs.hedges < cfg.hedge.max {
		rs.timer.Reset(p.delay)
	}
	rs.mu.Unlock()

	num := p.num + i
	if cfg.observer != nil {
		lctx = hedgeStart(cfg.observer, p.dest, lctx, num)
	}
	t0 := time.Now()
	resp, err := p.t.roundTrip(legRequest(p.src, p.key, lctx, num, false, &p.t.timeouts)) // an observer of HTTP requests sees every leg
	releaseSlot(g, slot, p.ctx, lctx, rs.won.Load(), resp, err)
	won := good(resp, err)
	if !won && resp != nil {
		p.hh.pushback(resp.StatusCode, retryAfterOf(resp), resp.Header)
		capacityHint(p.dest, resp.StatusCode, resp.Header) // a losing hedge's hint counts too
	}
	rs.mu.Lock()
	winner := won && !rs.over && !rs.lost
	if winner {
		rs.lost = true
		rs.cancels[0]()
	}
	if !won {
		rs.failed = true // a failure: no more hedges in this race
	}
	rs.mu.Unlock()
	if cfg.observer != nil {
		// A good answer that came after another copy won lost the race:
		// "canceled", like a loser that its cancel stopped.
		hedgeEnd(cfg.observer, p.dest, lctx, num, resp, err, t0, won && !winner)
	}
	rs.results <- leg{i: i, resp: resp, err: err}
}

// legContext returns the context of one copy of a race, on ctx: capped
// at the attempt timeout d from now as send's attempts are, else only
// cancelable. Its cancel is the race's way to cancel the copy and the
// call's to release it.
func legContext(ctx context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	if d > 0 {
		return context.WithTimeout(ctx, d)
	}
	return context.WithCancel(ctx)
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

// reap cancels the first legs of rs but the winner (keep; -1 for none)
// and closes the answers of the pending ones as they come, on a goroutine
// of its own that ends with the last of them.
func reap(rs *raceState, legs, pending int, keep int) {
	for i, cancel := range rs.cancels[:legs] {
		if i != keep {
			cancel()
		}
	}
	if pending == 0 {
		return
	}
	go func() {
		for range pending {
			l := <-rs.results
			if l.resp != nil && l.resp.Body != nil {
				_ = l.resp.Body.Close()
			}
		}
	}()
}

// legRequest returns the request of one leg of a race: a copy of src on
// ctx, numbered num on the wire (with the transport's key, if any), marked
// as the breaker's probe if it is the primary of one (attemptHeader copies
// no probe mark of src's), with the time its caller waits (a value from
// tv, as an unhedged attempt's).
func legRequest(src *http.Request, key []string, ctx context.Context, num int, primary bool, tv *timeoutValues) *http.Request {
	r := src.WithContext(ctx)
	r.Header = attemptHeader(src.Header, key, num)
	if primary && retry.IsProbe(ctx) {
		r.Header[wire.ProbeHeader] = probeValue
	}
	if dl, ok := ctx.Deadline(); ok {
		r.Header[wire.TimeoutHeader] = tv.get(time.Until(dl))
	}
	return r
}
