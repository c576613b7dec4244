package httpretry

import (
	"context"
	"errors"
	"net/http"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/stormguard/stormguard/internal/lathist"
	"github.com/stormguard/stormguard/limit"
	"github.com/stormguard/stormguard/retry"
	"github.com/stormguard/stormguard/wire"
)

// leg is the end of one request of a race: i is 0 for the first copy,
// the hedge's rank for a hedge.
type leg struct {
	i    int
	resp *http.Response
	err  error
	p    any // the panic of a hedge's base (goexited for runtime.Goexit), raised in the caller's goroutine
}

// raceState is what one race uses: its copies' cancels, the hedges' ends
// and the timer that sends them. A Transport keeps a pool of them: a call
// whose first copy answers before the delay takes one, stops its timer
// before it fires and gives it back, allocating none of it. A race whose
// timer fired is never given back (a callback of its timer may still be
// running), unless the callback found it held and set the timer again,
// which the race then stopped: that callback touches rs no more.
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
	good    bool                              // a good answer, the first copy's or a hedge's after it, won (set once over)
	pick    int                               // the hedge that won (lost or good set by a hedge), 0: none
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
	rs.good = !rs.lost && good(resp, err)
	stopped := rs.timer.Stop()
	hedges, lost, due, held, firstGood := rs.hedges, rs.lost, rs.due, rs.held, rs.good
	earlier := len(rs.results) // the hedges that ended before the first copy answered
	rs.mu.Unlock()
	c.hh.dues.End(due) // the race is over as far as the due-share bound goes
	if firstGood {
		c.hh.dues.Answered(due) // late if the race reached its delay first: a timer that fired, no clock read
	}
	if stopped && hedges == 0 {
		// No hedge went, and the timer will not fire (it never did, or
		// only to find the race held, and was set again): rs is free again.
		rs.p = raceParams{}
		rs.cancels[0] = nil
		rs.over, rs.due, rs.held, rs.looks, rs.good, rs.pick = false, false, false, 0, false, 0
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
	return c.settle(rs, ctx, leg{i: 0, resp: resp, err: err}, lost, hedges, earlier, start)
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
// failure in time if every copy fails (earlier: the hedges that had ended
// when the first copy answered, the first ends on rs.results).
func (c *call) settle(rs *raceState, ctx context.Context, first leg, lost bool, hedges, earlier int, start time.Time) (*http.Response, error) {
	legs, pending := 1+hedges, hedges
	held := leg{i: -1} // the latest failure, returned if every copy fails
	switch {
	case lost: // its cancel was called by the hedge that won
		if first.resp != nil && !good(first.resp, first.err) {
			// A failed answer that came anyway (a base that ignores
			// the cancel, or one that crossed it) is the server's word
			// all the same.
			c.hh.pushback(first.resp.StatusCode, retryAfterOf(first.resp), first.resp.Header)
			capacityHint(c.dest, first.resp.StatusCode, first.resp.Header)
		}
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
	for read := 1; pending > 0; read++ {
		select {
		case l := <-rs.results:
			pending--
			if l.p == nil && !good(l.resp, l.err) && read <= earlier && held.i >= 0 {
				// Failed before the first copy did: not the last failure,
				// unless it carried more of the server's word (a
				// don't-retry signal, a longer Retry-After), which stands.
				if outranks(l, held) {
					l, held = held, l
				}
				c.closeLeg(l, rs)
				continue
			}
			if l.p == nil && !good(l.resp, l.err) && outranks(held, l) {
				// An earlier copy's failure carried the server's word
				// (its don't-retry signal, a longer Retry-After): it
				// stands, so that the loop heeds it.
				c.closeLeg(l, rs)
				continue
			}
			if l.p == nil && good(l.resp, l.err) && rs.lostTo(l.i) {
				// A good answer after the winner's (whose end the race
				// has not read yet): a loser, as the observer heard.
				_ = l.resp.Body.Close()
				rs.cancels[l.i]()
				continue
			}
			c.closeLeg(held, rs)
			if l.p != nil {
				reap(rs, legs, pending, -1)
				if l.p == goexited {
					runtime.Goexit()
				}
				panic(l.p)
			}
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

// lostTo reports whether a hedge other than i won rs's race (see
// hedgeEnded).
func (rs *raceState) lostTo(i int) bool {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	return rs.pick != 0 && rs.pick != i
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
	if rs.over || rs.failed || rs.lost || rs.hedges >= cfg.hedge.max {
		rs.mu.Unlock()
		return // answered, failed, won by a hedge, or every hedge sent
	}
	if !rs.dueAllows(p.hh, cfg.hedge.share) || p.hh.dues.Queued(p.delay) {
		// Held by the due-share bound, or by a queue at the host (its
		// last answers all late: a hedge would wait behind the same
		// requests and lengthen the queue): look again soon, while a hedge
		// could go but for the bound. A burst queued behind a few slow
		// requests clears within a few delays, and a copy still unanswered
		// then is most likely one of the slow ones, which its hedge
		// overtakes; a stall or an overload that lasts costs a few looks.
		// A race held by a queue alone is not marked held: the queue is
		// the host's latency now, and a lasting one is to be learned.
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
	t0 := time.Now()
	returned := false
	defer func() {
		if returned {
			return
		}
		// The base (or the observer, hearing of the hedge's start)
		// panicked, or called runtime.Goexit, on the timer's goroutine,
		// where a panic would end the program: the hedge ends as a
		// failure that wins the race, and the race raises the panic (the
		// Goexit) in the caller's goroutine, as a first copy's goes on
		// there.
		pv := recover()
		if pv == nil {
			pv = goexited
		}
		rs.hedgeEnded(i, num, lctx, slot, t0, nil, errPanicked, pv)
	}()
	if cfg.observer != nil {
		lctx = hedgeStart(cfg.observer, p.dest, lctx, num)
	}
	resp, err := p.t.roundTrip(legRequest(p.src, p.key, lctx, num, false, &p.t.timeouts)) // an observer of HTTP requests sees every leg
	returned = true
	rs.hedgeEnded(i, num, lctx, slot, t0, resp, err, nil)
}

// hedgeEnded ends hedge i (numbered num on the wire) of rs, sent on lctx
// at t0 with slot: a failed answer's body is read and its slot goes back,
// its pushback and capacity hint count, a good answer (or a panic, pv not
// nil) that comes first wins the race, an observer hears its end, and the
// race gets it.
func (rs *raceState) hedgeEnded(i, num int, lctx context.Context, slot limit.Permit, t0 time.Time, resp *http.Response, err error, pv any) {
	p := rs.p
	g := p.dest.Guards
	won := pv == nil && good(resp, err)
	if won {
		p.hh.dues.Answered(time.Since(t0) > p.delay) // the hedge's own time
	}
	if !won && resp != nil {
		detachBody(lctx, resp) // a failed answer holds its slot while its body is read, as send's does
	}
	releaseSlot(g, slot, p.ctx, lctx, rs.won.Load(), resp, err)
	if !won && resp != nil {
		p.hh.pushback(resp.StatusCode, retryAfterOf(resp), resp.Header)
		capacityHint(p.dest, resp.StatusCode, resp.Header) // a losing hedge's hint counts too
	}
	rs.mu.Lock()
	// The winner: the first good answer (or panic). Before the first copy
	// answered, it cancels that copy; after a failed first copy, the
	// race takes the first good hedge (settle), which the observer hears
	// as a success, not as a loser's "canceled".
	winner := (won || pv != nil) && !rs.lost && !rs.good
	if winner && rs.over {
		rs.good = true
	} else if winner {
		rs.lost = true
		rs.cancels[0]()
	}
	if winner {
		rs.pick = i
	}
	if !won {
		rs.failed = true // a failure: no more hedges in this race
	}
	rs.mu.Unlock()
	out := leg{i: i, resp: resp, err: err, p: pv}
	// The race gets the hedge's end even if the observer panics (or calls
	// runtime.Goexit) hearing of it, on the timer's goroutine: the panic
	// goes to the caller's goroutine as the base's would.
	defer func() { rs.results <- out }()
	if o := p.t.cfg.observer; o != nil {
		reported := false
		defer func() {
			if reported {
				return
			}
			v := recover()
			if v == nil {
				v = goexited
			}
			if out.p == nil {
				if out.resp != nil {
					_ = out.resp.Body.Close() // the race raises the panic: no one reads it
				}
				out.resp, out.err, out.p = nil, errPanicked, v
			}
		}()
		// A good answer that came after another copy won lost the race:
		// "canceled", like a loser that its cancel stopped.
		hedgeEnd(o, p.dest, p.ctx, lctx, num, resp, err, t0, won && !winner)
		reported = true
	}
}

// errPanicked is the error of a hedge whose base panicked or called
// runtime.Goexit: a failure (its limiter slot is given back as a drop).
var errPanicked = errors.New("httpretry: the base transport panicked during a hedge")

// goexited is the panic value of a hedge whose base called
// runtime.Goexit: the race calls runtime.Goexit in the caller's goroutine
// for it, as it panics there with a hedge's panic.
var goexited any = &errPanicked

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
		discardBody(l.resp.Body) // read already, if a hedge's (detachBody)
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

// outranks reports whether a race's failed copy a carries more of the
// server's word than b, a later one: the don't-retry signal, or a longer
// Retry-After floor.
func outranks(a, b leg) bool {
	if da, db := a.resp != nil && wire.DontRetry(a.resp.Header), b.resp != nil && wire.DontRetry(b.resp.Header); da != db {
		return da
	}
	return floorOf(a) > floorOf(b)
}

// floorOf returns the Retry-After a race's failed copy gives the retry
// loop as the floor of its next sleep (on any failure the transport
// retries, and a 409, as the transport reads it), 0 if none.
func floorOf(l leg) time.Duration {
	if l.resp == nil {
		return 0
	}
	if code := l.resp.StatusCode; isRetryableStatus(code) || code == http.StatusInternalServerError || code == http.StatusConflict {
		return retryAfterOf(l.resp)
	}
	return 0
}
