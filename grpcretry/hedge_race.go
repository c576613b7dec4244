package grpcretry

import (
	"context"
	"errors"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/stormguard/stormguard/grpcretry/internal/lathist"
	"github.com/stormguard/stormguard/limit"
)

// raceState is what one race uses: its copies' cancels, the hedges' ends
// and the timer that sends them. A client keeps a pool of them: a call
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
	over    bool                              // the first copy returned: no more hedges, and none cancels it
	failed  bool                              // a hedge failed: no more hedges
	lost    bool                              // a hedge's good answer (or panic) canceled the first copy
	good    bool                              // a good answer, the first copy's or a hedge's after it, won (set once over)
	pick    int                               // the hedge that won (lost or good set by a hedge), 0: none
	held    bool                              // the due-share bound refused its first hedge: its time is not learned
	looks   int                               // the looks of a held race since its delay (see lathist.LookAgain)
	due     bool                              // the race reached its delay: counted as due until it ends
	won     atomic.Bool                       // a copy's end (a good answer, a panic) ended the race: it canceled the others
}

// raceParams is what the hedges of a race are made from: copies of the
// call's fields (a *unaryCall that the timer's goroutine could reach would
// be moved to the heap by the compiler, and every call would allocate it).
type raceParams struct {
	cfg     *config
	t       *target
	hh      *hedgeTarget
	ctx     context.Context // the attempt's context: every copy's parent
	num     int             // the first copy's wire number; hedge i carries num+i
	delay   time.Duration
	mt      protoreflect.MessageType // the reply's type, read before the first copy went
	invoker grpc.UnaryInvoker
	method  string
	req     any
	cc      *grpc.ClientConn
	opts    []grpc.CallOption // the caller's
}

// getRace returns a race state from the pool, its timer stopped.
func (h *hedging) getRace() *raceState {
	if rs, ok := h.races.Get().(*raceState); ok {
		return rs
	}
	rs := &raceState{results: make(chan leg, maxHedges)}
	rs.timer = time.AfterFunc(time.Hour, rs.fire)
	rs.timer.Stop()
	return rs
}

// race sends attempt n as its first copy, on the caller's goroutine,
// decoding into the caller's reply, and arms rs's timer: each time delay
// passes without a good answer, the timer's goroutine sends a hedge while
// the guards allow one, up to the configured number, each decoding into a
// reply of its own. The first good answer wins; the others are canceled. A
// hedge's good answer cancels the first copy, which returns at once (gRPC
// ends a call on cancel), so that the reply is the caller's alone when
// the hedge's is merged into it. A race the first copy wins before the
// delay costs the first copy's cancelable context over the same attempt
// without hedging: no goroutine, and its state comes from a pool.
func (u *unaryCall) race(ctx context.Context, n int, delay time.Duration) end {
	cfg := &u.c.cfg
	h := u.c.hedges
	// The reply's type, read before the first copy may decode into it.
	mt := u.reply.(proto.Message).ProtoReflect().Type()
	lctx, cancel := legContext(ctx, cfg.attemptTimeout)
	rs := h.getRace()
	rs.mu.Lock()
	rs.p = raceParams{cfg: cfg, t: u.t, hh: u.hh, ctx: ctx, num: n + u.extra, delay: delay, mt: mt,
		invoker: u.invoker, method: u.method, req: u.req, cc: u.cc, opts: u.opts}
	rs.cancels[0] = cancel
	rs.timer.Reset(delay)
	rs.mu.Unlock()

	first := rs.sendFirst(legCall{invoker: u.invoker, method: u.method, req: u.req, reply: u.reply, cc: u.cc,
		opts: u.hold.opts, trailer: &u.hold.trailer, timeout: cfg.attemptTimeout}, ctx, lctx)

	rs.mu.Lock()
	rs.over = true
	rs.good = !rs.lost && good(first.err)
	stopped := rs.timer.Stop()
	hedges, lost, held, due, firstGood := rs.hedges, rs.lost, rs.held, rs.due, rs.good
	earlier := len(rs.results) // the hedges that ended before the first copy returned
	rs.mu.Unlock()
	u.hh.dues.End(due) // the race is over as far as the due-share bound goes
	if firstGood {
		u.hh.dues.Answered(due) // late if the race reached its delay first: a timer that fired, no clock read
	}
	u.held = held
	if stopped && hedges == 0 {
		// No hedge went, and the timer will not fire (it never did, or
		// only to find the race held, and was set again): rs is free again.
		rs.p = raceParams{}
		rs.cancels[0] = nil
		rs.over, rs.due, rs.held, rs.looks, rs.good, rs.pick = false, false, false, 0, false, 0
		h.races.Put(rs)
		cancel()
		if !good(first.err) {
			u.hh.pushback(first.err, first.trailer)
		}
		return first
	}
	u.extra += hedges
	return u.settle(rs, ctx, first, lost, hedges, earlier)
}

// sendFirst makes l's call, the first copy of rs's race, on lctx, a child
// of the attempt's ctx. A panic of the invoker ends the race before it
// goes on in the caller's goroutine: no more hedges, those sent canceled.
func (rs *raceState) sendFirst(l legCall, ctx, lctx context.Context) end {
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
		reap(rs, 1+hedges, hedges, true) // the panic ends the race: its hedges are no drops
	}()
	err := l.invoker(lctx, l.method, l.req, l.reply, l.cc, l.opts...)
	sent = true
	return end{err: err, trailer: *l.trailer, timedOut: l.timeout > 0 && err != nil && attemptExpired(ctx, lctx, err, l.timeout) && ctx.Err() == nil}
}

// settle ends a race whose timer fired, once its first copy returned
// (first; lost if a hedge's good answer or panic canceled it) and hedges
// were sent (none starts after that): the first good answer wins, the
// first copy's if it has one (the caller's reply holds it), or the last
// failure in time if every copy fails (earlier: the hedges that had ended
// when the first copy returned, the first ends on rs.results). A hedge's
// panic goes on in the caller's goroutine unless a good answer came first.
func (u *unaryCall) settle(rs *raceState, ctx context.Context, first end, lost bool, hedges, earlier int) end {
	legs, pending := 1+hedges, hedges
	if good(first.err) {
		reap(rs, legs, pending, true)
		return first
	}
	// A failure that came after a hedge won (a server's answer that
	// crossed the cancel) is its word all the same; the cancel's own
	// error pushes nothing back.
	u.hh.pushback(first.err, first.trailer)
	last := leg{i: 0, e: first} // the latest failure, returned if every copy fails
	for read := 1; pending > 0; read++ {
		select {
		case l := <-rs.results:
			pending--
			switch {
			case l.p != nil:
				reap(rs, legs, pending, true)
				if l.p == goexited {
					runtime.Goexit()
				}
				panic(l.p)
			case good(l.e.err) && rs.lostTo(l.i):
				continue // a good answer after the winner's, whose end the race has not read yet: a loser, as the observer heard
			case good(l.e.err):
				reap(rs, legs, pending, true)
				l.hl.won(u.reply, l.e.err == nil)
				return l.e
			case read <= earlier && !outranks(l.e, last.e):
				continue // failed before the first copy did: not the last failure, unless it carried more of the server's word
			case outranks(last.e, l.e):
				continue // an earlier failure carried more of the server's word
			}
			last = l
		case <-ctx.Done():
			reap(rs, legs, pending, false)
			return end{err: status.FromContextError(ctx.Err()).Err()}
		}
	}
	reap(rs, legs, 0, false)
	if last.hl != nil {
		last.hl.won(u.reply, false) // the caller's header, trailer and peer are the failure's
	}
	return last.e
}

// lostTo reports whether a hedge other than i won rs's race (see
// hedgeEnded).
func (rs *raceState) lostTo(i int) bool {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	return rs.pick != 0 && rs.pick != i
}

// reap cancels the first legs of rs, releasing their contexts (their
// calls, all ended or canceled, are over), and receives the ends of the
// pending ones on a goroutine of its own that ends with the last of them.
// won: a copy's end decided the race, so the copies it cancels are its
// losers (no drops for the limiter), not calls whose caller left.
func reap(rs *raceState, legs, pending int, won bool) {
	if won {
		rs.won.Store(true) // before the cancels: a loser that sees its cancel sees it
	}
	for _, cancel := range rs.cancels[:legs] {
		cancel()
	}
	if pending == 0 {
		return
	}
	go func() {
		for range pending {
			<-rs.results
		}
	}()
}

// fire is rs's timer's callback: it sends a hedge, if the race still wants
// one and the guards allow it, and re-arms the timer for the next. The
// hedge runs on the timer's goroutine, decoding into a reply of its own; a
// good answer (or a panic of its invoker) cancels the first copy, still in
// flight, so that the race's caller gets the hedge's.
func (rs *raceState) fire() {
	rs.mu.Lock()
	p := rs.p
	cfg := p.cfg
	g := p.t.Guards
	if rs.over || rs.failed || rs.lost || rs.hedges >= cfg.hedge.max {
		rs.mu.Unlock()
		return // answered, failed, won by a hedge, or every hedge sent
	}
	if !rs.dueAllows(p.hh, cfg.hedge.share) || p.hh.dues.Queued(p.delay) {
		// Held by the due-share bound, or by a queue at the target (its
		// last answers all late: a hedge would wait behind the same calls
		// and lengthen the queue): look again soon, while a hedge could go
		// but for the bound. A burst queued behind a few slow calls clears
		// within a few delays, and a copy still unanswered then is most
		// likely one of the slow ones, which its hedge overtakes; a stall
		// or an overload that lasts costs a few looks. A race held by a
		// queue alone is not marked held: the queue is the target's
		// latency now, and a lasting one is to be learned.
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
	hl := newHedgeLeg(p.mt, p.opts)
	lctx = hedgeContext(lctx, num)
	l := legCall{invoker: p.invoker, method: p.method, req: p.req, reply: hl.reply, cc: p.cc, opts: hl.opts, trailer: &hl.trailer,
		timeout: cfg.attemptTimeout}
	t0 := time.Now()
	returned := false
	defer func() {
		if !returned {
			// runtime.Goexit in the invoker (an interceptor's t.FailNow),
			// or a panic (or Goexit) of the observer hearing of the
			// hedge's start, on the timer's goroutine where a panic would
			// end the program: the hedge still ends, its slot given back
			// and its end sent to the race, which goes on with the panic
			// (the Goexit) in the caller's goroutine.
			pv, err := recover(), errPanicked
			if pv == nil {
				pv, err = goexited, errGoexited
			}
			rs.hedgeEnded(i, num, hl, l, lctx, slot, t0, pv, err)
		}
	}()
	if o := cfg.observer; o != nil {
		lctx = hedgeStart(o, lctx, p.t.Name, num)
	}
	pv, err := invoke(l, lctx)
	returned = true
	rs.hedgeEnded(i, num, hl, l, lctx, slot, t0, pv, err)
}

// hedgeEnded ends hedge i (numbered num on the wire) of rs, made by l on
// lctx from t0 with slot: its slot goes back, a failure's pushback counts,
// a good answer (or a panic) that comes first wins the race, an observer
// hears its end, and the race gets it. pv is its panic (goexited for a
// runtime.Goexit), err its error.
func (rs *raceState) hedgeEnded(i, num int, hl *hedgeLeg, l legCall, lctx context.Context, slot limit.Permit, t0 time.Time, pv any, err error) {
	p := rs.p
	g := p.t.Guards
	e := end{err: err, trailer: hl.trailer, timedOut: l.timeout > 0 && err != nil && attemptExpired(p.ctx, lctx, err, l.timeout) && p.ctx.Err() == nil}
	ours := errors.Is(lctx.Err(), context.Canceled) && (rs.won.Load() || p.ctx.Err() == nil) // the race canceled it
	if g.Limiter != nil {
		g.Limiter.Release(slot, !good(err) && !ours) // a loser is no sign of overload
	}
	won := pv == nil && good(err)
	if won {
		p.hh.dues.Answered(time.Since(t0) > p.delay) // the hedge's own time
	}
	if !won && pv == nil {
		p.hh.pushback(err, e.trailer)
	}
	rs.mu.Lock()
	// The winner: the first good answer (or panic). Before the first copy
	// returned, it cancels that copy; after a failed first copy, the race
	// takes the first good hedge (settle), which the observer hears as a
	// success, not as a loser's "canceled".
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
	out := leg{i: i, e: e, hl: hl, p: pv}
	// The race gets the hedge's end even if the observer panics (or calls
	// runtime.Goexit) hearing of it, on the timer's goroutine: the panic
	// goes to the caller's goroutine as the invoker's would.
	defer func() { rs.results <- out }()
	if o := p.cfg.observer; o != nil {
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
				out.p = v
			}
		}()
		// A good answer that came after another copy won lost the race:
		// "canceled", like a loser that its cancel stopped.
		hedgeEnd(o, p.ctx, lctx, p.t.Name, num, err, t0, won && !winner)
		reported = true
	}
}

// legContext returns the context of one copy of a race, on ctx: only
// cancelable, and capped at the attempt timeout d from now as send's
// attempts are if d > 0. Its cancel is the race's way to cancel the copy
// and to release it.
func legContext(ctx context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	if d > 0 {
		return context.WithTimeout(ctx, d)
	}
	return context.WithCancel(ctx)
}

// legCall is what one copy needs to make its call.
type legCall struct {
	invoker grpc.UnaryInvoker
	method  string
	req     any
	reply   any
	cc      *grpc.ClientConn
	opts    []grpc.CallOption
	trailer *metadata.MD  // what opts read the trailer into
	timeout time.Duration // the leg's attempt timeout (0: none)
}

// errPanicked is the end of a copy whose invoker panicked: a failure
// (its limiter slot is given back as a drop), never a race's winner;
// errGoexited the same for one whose invoker called runtime.Goexit.
var (
	errPanicked = status.Error(codes.Internal, "grpcretry: the invoker panicked")
	errGoexited = status.Error(codes.Internal, "grpcretry: the invoker called runtime.Goexit")
)

// goexited is the panic value of a hedge whose invoker called
// runtime.Goexit: the race raises runtime.Goexit in the caller's
// goroutine for it, as it raises a hedge's panic.
var goexited any = &errGoexited

// invoke makes l's call on lctx. A panic of the invoker (an interceptor
// under the client's) is recovered, for the race to raise it again in the
// caller's goroutine: on the copy's own it would end the program.
func invoke(l legCall, lctx context.Context) (p any, err error) {
	defer func() {
		if p = recover(); p != nil {
			err = errPanicked
		}
	}()
	return nil, l.invoker(lctx, l.method, l.req, l.reply, l.cc, l.opts...)
}
