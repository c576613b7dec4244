package grpcretry

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/budget"
	"github.com/stormguard/stormguard/grpcretry/internal/guards"
	"github.com/stormguard/stormguard/grpcretry/internal/lathist"
	"github.com/stormguard/stormguard/limit"
	"github.com/stormguard/stormguard/observe"
	"github.com/stormguard/stormguard/retry"
	"github.com/stormguard/stormguard/wire"
)

// The fixed parameters of hedging (docs/hedging.md), those of httpretry's.
const (
	// hedgeWindow is the period of a target's latency windows: the
	// learned delay reads the good answers of the last 10 to 20 s.
	hedgeWindow = 10 * time.Second
	// inflatedFactor: no hedge while the target's recent median latency
	// is above this many times its baseline median (overload).
	inflatedFactor = 3
	// pushbackHold is the least time no hedge goes to a target after it
	// pushed back; a longer hint holds for as long.
	pushbackHold = 5 * time.Second
	// maxHedges bounds WithHedging's max.
	maxHedges = 8
)

// WithHedging hedges the unary calls of methods (full method names,
// "/package.Service/Method"), which the caller declares safe to send twice
// at the same time: when an attempt has not answered within delay, the
// client sends up to max (0 means 1; at most 8) further copies of it, delay
// apart, while it is still in flight; the first good answer (OK, or any
// code but UNAVAILABLE, RESOURCE_EXHAUSTED, INTERNAL, ABORTED,
// DEADLINE_EXCEEDED and CANCELLED) wins, and the other copies are canceled.
// No other method is hedged, and no stream is. Declaring a method here does
// not make it idempotent for retries ([WithIdempotentMethods]). A hedged
// call's reply must be a proto.Message (a hedge decodes into a fresh one,
// merged into the caller's if it wins); other calls go unhedged.
//
// delay = 0 learns the delay per target: the quantile q of the time to a
// good answer of the target's recent calls of these methods (the last 10
// to 20 s; q = 0 means 0.95); with fewer than 20 such answers, no hedge
// goes. A positive delay is fixed. A negative delay, q outside [0, 1), max
// outside [0, 8], no method, or a name that is not a full method name is
// an error of [DialOptions].
//
// A hedge is only sent when the target's retry budget grants it (each hedge
// is one withdrawal: no budget, no hedge), its breaker is closed, its
// concurrency limiter ([WithLimit]) has a free slot at once (the hedge
// holds it until it ends) and is not throttling, the target has not pushed
// back in the last 5 s (RESOURCE_EXHAUSTED, or a failure but ABORTED with
// a pushback trailer or a RetryInfo, a don't-retry pushback included; a
// longer hint holds for as long, up to about 35 years), and its recent
// median latency is at most 3 times its baseline. Nor does a hedge go
// while more of the target's races reached their delay in the last second
// (counted as the delay passes, answered or not) than 5 and than 3(1-q) of
// the races started in it (at most halfway between 1-q and all of them):
// that is a stall or an overload, not a tail. With a fixed delay, q (0
// meaning 0.95) is the share of answers the delay is expected to cover,
// for this bound only. The time of a race held back by this bound does not
// count in the learned delay. An ABORTED says the
// call met another, not load: it is what an idempotency server
// ([IdempotencyUnaryServerInterceptor]) answers a keyed hedge whose first
// copy it still runs, so such a hedge wins only when the first copy never
// reached the handler. Each hedge is an attempt on the wire: it carries
// the next "grpc-previous-rpc-attempts" number and the call's idempotency
// key, if
// any, and an observer hears its own AttemptStart and AttemptEnd
// (Event.Hedge set; a canceled loser ends with Outcome "canceled"). The
// retry loop counts the race as one attempt with the winner's answer; a
// retry after it carries the number after the hedges'. A race its first
// copy wins before the delay costs its first copy's cancelable context
// (5 allocations over the same call without hedging); an attempt that
// ends before the delay could pass (the call's deadline, or an attempt
// timeout, comes first) runs no race, and costs what it costs without
// hedging. A later WithHedging replaces the earlier one. Off by default.
func WithHedging(delay time.Duration, q float64, max int, methods ...string) Option {
	return option(func(c *config) error {
		switch {
		case delay < 0:
			return invalid("hedge delay %v must not be negative", delay)
		case q < 0 || q >= 1 || q != q:
			return invalid("hedge quantile %v must be in [0, 1)", q)
		case max < 0 || max > maxHedges:
			return invalid("hedges %d must be in [0, %d]", max, maxHedges)
		case len(methods) == 0:
			return invalid("hedging needs at least one method")
		}
		m := make(map[string]bool, len(methods))
		for _, name := range methods {
			if name == "" || name[0] != '/' {
				return invalid("hedged method %q is not a full method name (/package.Service/Method)", name)
			}
			m[name] = true
		}
		if q == 0 {
			q = 0.95
		}
		if max == 0 {
			max = 1
		}
		c.hedge = &hedgeConfig{delay: delay, q: q, max: max, methods: m, share: dueShare(q)}
		return nil
	})
}

// hedgeConfig is what WithHedging set.
type hedgeConfig struct {
	delay   time.Duration // 0: learned
	q       float64
	max     int
	methods map[string]bool
	share   float64 // dueShare(q)
}

// hedgeTarget is what hedging keeps per target.
type hedgeTarget struct {
	lat      *lathist.Hist
	base     time.Time    // when the target was first seen: the origin of pushedTo
	pushedTo atomic.Int64 // no hedge before this time (since base), ns
	// dues counts the target's races, and those that reached their delay, per second.
	dues *lathist.Dues
}

// hedging is a client's hedging state: its targets' and a pool of race
// states.
type hedging struct {
	targets *guards.Table[*hedgeTarget]
	races   sync.Pool
}

// newHedging returns the hedging state of a client configured with cfg,
// nil without hedging.
func newHedging(cfg *hedgeConfig) *hedging {
	if cfg == nil {
		return nil
	}
	q := cfg.q
	return &hedging{targets: guards.NewTable(maxTargets, func(string) (*hedgeTarget, error) {
		return &hedgeTarget{lat: lathist.New(hedgeWindow, q), dues: newDues(), base: time.Now()}, nil
	})}
}

// hedgeState returns the hedging state of the target of a call of method
// with reply, nil if the call is never hedged.
func (c *client) hedgeState(t *target, method string, reply any) *hedgeTarget {
	if c.hedges == nil || !c.cfg.hedge.methods[method] {
		return nil
	}
	if _, ok := reply.(proto.Message); !ok {
		return nil
	}
	ht, _ := c.hedges.targets.Get(t.Name)
	return ht
}

// pushback notes a failed answer of the target that asks for less load:
// RESOURCE_EXHAUSTED, or any failure but ABORTED with a server hint (a
// pushback trailer, a don't-retry one included, or a RetryInfo). No hedge
// goes to the target for pushbackHold, or the hint if longer. An ABORTED
// says the call met another, not load: a keyed hedge meets its own first
// copy still running on the server (the idempotency interceptor's answer).
func (ht *hedgeTarget) pushback(err error, trailer metadata.MD) {
	if ht == nil || err == nil {
		return
	}
	st := statusOf(err)
	if st.Code() == codes.Aborted {
		return
	}
	h := serverHint(trailer, st)
	if st.Code() != codes.ResourceExhausted && !h.set && !h.stop {
		return
	}
	to := int64(time.Since(ht.base) + max(h.after, pushbackHold))
	for {
		cur := ht.pushedTo.Load()
		if cur >= to || ht.pushedTo.CompareAndSwap(cur, to) {
			return
		}
	}
}

// quiet reports whether the target may get a hedge as far as its own
// answers say: no recent pushback, no inflated latency.
func (ht *hedgeTarget) quiet() bool {
	return int64(time.Since(ht.base)) >= ht.pushedTo.Load() && !ht.lat.Inflated(inflatedFactor)
}

// guardsAllow reports whether g lets a hedge go now, short of spending the
// budget and taking a slot of the limiter: a budget to pay it (a nil
// *budget.Budget is none) and a closed breaker.
func guardsAllow(g retry.Guards) bool {
	if bb, ok := g.Budget.(*budget.Budget); g.Budget == nil || ok && bb == nil {
		return false
	}
	return g.Breaker == nil || g.Breaker.State() == breaker.Closed
}

// hedgeSlot takes a slot of the target's concurrency limiter for a hedge,
// if it has one: at once or not at all (a limiter at its limit, or
// throttling, refuses). ok is false on a refusal.
func hedgeSlot(g retry.Guards) (p limit.Permit, ok bool) {
	if g.Limiter == nil {
		return p, true
	}
	p, err := g.Limiter.Acquire(context.Background()) // no deadline: no wait
	return p, err == nil
}

// good reports whether an attempt's end wins a race: success, or a code
// that is the target's answer rather than a failure to answer.
func good(err error) bool {
	if err == nil {
		return true
	}
	switch status.Code(err) {
	case codes.Unavailable, codes.ResourceExhausted, codes.Internal, codes.Aborted, codes.DeadlineExceeded, codes.Canceled:
		return false
	}
	return true
}

// end is how an attempt ended: its error, its trailer, and whether its own
// timeout cut it off while the call still had time.
type end struct {
	err      error
	trailer  metadata.MD
	timedOut bool
}

// first sends attempt n (ctx carries its metadata): raced against hedges
// when the target allows them, else as send does. A good answer counts in
// the target's latencies, and a pushback holds hedges back.
func (u *unaryCall) first(ctx context.Context, n int) end {
	ht := u.hh
	start := time.Now()
	delay := u.c.cfg.hedge.delay
	if delay == 0 {
		delay = ht.lat.Quantile()
	}
	if delay > 0 && guardsAllow(u.t.Guards) && ht.quiet() && !endsBefore(ctx, start, delay, u.c.cfg.attemptTimeout) {
		u.held = false
		ht.dues.Start(start)
		e := u.race(ctx, n, delay) // notes each failed copy's pushback
		if good(e.err) && !u.held {
			ht.lat.Record(start)
		}
		return e
	}
	e := u.send(ctx)
	if good(e.err) {
		ht.lat.Record(start)
	} else {
		ht.pushback(e.err, e.trailer)
	}
	return e
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

// leg is the end of one copy of a race: i is its index (0: the first
// copy, which decodes into the caller's reply), hl its own state (nil for
// the first copy).
type leg struct {
	i  int
	e  end
	hl *hedgeLeg
	p  any // what the copy's invoker panicked with; nil: it returned
}

// hedgeLeg is what a hedge has of its own: the reply it decodes into, and
// its call options with the header, trailer and peer they read into in
// place of the caller's (two copies in flight must not write the same
// variables): the caller's are set from these if the hedge wins.
type hedgeLeg struct {
	reply   proto.Message
	header  metadata.MD
	trailer metadata.MD
	peer    peer.Peer
	opts    []grpc.CallOption
	outs    []grpc.CallOption // the caller's header, trailer and peer options
}

// newHedgeLeg returns the state of a hedge of a call whose reply has type
// mt, with the caller's options opts. It takes the type, not the reply: the
// first copy may be decoding into the reply meanwhile.
func newHedgeLeg(mt protoreflect.MessageType, opts []grpc.CallOption) *hedgeLeg {
	hl := &hedgeLeg{reply: mt.New().Interface()}
	hl.opts = make([]grpc.CallOption, 0, len(opts)+1)
	for _, o := range opts {
		switch o := o.(type) {
		case grpc.HeaderCallOption:
			hl.outs = append(hl.outs, o)
			o.HeaderAddr = &hl.header
			hl.opts = append(hl.opts, o)
		case grpc.TrailerCallOption:
			hl.outs = append(hl.outs, o) // read into hl.trailer below
		case grpc.PeerCallOption:
			hl.outs = append(hl.outs, o)
			o.PeerAddr = &hl.peer
			hl.opts = append(hl.opts, o)
		case grpc.OnFinishCallOption: // run once by the call (onFinish)
		default:
			hl.opts = append(hl.opts, o)
		}
	}
	hl.opts = append(hl.opts, grpc.Trailer(&hl.trailer))
	return hl
}

// won sets the caller's reply, header, trailer and peer from the hedge's,
// once the first copy, which wrote them, has returned.
func (hl *hedgeLeg) won(reply any, ok bool) {
	if ok {
		proto.Reset(reply.(proto.Message))
		proto.Merge(reply.(proto.Message), hl.reply)
	}
	for _, o := range hl.outs {
		switch o := o.(type) {
		case grpc.HeaderCallOption:
			*o.HeaderAddr = hl.header
		case grpc.TrailerCallOption:
			*o.TrailerAddr = hl.trailer
		case grpc.PeerCallOption:
			*o.PeerAddr = hl.peer
		}
	}
}

// raceState is what one race uses: its copies' cancels, the hedges' ends
// and the timer that sends them. A client keeps a pool of them: a call
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
	over    bool                              // the first copy returned: no more hedges, and none cancels it
	failed  bool                              // a hedge failed: no more hedges
	lost    bool                              // a hedge's good answer (or panic) canceled the first copy
	held    bool                              // the due-share bound refused its first hedge: its time is not learned
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
		opts: u.hold.opts, trailer: &u.hold.trailer, timeout: cfg.attemptTimeout > 0}, ctx, lctx)

	rs.mu.Lock()
	rs.over = true
	stopped := rs.timer.Stop()
	hedges, lost, held := rs.hedges, rs.lost, rs.held
	rs.mu.Unlock()
	u.held = held
	if stopped && hedges == 0 {
		// The timer never fired: no hedge, and rs is free again.
		rs.p = raceParams{}
		rs.cancels[0] = nil
		rs.over = false
		h.races.Put(rs)
		cancel()
		if !good(first.err) {
			u.hh.pushback(first.err, first.trailer)
		}
		return first
	}
	u.extra += hedges
	return u.settle(rs, ctx, first, lost, hedges)
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
		hedges := rs.hedges
		rs.mu.Unlock()
		reap(rs, 1+hedges, hedges)
	}()
	err := l.invoker(lctx, l.method, l.req, l.reply, l.cc, l.opts...)
	sent = true
	return end{err: err, trailer: *l.trailer, timedOut: l.timeout && err != nil && attemptExpired(lctx, err) && ctx.Err() == nil}
}

// settle ends a race whose timer fired, once its first copy returned
// (first; lost if a hedge's good answer or panic canceled it) and hedges
// were sent (none starts after that): the first good answer wins, the
// first copy's if it has one (the caller's reply holds it), or the last
// failure if every copy fails. A hedge's panic goes on in the caller's
// goroutine unless a good answer came first.
func (u *unaryCall) settle(rs *raceState, ctx context.Context, first end, lost bool, hedges int) end {
	legs, pending := 1+hedges, hedges
	if good(first.err) {
		reap(rs, legs, pending)
		return first
	}
	if !lost {
		u.hh.pushback(first.err, first.trailer)
	}
	last := leg{i: 0, e: first} // the latest failure, returned if every copy fails
	for pending > 0 {
		select {
		case l := <-rs.results:
			pending--
			switch {
			case l.p != nil:
				reap(rs, legs, pending)
				panic(l.p)
			case good(l.e.err):
				reap(rs, legs, pending)
				l.hl.won(u.reply, l.e.err == nil)
				return l.e
			}
			last = l
		case <-ctx.Done():
			reap(rs, legs, pending)
			return end{err: status.FromContextError(ctx.Err()).Err()}
		}
	}
	reap(rs, legs, 0)
	if last.hl != nil {
		last.hl.won(u.reply, false) // the caller's header, trailer and peer are the failure's
	}
	return last.e
}

// reap cancels the first legs of rs, releasing their contexts (their
// calls, all ended or canceled, are over), and receives the ends of the
// pending ones on a goroutine of its own that ends with the last of them.
func reap(rs *raceState, legs, pending int) {
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
	if rs.over || rs.failed || rs.hedges >= cfg.hedge.max || !rs.dueAllows(p.hh, cfg.hedge.share) || !guardsAllow(g) || !p.hh.quiet() || !g.Budget.Withdraw() {
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
	o := cfg.observer
	if o != nil {
		lctx = hedgeStart(o, lctx, p.t.Name, num)
	}
	l := legCall{invoker: p.invoker, method: p.method, req: p.req, reply: hl.reply, cc: p.cc, opts: hl.opts, trailer: &hl.trailer,
		timeout: cfg.attemptTimeout > 0}
	t0 := time.Now()
	pv, err := invoke(l, lctx)
	e := end{err: err, trailer: hl.trailer, timedOut: l.timeout && err != nil && attemptExpired(lctx, err) && p.ctx.Err() == nil}
	ours := errors.Is(lctx.Err(), context.Canceled) && p.ctx.Err() == nil // the race canceled it
	if g.Limiter != nil {
		g.Limiter.Release(slot, !good(err) && !ours) // a loser is no sign of overload
	}
	if o != nil {
		hedgeEnd(o, lctx, p.t.Name, num, err, t0)
	}
	won := pv == nil && good(err)
	if !won && pv == nil {
		p.hh.pushback(err, e.trailer)
	}
	rs.mu.Lock()
	if (won || pv != nil) && !rs.over && !rs.lost {
		rs.lost = true
		rs.cancels[0]()
	}
	if !won {
		rs.failed = true // a failure: no more hedges in this race
	}
	rs.mu.Unlock()
	rs.results <- leg{i: i, e: e, hl: hl, p: pv}
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
	trailer *metadata.MD // what opts read the trailer into
	timeout bool         // the leg has an attempt timeout
}

// errPanicked is the end of a copy whose invoker panicked: a failure
// (its limiter slot is given back as a drop), never a race's winner.
var errPanicked = status.Error(codes.Internal, "grpcretry: the invoker panicked")

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

// hedgeContext returns ctx, the context of a race's first copy, with the
// outgoing metadata of hedge num: grpc-previous-rpc-attempts num-1, and no
// probe mark (only the first copy may be the breaker's probe).
func hedgeContext(ctx context.Context, num int) context.Context {
	md, _ := metadata.FromOutgoingContext(ctx) // a copy
	if md == nil {
		md = metadata.MD{}
	}
	md[wire.PreviousAttemptsMetadata] = previousAttempts(num - 1)
	delete(md, probeMetadata)
	return metadata.NewOutgoingContext(ctx, md)
}

// hedgeStart reports the start of hedge num to target name to o and
// returns its context (tagged by the observer, if it tags).
func hedgeStart(o observe.Observer, ctx context.Context, name string, num int) context.Context {
	e := observe.Event{Kind: observe.AttemptStart, Name: name, Attempt: num, Hedge: true}
	if tg, ok := o.(interface {
		TagAttempt(context.Context, observe.Event) context.Context
	}); ok {
		return tg.TagAttempt(ctx, e)
	}
	o.Observe(ctx, e)
	return ctx
}

// hedgeEnd reports the end of hedge num to target name to o.
func hedgeEnd(o observe.Observer, ctx context.Context, name string, num int, err error, t0 time.Time) {
	e := observe.Event{Kind: observe.AttemptEnd, Name: name, Attempt: num, Hedge: true, Elapsed: time.Since(t0), Err: err}
	switch {
	case good(err):
		e.Outcome = "success"
	case errors.Is(ctx.Err(), context.Canceled):
		e.Outcome = "canceled"
	default:
		e.Outcome = "failure"
	}
	o.Observe(ctx, e)
}
