package grpcretry

import (
	"context"
	"errors"
	"slices"
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
// back in the last 5 s to any call (a stream's attempts too, unless the
// stream passes through unguarded) (RESOURCE_EXHAUSTED, or a failure but ABORTED with
// a pushback trailer or a RetryInfo, a don't-retry pushback included; a
// longer hint holds for as long, up to 200 years), and its recent
// median latency is at most 3 times its baseline. Nor does a hedge go
// while more of the target's races reached their delay in the last second
// (counted as the delay passes, answered or not) than 5 and than 3(1-q) of
// the races started in it (at most halfway between 1-q and all of them),
// or while more of its races in flight are past their delay than 5 and
// than that share of them (a burst queued behind a short stall), or while
// the target's last good answers in races, two or more in a row, each came
// after its race's delay, the last of them within half a delay (a queue at
// the target: a hedge would wait behind the same calls and lengthen it; an
// answer on time ends it): that is a stall or an overload, not a tail; a race held back looks again every
// half delay for three delays, then after one delay, doubling (the looks at
// least 1 ms and at most a minute apart), while its first copy is unanswered
// and a hedge could go but for the bound, and its hedge goes once the bound
// allows (a burst behind a few slow calls clears within a few delays, and a
// copy unanswered after it is most likely one of the slow ones); a held race
// that finds its hedge held for another reason as well (a push-back,
// inflated latency, a breaker not closed, no budget) stops looking, as a
// race not held gets no hedge then. With a fixed delay, q (0
// meaning 0.95) is the share of answers the delay is expected to cover,
// for this bound only. The time of a race held back by this bound does not
// count in the learned delay (held by a queue alone, it does: a lasting one
// is the target's latency). An ABORTED says the
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
	methods = slices.Clone(methods) // an Option is a value: the caller may reuse its slice
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
		case len(methods) == 0:
			return invalid("hedging needs at least one method")
		}
		m := make(map[string]bool, len(methods))
		for _, name := range methods {
			if !fullMethod(name) {
				return invalid("hedged method %q is not a full method name (/package.Service/Method)", name)
			}
			m[name] = true
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
// with reply (nil without WithHedging), and whether the call may be
// hedged. Every call gets the state, hedged or not: its target's
// push-back holds the hedges of the others (RESOURCE_EXHAUSTED to any
// method, a guarded stream's attempts included; a stream that passes
// through unguarded is not seen).
func (c *client) hedgeState(t *target, method string, reply any) (*hedgeTarget, bool) {
	if c.hedges == nil {
		return nil, false
	}
	ht, _ := c.hedges.targets.Get(t.Name)
	if !c.cfg.hedge.methods[method] {
		return ht, false
	}
	_, ok := reply.(proto.Message)
	return ht, ok
}

// pushback notes a failed answer of the target that asks for less load:
// RESOURCE_EXHAUSTED, or any failure but ABORTED with a server hint (a
// pushback trailer, a don't-retry one included, or a RetryInfo). No hedge
// goes to the target for pushbackHold, or the hint if longer. An ABORTED
// says the call met another, not load: a keyed hedge meets its own first
// copy still running on the server (the idempotency interceptor's answer).
func (ht *hedgeTarget) pushback(err error, trailer metadata.MD) {
	if ht == nil || good(err) {
		return // no answer yet, or the target's answer: no failure to push back with
	}
	st := statusOf(err)
	if st.Code() == codes.Aborted {
		return
	}
	h := serverHint(trailer, st)
	if st.Code() != codes.ResourceExhausted && !h.set && !h.stop {
		return
	}
	hold := h.after
	if d, ok := retryInfo(st); ok && h.stop {
		hold = d // a don't-retry pushback beside a RetryInfo: the RetryInfo's delay is its hold's hint
	}
	to := int64(time.Since(ht.base) + max(hold, pushbackHold))
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
	p, err := g.Limiter.Acquire(noWait) // a free slot or none: never waits
	return p, err == nil
}

// noWait is a context that is already canceled: a limiter's Acquire with
// it takes a free slot or refuses at once (a call without a deadline would
// wait for one). It is never modified.
var noWait = func() context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	return ctx
}()

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

// hedgeEnd reports the end of hedge num to target name to o; parent is
// the attempt's context, ctx the hedge's own. lost: its answer was good
// but another copy had won the race. As the loop's attempts: "success"
// for an OK answer, "rejected" for another answer that wins a race (a
// NOT_FOUND: the dependency answered, but no), "canceled" for a hedge the
// race canceled or whose call's context had ended (the caller's deadline
// or cancel), "failure" for the rest (its own attempt timeout included).
func hedgeEnd(o observe.Observer, parent, ctx context.Context, name string, num int, err error, t0 time.Time, lost bool) {
	e := observe.Event{Kind: observe.AttemptEnd, Name: name, Attempt: num, Hedge: true, Elapsed: time.Since(t0), Err: err}
	switch {
	case lost:
		e.Outcome = "canceled"
	case err == nil:
		e.Outcome = "success"
	case good(err):
		e.Outcome = "rejected"
	case parent.Err() != nil || errors.Is(ctx.Err(), context.Canceled):
		e.Outcome = "canceled"
	default:
		e.Outcome = "failure"
	}
	o.Observe(ctx, e)
}
