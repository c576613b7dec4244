package grpcretry

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/budget"
	"github.com/stormguard/stormguard/idempotency"
	"github.com/stormguard/stormguard/internal/guards"
	"github.com/stormguard/stormguard/retry"
	"github.com/stormguard/stormguard/wire"
)

// Client holds the retry configuration and the per-target budgets and
// breakers behind a pair of client interceptors. Build one with [New] and
// install it with [Client.DialOptions] (or [Client.UnaryInterceptor] and
// [Client.StreamInterceptor]); one Client may serve any number of
// connections, and connections to the same target share its guards.
//
// A Client is safe for concurrent use and immutable once built, apart from
// its table of per-target budgets and breakers.
type Client struct {
	cfg      config
	clock    retry.Clock // the policies' clock; nil: the system clock
	prevVals [][]string  // prevVals[n] is the wire.PreviousAttemptsMetadata value n
	layer    *guards.Layer
	targets  *targets
}

// New returns a Client configured by opts. Without options it makes up to 3
// attempts with full-jitter backoff (base 100 ms, cap 10 s), honours server
// pushback and RetryInfo up to 1 minute (spread above it), keeps a retry
// budget (10% plus 1 per second) and a circuit breaker (50% of at least 20
// calls over 10 s; probes every second) per target (at most
// [DefaultMaxTargets]), has no timeout of its own (the caller's deadline
// counts, and lets a call wait behind an open breaker), treats no method as
// idempotent, retries no client-streaming or bidirectional call, and logs
// nothing.
//
// A bad option value makes New return an error wrapping
// [ErrInvalidOption]; it never panics.
func New(opts ...Option) (*Client, error) {
	c := &Client{cfg: config{
		budget:       &budget.Config{},
		breaker:      &breaker.Config{},
		maxTargets:   DefaultMaxTargets,
		streamBuffer: DefaultStreamBuffer,
	}}
	for _, o := range opts {
		if o == nil {
			continue
		}
		if err := o(&c.cfg); err != nil {
			return nil, err
		}
	}
	probe, err := retry.New(c.cfg.retry...)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidOption, err)
	}
	if n := probe.MaxAttempts(); n > maxAttemptsLimit {
		return nil, invalid("max attempts %d must be at most %d", n, maxAttemptsLimit)
	}
	if call, attempt := probe.Timeouts(); call != 0 || attempt != 0 {
		return nil, invalid("retry.WithTimeout and retry.WithAttemptTimeout do not cover a stream's life: use grpcretry.WithTimeout and WithAttemptTimeout")
	}
	c.clock = probe.Clock()
	c.prevVals = make([][]string, probe.MaxAttempts())
	for n := 1; n < len(c.prevVals); n++ {
		c.prevVals[n] = []string{strconv.Itoa(n)}
	}
	c.layer = &guards.Layer{Component: "grpcretry", Label: "target", Retry: c.cfg.retry, Classify: retryable,
		Budget: c.cfg.budget, Breaker: c.cfg.breaker, Clock: c.clock, Logger: c.cfg.logger, Observer: c.cfg.observer}
	if g := c.cfg.guards; g != nil {
		c.layer.Supply = g
	}
	// Build one target's state now, so that a bad budget or breaker
	// configuration is reported here and never by a call.
	if c.cfg.guards == nil {
		if _, err := c.newTarget(""); err != nil {
			return nil, fmt.Errorf("%w: %w", ErrInvalidOption, err)
		}
	}
	c.targets = newTargets(c.cfg.maxTargets, c.newTarget)
	return c, nil
}

// UnaryClientInterceptor returns the unary interceptor of a new [Client]
// configured by opts (see [New]). Use [New] to share the targets' guards
// between the unary and stream interceptors, and [Client.DialOptions] to
// turn grpc-go's own retry off at the same time.
func UnaryClientInterceptor(opts ...Option) (grpc.UnaryClientInterceptor, error) {
	c, err := New(opts...)
	if err != nil {
		return nil, err
	}
	return c.UnaryInterceptor(), nil
}

// StreamClientInterceptor returns the stream interceptor of a new [Client]
// configured by opts (see [New] and [UnaryClientInterceptor]).
func StreamClientInterceptor(opts ...Option) (grpc.StreamClientInterceptor, error) {
	c, err := New(opts...)
	if err != nil {
		return nil, err
	}
	return c.StreamInterceptor(), nil
}

// UnaryInterceptor returns c's unary client interceptor.
func (c *Client) UnaryInterceptor() grpc.UnaryClientInterceptor { return c.unary }

// StreamInterceptor returns c's stream client interceptor.
func (c *Client) StreamInterceptor() grpc.StreamClientInterceptor { return c.stream }

// DialOptions returns the dial options that install c on a connection:
// grpc.WithDisableRetry (grpc-go's own retry, which would multiply with
// c's), and c's unary and stream interceptors, chained after any
// interceptors given before them. The interceptors installed this way skip
// the look for a service-config retry policy (see the package
// documentation); they share c's targets.
//
//	conn, err := grpc.NewClient(addr, append(c.DialOptions(), creds)...)
func (c *Client) DialOptions() []grpc.DialOption {
	off := *c
	off.cfg.retryDisabled = true
	return []grpc.DialOption{
		grpc.WithDisableRetry(),
		grpc.WithChainUnaryInterceptor(off.unary),
		grpc.WithChainStreamInterceptor(off.stream),
	}
}

// safety is what a call may do again: whether its method is idempotent and
// whether it carries an idempotency key. It judges each failed attempt.
type safety struct {
	idempotent bool   // declared idempotent: INTERNAL and ABORTED may be retried
	hasKey     bool   // carries an idempotency key (its own or the client's)
	stacked    bool   // grpc-go's own retry policy covers the method: we do not retry
	key        string // the key the client made, "" if none
	got500     bool   // an INTERNAL was seen (retried at most once)
}

// classify works out the safety of a call of method with ctx's outgoing
// metadata, making a key if the client makes keys.
func (c *Client) classify(ctx context.Context, method string) safety {
	var s safety
	s.idempotent = c.cfg.idempotent[method] || (c.cfg.idempotentFunc != nil && c.cfg.idempotentFunc(method))
	if !s.idempotent {
		if vs := metadata.ValueFromOutgoingContext(ctx, IdempotencyKeyMetadata); len(vs) > 0 && strings.TrimSpace(vs[0]) != "" {
			s.hasKey = true
		} else if c.cfg.autoKey {
			s.key, s.hasKey = idempotency.NewKey(), true
		}
	}
	return s
}

// stackedOn reports whether grpc-go's own retry covers method on cc: the
// connection may retry (no WithGRPCRetryDisabled) and the method's service
// config has a retry policy. It is asked after a failed attempt, when the
// connection has its service config (a new connection gets it during its
// first call), so it costs the success path nothing.
func (c *Client) stackedOn(cc *grpc.ClientConn, method string) bool {
	return !c.cfg.retryDisabled && cc != nil && cc.GetMethodConfig(method).RetryPolicy != nil
}

// safe reports whether a failed attempt may be sent again.
func (s *safety) safe() bool { return (s.idempotent || s.hasKey) && !s.stacked }

// judge turns a failed attempt (err, with the attempt's trailer, and
// whether the attempt's own timeout cut it off) into what the retry loop
// sees: an *attemptError if it may be retried, else one marked
// retry.PermanentFailure (a failure of the target, which its breaker
// counts) or retry.Permanent (an answer).
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
		return retry.PermanentFailure(ae)
	}
	return retry.Permanent(ae)
}

// attemptContext returns the context of attempt n of a call: with the
// wire.PreviousAttemptsMetadata metadata from the second attempt on, and without one
// on the first (strip: ctx carries one from elsewhere).
func (c *Client) attemptContext(ctx context.Context, n int, strip bool) context.Context {
	if n == 1 && !strip {
		return ctx
	}
	md, _ := metadata.FromOutgoingContext(ctx) // a copy
	if md == nil {
		md = metadata.MD{}
	}
	if n == 1 {
		delete(md, wire.PreviousAttemptsMetadata)
	} else {
		md[wire.PreviousAttemptsMetadata] = c.previousAttempts(n - 1)
	}
	return metadata.NewOutgoingContext(ctx, md)
}

// deadlineSlack is how early a server may end a call before the attempt
// deadline it learned from grpc-timeout (sent rounded, received a moment
// after the client set it) and still count as the attempt's timeout.
const deadlineSlack = 5 * time.Millisecond

// attemptExpired reports whether an attempt that failed with err ended
// because actx's deadline (the attempt timeout) came: actx has ended, or the
// server answered DEADLINE_EXCEEDED within deadlineSlack of it.
func attemptExpired(actx context.Context, err error) bool {
	if actx.Err() != nil {
		return true
	}
	dl, ok := actx.Deadline()
	return ok && status.Code(err) == codes.DeadlineExceeded && time.Until(dl) <= deadlineSlack
}

// fallsBack reports whether a give-up for reason r gets the fallback: the
// target's failure defeated the call (not the call's own answer, not the
// caller's cancel).
func fallsBack(r retry.Reason) bool {
	switch r {
	case retry.AttemptsExhausted, retry.Deadline, retry.BudgetExhausted, retry.CircuitOpen:
		return true
	}
	return false
}

// target returns the state of cc's target.
func (c *Client) target(cc *grpc.ClientConn) (*target, error) {
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

// warnStacked logs, once per target, that a method's service config has a
// retry policy of grpc-go's, so the client does not retry it.
func (t *target) warnStacked(ctx context.Context, method string) {
	if t.Logger == nil || t.warned.Swap(true) {
		return
	}
	t.Logger.LogAttrs(ctx, slog.LevelWarn, "grpcretry: the service config has a retry policy for this method, so grpc-go retries it and grpcretry does not (dial with grpc.WithDisableRetry and grpcretry.WithGRPCRetryDisabled, or Client.DialOptions, to retry here instead)",
		slog.String("method", method))
}

// unaryCall is the state of one unary call.
type unaryCall struct {
	c       *Client
	t       *target
	method  string
	req     any
	reply   any
	cc      *grpc.ClientConn
	invoker grpc.UnaryInvoker
	opts    []grpc.CallOption
	strip   bool // the caller's metadata carries a wire.PreviousAttemptsMetadata
	s       safety
	hold    *holder // made by the first attempt
}

// holder is the per-call memory the attempts share: the call options (the
// caller's and one that reads the trailer) and the trailer they read into,
// in one allocation.
type holder struct {
	trailer metadata.MD
	opts    []grpc.CallOption
	buf     [4]grpc.CallOption
}

func (c *Client) unary(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	t, err := c.target(cc)
	if err != nil {
		return err
	}
	u := unaryCall{c: c, t: t, method: method, req: req, reply: reply, cc: cc, invoker: invoker, opts: opts}
	u.s = c.classify(ctx, method)
	if u.s.key != "" {
		ctx = metadata.AppendToOutgoingContext(ctx, IdempotencyKeyMetadata, u.s.key)
	}
	u.strip = metadata.ValueFromOutgoingContext(ctx, wire.PreviousAttemptsMetadata) != nil
	if c.cfg.timeout > 0 {
		return u.runTimed(ctx, t)
	}
	return u.end(ctx, t.Policy.Do(ctx, u.attempt))
}

// runTimed runs the call with the client's overall timeout.
func (u *unaryCall) runTimed(ctx context.Context, t *target) error {
	callCtx, cancel := context.WithTimeout(ctx, u.c.cfg.timeout)
	defer cancel()
	return u.end(ctx, t.Policy.Do(callCtx, u.attempt))
}

// end turns the loop's result into the call's.
func (u *unaryCall) end(ctx context.Context, err error) error {
	if err == nil {
		return nil
	}
	re, ok := err.(*retry.Error)
	if !ok {
		return err
	}
	e := newError(re, u.s.key)
	if fb := u.c.cfg.fallback; fb != nil && fallsBack(re.Reason) {
		return fb(ctx, u.method, u.req, u.reply, e)
	}
	return e
}

// attempt is the loop's operation: one attempt of the call.
func (u *unaryCall) attempt(ctx context.Context, n int) error {
	ctx = u.c.attemptContext(ctx, n, u.strip)
	h := u.hold
	if h == nil {
		h = new(holder)
		h.opts = append(append(h.buf[:0], u.opts...), grpc.Trailer(&h.trailer))
		u.hold = h
	}
	h.trailer = nil
	actx := ctx
	var cancel context.CancelFunc
	if d := u.c.cfg.attemptTimeout; d > 0 {
		actx, cancel = context.WithTimeout(ctx, d)
	}
	err := u.invoker(actx, u.method, u.req, u.reply, u.cc, h.opts...)
	timedOut := false
	if cancel != nil {
		timedOut = err != nil && attemptExpired(actx, err) && ctx.Err() == nil
		cancel()
	}
	if err == nil {
		return nil
	}
	if u.s.safe() && u.c.stackedOn(u.cc, u.method) {
		u.s.stacked = true
		u.t.warnStacked(ctx, u.method)
	}
	return u.s.judge(err, h.trailer, timedOut)
}

// previousAttempts returns the wire.PreviousAttemptsMetadata value n: built once per
// client up to the attempt limit; beyond it (a call that waited behind the
// breaker sends probes that do not count against the limit) formatted on
// the spot.
func (c *Client) previousAttempts(n int) []string {
	if n < len(c.prevVals) {
		return c.prevVals[n][:1:1]
	}
	return []string{strconv.Itoa(n)}
}
