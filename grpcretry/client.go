package grpcretry

import (
	"context"
	"strconv"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/budget"
	"github.com/stormguard/stormguard/grpcretry/internal/guards"
	"github.com/stormguard/stormguard/idempotency"
	"github.com/stormguard/stormguard/limit"
	"github.com/stormguard/stormguard/retry"
	"github.com/stormguard/stormguard/wire"
)

// client holds the retry configuration and the per-target budgets and
// breakers behind a pair of client interceptors, the ones [DialOptions]
// installs. It is safe for concurrent use and immutable once built, apart
// from its table of per-target budgets and breakers.
type client struct {
	cfg     config
	targets *targets
	hedges  *hedging // nil: no hedging
}

// DialOptions returns the dial options that install a retrying client,
// configured by opts, on a connection: grpc.WithDisableRetry (grpc-go's own
// retry, which would multiply with this one: see the package
// documentation), and the client's unary and stream interceptors, chained
// after any interceptors given before them.
//
//	opts, err := grpcretry.DialOptions(grpcretry.WithIdempotentMethods("/shop.Catalog/GetItem"))
//	conn, err := grpc.NewClient(addr, append(opts, creds)...)
//
// The options hold the client's per-target budgets and breakers: every
// connection made with the same options shares them (connections to the
// same target share one target's guards), and each call of DialOptions
// makes a new client with guards of its own. So make them once, for all
// the connections that should count together (usually one per process and
// configuration).
//
// Without options the client makes up to 3
// attempts with full-jitter backoff (base 100 ms, cap 10 s), honours server
// pushback and RetryInfo up to 1 minute (spread above it), keeps a retry
// budget (10% plus 1 per second) and a circuit breaker (50% of at least 20
// calls over 10 s; probes every second) per target, has no timeout of its
// own (the caller's deadline counts, and lets a call wait behind an open
// breaker), treats no method as idempotent, retries no client-streaming or
// bidirectional call, and logs nothing.
//
// The options are applied, and one target built, in one pass down the
// layers: a bad option value makes DialOptions return an error that says
// which; it never panics.
func DialOptions(opts ...Option) ([]grpc.DialOption, error) {
	c, err := newClient(opts...)
	if err != nil {
		return nil, err
	}
	return []grpc.DialOption{
		grpc.WithDisableRetry(),
		grpc.WithChainUnaryInterceptor(c.unary),
		grpc.WithChainStreamInterceptor(c.stream),
	}, nil
}

// newClient returns a client configured by opts (see DialOptions).
func newClient(opts ...Option) (*client, error) {
	def := &limit.Config{Max: defaultLimitMax}
	c := &client{cfg: config{
		budget:       &budget.Config{},
		breaker:      &breaker.Config{},
		limit:        def,
		streamBuffer: defaultStreamBuffer,
	}}
	for _, o := range opts {
		if o == nil {
			continue
		}
		if err := o.apply(&c.cfg); err != nil {
			return nil, err
		}
	}
	layer := &guards.Layer{Component: "grpcretry", Label: "target", Schedule: c.cfg.schedule, Classify: retryable,
		Budget: c.cfg.budget, Breaker: c.cfg.breaker, Supply: c.cfg.guards, Logger: c.cfg.logger, Observer: c.cfg.observer,
		Limit: c.cfg.limit, LimitPaces: c.cfg.limit != def, AttemptTimeout: c.cfg.attemptTimeout}
	if err := layer.Check(); err != nil { // reported here, never by a call
		return nil, err
	}
	c.targets = newTargets(maxTargets, layer.New)
	c.hedges = newHedging(c.cfg.hedge)
	return c, nil
}

// safety is what a call may do again: whether its method is idempotent and
// whether it carries an idempotency key. It judges each failed attempt.
type safety struct {
	idempotent bool   // declared idempotent: INTERNAL and ABORTED may be retried
	hasKey     bool   // carries an idempotency key (its own or the client's)
	key        string // the key the client made, "" if none
	got500     bool   // an INTERNAL was seen (retried at most once)
}

// classify works out the safety of a call of method with ctx's outgoing
// metadata, making a key if the client makes keys.
func (c *client) classify(ctx context.Context, method string) safety {
	var s safety
	s.idempotent = c.cfg.idempotent[method]
	if !s.idempotent {
		if vs := metadata.ValueFromOutgoingContext(ctx, keyMetadata); len(vs) > 0 && strings.TrimSpace(vs[0]) != "" {
			s.hasKey = true
		} else if c.cfg.autoKey {
			s.key, s.hasKey = idempotency.NewKey(), true
		}
	}
	return s
}

// safe reports whether a failed attempt may be sent again.
func (s *safety) safe() bool { return s.idempotent || s.hasKey }

// judge turns a failed attempt (err, with the attempt's trailer, and
// whether the attempt's own timeout cut it off) into what the retry loop
// sees: an *attemptError if it may be retried, else one marked
// retry.Permanent: a failure of the target, which its breaker counts, or
// an answer (answer set), which it counts as a success.
func (s *safety) judge(err error, trailer metadata.MD, timedOut bool) error {
	st := statusOf(err)
	code := st.Code()
	h := serverHint(trailer, st)
	ae := &attemptError{err: err, code: code, after: h.after, stop: h.stop}
	var failure, again bool
	switch {
	case timedOut:
		failure, again = true, true
	case code == codes.Unavailable:
		failure, again = true, true
	case code == codes.ResourceExhausted:
		failure, again = h.set, h.set
	case code == codes.Internal:
		failure, again = true, s.idempotent && !s.got500
		s.got500 = true
	case code == codes.Aborted:
		again = s.idempotent || (s.hasKey && h.set)
	}
	switch {
	case again && !h.stop && s.safe():
		return ae
	case failure:
		return retry.Permanent(ae) // the breaker counts it: the classifier says an attemptError fails
	}
	ae.answer = true // the breaker counts it as the target's answer
	return retry.Permanent(ae)
}

// attemptContext returns the context of attempt n of a call: with the
// wire.PreviousAttemptsMetadata metadata from the second attempt on, and without one
// on the first (strip: ctx carries one from elsewhere), and with the probe
// mark (probeMetadata) when the retry loop marked ctx as a breaker's probe
// (retry.IsProbe).
func (c *client) attemptContext(ctx context.Context, n int, strip bool) context.Context {
	probe := retry.IsProbe(ctx)
	if n == 1 && !strip && !probe {
		return ctx
	}
	md, _ := metadata.FromOutgoingContext(ctx) // a copy
	if md == nil {
		md = metadata.MD{}
	}
	if n == 1 {
		delete(md, wire.PreviousAttemptsMetadata)
	} else {
		md[wire.PreviousAttemptsMetadata] = previousAttempts(n - 1)
	}
	if probe {
		md[probeMetadata] = probeValue
	} else {
		delete(md, probeMetadata)
	}
	return metadata.NewOutgoingContext(ctx, md)
}

// withKey returns ctx with the call's idempotency key made by the client:
// in place of a blank one the caller's metadata carries (which does not
// count as a key), never beside it (two values: the server refuses them).
func withKey(ctx context.Context, key string) context.Context {
	if metadata.ValueFromOutgoingContext(ctx, keyMetadata) == nil {
		return metadata.AppendToOutgoingContext(ctx, keyMetadata, key)
	}
	md, _ := metadata.FromOutgoingContext(ctx) // a copy
	md[keyMetadata] = []string{key}
	return metadata.NewOutgoingContext(ctx, md)
}

// inheritedMarks reports whether ctx's outgoing metadata carries an
// attempt count or a probe mark from elsewhere (a proxy forwarding the
// metadata it got): the first attempt then goes without them.
func inheritedMarks(ctx context.Context) bool {
	return metadata.ValueFromOutgoingContext(ctx, wire.PreviousAttemptsMetadata) != nil ||
		metadata.ValueFromOutgoingContext(ctx, probeMetadata) != nil
}

// withoutInheritedMarks returns ctx without the attempt count and probe
// mark its outgoing metadata carries from elsewhere (inheritedMarks), for
// a call the client passes through: ctx itself, with nothing allocated,
// when it carries neither.
func withoutInheritedMarks(ctx context.Context) context.Context {
	if !inheritedMarks(ctx) {
		return ctx
	}
	md, _ := metadata.FromOutgoingContext(ctx) // a copy, its keys in lower case
	delete(md, wire.PreviousAttemptsMetadata)
	delete(md, probeMetadata)
	return metadata.NewOutgoingContext(ctx, md)
}

// probeMetadata is the gRPC form of wire.ProbeHeader: its name in lower
// case; probeValue its one value, shared and never modified.
const probeMetadata = "stormguard-probe"

var probeValue = []string{"1"}

// deadlineSlack is how early a server may end a call before the attempt
// deadline it learned from grpc-timeout (sent rounded, received a moment
// after the client set it) and still count as the attempt's timeout: 5 ms,
// at most a twentieth of the attempt timeout (with a timeout of 5 ms or
// less, a server's own DEADLINE_EXCEEDED answered at once was taken for
// the attempt's timeout, and retried).
func deadlineSlack(timeout time.Duration) time.Duration {
	return min(5*time.Millisecond, timeout/20)
}

// attemptExpired reports whether an attempt on actx, a child of the call's
// ctx, with the attempt timeout timeout, that failed with err ended
// because that timeout came: actx has ended, or the server answered
// DEADLINE_EXCEEDED within deadlineSlack of its deadline; never when that
// deadline is the caller's (an attempt timeout capped by it), which is no
// attempt's timeout.
func attemptExpired(ctx, actx context.Context, err error, timeout time.Duration) bool {
	dl, ok := actx.Deadline()
	if pdl, pok := ctx.Deadline(); ok && pok && !dl.Before(pdl) {
		return false
	}
	if actx.Err() != nil {
		return true
	}
	return ok && status.Code(err) == codes.DeadlineExceeded && time.Until(dl) <= deadlineSlack(timeout)
}

// target returns the state of cc's target.
func (c *client) target(cc *grpc.ClientConn) (*target, error) {
	name := ""
	if cc != nil {
		name = cc.Target()
	}
	t, err := c.targets.get(name)
	if err != nil {
		return nil, status.Error(codes.Unavailable, err.Error())
	}
	return t, nil
}

// unaryCall is the state of one unary call.
type unaryCall struct {
	c       *client
	t       *target
	method  string
	req     any
	reply   any
	cc      *grpc.ClientConn
	invoker grpc.UnaryInvoker
	opts    []grpc.CallOption
	strip   bool // the caller's metadata carries marks of its own (inheritedMarks)
	finish  bool // opts hold a grpc.OnFinish: run once by the call, never by an attempt
	s       safety
	hold    *holder      // made by the first attempt
	hh      *hedgeTarget // the target's hedging state (its push-back, its latencies); nil: no hedging
	hedged  bool         // the call may be hedged (hh is not nil)
	extra   int          // hedges sent: the wire numbers run this far ahead of the loop's
	held    bool         // the due-share bound refused the current race's first hedge
}

// holder is the per-call memory the attempts share: the call options (the
// caller's and one that reads the trailer) and the trailer they read into,
// in one allocation.
type holder struct {
	trailer metadata.MD
	opts    []grpc.CallOption
	buf     [4]grpc.CallOption
}

func (c *client) unary(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	t, err := c.target(cc)
	if err != nil {
		onFinish(opts, err) // its callbacks run once per call, this one too
		return err
	}
	u := unaryCall{c: c, t: t, method: method, req: req, reply: reply, cc: cc, invoker: invoker, opts: opts}
	u.finish = hasOnFinish(opts)
	u.s = c.classify(ctx, method)
	if u.s.key != "" {
		ctx = withKey(ctx, u.s.key)
	}
	u.strip = inheritedMarks(ctx)
	u.hh, u.hedged = c.hedgeState(t, method, reply)
	err = t.Policy.Do(ctx, u.attempt)
	if re, ok := err.(*retry.Error); ok {
		err = newError(re, u.s.key)
	}
	if u.finish {
		onFinish(opts, err)
	}
	return err
}

// hasOnFinish reports whether opts hold a grpc.OnFinish option.
func hasOnFinish(opts []grpc.CallOption) bool {
	for _, o := range opts {
		if _, ok := o.(grpc.OnFinishCallOption); ok {
			return true
		}
	}
	return false
}

// onFinish runs the grpc.OnFinish callbacks of opts with err, the call's
// end: once per call, as gRPC runs them, where every attempt and every
// hedge would each run them once (a losing hedge's after the call
// returned). The attempts are sent without them (callOptions).
func onFinish(opts []grpc.CallOption, err error) {
	for _, o := range opts {
		if f, ok := o.(grpc.OnFinishCallOption); ok && f.OnFinish != nil {
			f.OnFinish(err)
		}
	}
}

// callOptions appends opts to dst, but the grpc.OnFinish options if
// finish (the call runs them itself, once: onFinish).
func callOptions(dst, opts []grpc.CallOption, finish bool) []grpc.CallOption {
	if !finish {
		return append(dst, opts...)
	}
	for _, o := range opts {
		if _, ok := o.(grpc.OnFinishCallOption); !ok {
			dst = append(dst, o)
		}
	}
	return dst
}

// attempt is the loop's operation: one attempt of the call (with its
// hedges, if the call is hedged).
func (u *unaryCall) attempt(ctx context.Context, n int) error {
	ctx = u.c.attemptContext(ctx, n+u.extra, u.strip)
	h := u.hold
	if h == nil {
		h = new(holder)
		h.opts = append(callOptions(h.buf[:0], u.opts, u.finish), grpc.Trailer(&h.trailer))
		u.hold = h
	}
	h.trailer = nil
	var e end
	if u.hedged {
		e = u.first(ctx, n)
	} else {
		e = u.send(ctx)
		if e.err != nil && u.hh != nil {
			u.hh.pushback(e.err, e.trailer) // held for the target's hedged calls
		}
	}
	if e.err == nil {
		return nil
	}
	return u.s.judge(e.err, e.trailer, e.timedOut)
}

// send makes one attempt of the call on ctx, which carries its metadata,
// reading its trailer into the call's holder.
func (u *unaryCall) send(ctx context.Context) end {
	h := u.hold
	actx := ctx
	var cancel context.CancelFunc
	if d := u.c.cfg.attemptTimeout; d > 0 {
		actx, cancel = context.WithTimeout(ctx, d)
	}
	err := u.invoker(actx, u.method, u.req, u.reply, u.cc, h.opts...)
	timedOut := false
	if cancel != nil {
		timedOut = err != nil && attemptExpired(ctx, actx, err, u.c.cfg.attemptTimeout) && ctx.Err() == nil
		cancel()
	}
	return end{err: err, trailer: h.trailer, timedOut: timedOut}
}

// previousValues are the wire.PreviousAttemptsMetadata values 1 to 16,
// shared by every client and never modified.
var previousValues = func() [][]string {
	vs := make([][]string, 17)
	for n := 1; n < len(vs); n++ {
		vs[n] = []string{strconv.Itoa(n)}
	}
	return vs
}()

// previousAttempts returns the wire.PreviousAttemptsMetadata value n: from
// the shared values up to 16; beyond (a policy with more attempts, or a
// call that waited behind the breaker and was handed probes that do not
// count against its attempts) formatted on the spot.
func previousAttempts(n int) []string {
	if n < len(previousValues) {
		return previousValues[n][:1:1]
	}
	return []string{strconv.Itoa(n)}
}
