package grpcretry

import (
	"context"
	"errors"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/emptypb"

	"github.com/stormguard/stormguard/retry"
)

// errAttemptTimeout is the cause of a stream attempt cut off by the
// client's attempt timeout.
var errAttemptTimeout = errors.New("grpcretry: attempt timeout")

// cutOff returns err, an attempt's error on actx, as the caller is to see
// an attempt the attempt timeout cut off: DEADLINE_EXCEEDED, as a unary
// attempt's (the cancel that cuts a stream makes gRPC report CANCELED,
// which says the caller left).
func cutOff(actx context.Context, err error) error {
	if err == nil || err == io.EOF || context.Cause(actx) != errAttemptTimeout || status.Code(err) != codes.Canceled {
		return err
	}
	return status.Error(codes.DeadlineExceeded, "grpcretry: attempt timeout: no response in time ("+status.Convert(err).Message()+")")
}

// cutTimer is a stream attempt's timeout: it cuts the attempt off (cancel
// with errAttemptTimeout) unless the first answer comes first. Exactly one
// of the two wins, so a stream whose first response reached the caller is
// never cut off after it, even when both come at the same instant.
type cutTimer struct {
	t     *time.Timer
	state atomic.Int32 // cutPending, cutAnswered or cutFired
}

const (
	cutPending int32 = iota
	cutAnswered
	cutFired
)

// newCutTimer starts a timeout of d that calls cancel(errAttemptTimeout).
func newCutTimer(d time.Duration, cancel context.CancelCauseFunc) *cutTimer {
	ct := &cutTimer{}
	ct.t = time.AfterFunc(d, func() {
		if ct.state.CompareAndSwap(cutPending, cutFired) {
			cancel(errAttemptTimeout)
		}
	})
	return ct
}

// answer reports whether the attempt's first answer came before its
// timeout (a nil ct has none), and stops the timeout if so.
func (ct *cutTimer) answer() bool {
	if ct == nil {
		return true
	}
	if ct.state.CompareAndSwap(cutPending, cutAnswered) {
		ct.t.Stop()
		return true
	}
	return ct.state.Load() == cutAnswered
}

// stop stops the timeout of a failed attempt (a nil ct has none).
func (ct *cutTimer) stop() {
	if ct != nil {
		ct.t.Stop()
	}
}

// errCutOff is the error of an attempt whose timeout came before its first
// answer, though the answer came too.
var errCutOff = status.Error(codes.DeadlineExceeded, "grpcretry: attempt timeout: no response in time")

// errAttemptPanicked is what a stream returns once an attempt panicked
// (the streamer, or an interceptor under the client's).
var errAttemptPanicked = errors.New("grpcretry: a stream attempt panicked")

// errSuperseded is the cause of a failed stream attempt's context, canceled
// when the next attempt opens.
var errSuperseded = errors.New("grpcretry: attempt superseded by a retry")

func (c *client) stream(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	if desc.ClientStreams && !c.cfg.bufferStreams {
		return streamer(withoutInheritedMarks(ctx), desc, cc, method, opts...)
	}
	s := c.classify(ctx, method)
	if !s.safe() {
		return streamer(withoutInheritedMarks(ctx), desc, cc, method, opts...)
	}
	t, err := c.target(cc)
	if err != nil {
		return nil, err
	}
	if s.key != "" {
		ctx = withKey(ctx, s.key)
	}
	rs := &retryStream{c: c, t: t, desc: desc, cc: cc, method: method, streamer: streamer, opts: opts, s: s, ctx: ctx}
	rs.strip = inheritedMarks(ctx)
	rs.cond.L = &rs.mu
	return rs, nil
}

// trigger is what starts a stream's retry loop: the first call that needs
// an answer from the server, or a message the buffer cannot keep.
type trigger uint8

const (
	trigRecv   trigger = iota // RecvMsg: retried until a message (or the end) arrives
	trigHeader                // Header: retried until the header arrives
	trigFlush                 // a message past the buffer: retried until the stream opens
)

// retryStream is a grpc.ClientStream that opens its stream lazily and
// retries it, replaying the messages sent, until the first response
// arrives. From then on (committed) it passes every call through.
type retryStream struct {
	c        *client
	t        *target
	desc     *grpc.StreamDesc
	cc       *grpc.ClientConn
	method   string
	streamer grpc.Streamer
	opts     []grpc.CallOption
	ctx      context.Context // the call's
	strip    bool            // ctx carries marks of its own (inheritedMarks)

	loopMu    sync.Mutex  // one retry loop at a time
	committed atomic.Bool // set once, after cur, err and eof are final

	s safety // used by the loop only

	mu   sync.Mutex
	cond sync.Cond // on mu: an attempt opened, a send ended, or the loop ended
	// Fields below are guarded by mu until committed is set; then they
	// never change.
	cur       grpc.ClientStream
	curCancel context.CancelCauseFunc
	timer     *cutTimer
	size      int   // the proto.Size total of the messages kept
	pinned    bool  // a message could not be kept: the attempt that sends it is the last
	opened    int   // attempts begun: cur, if not nil, is attempt opened's stream
	pinnedOut bool  // the message that could not be kept went out on a stream: a later attempt may not run
	lastFail  error // the judged error of the last failed attempt
	looping   bool  // the retry loop runs
	err       error // the give-up, returned by every later call
	eof       bool  // the stream ended with OK and no message

	// The sending side (see stream_send.go), guarded by mu also once
	// committed (flushed is written under mu).
	sent        []any       // the messages kept so far, for replay
	next        int         // sent[:next] went to cur
	closed      bool        // CloseSend was called
	closeSent   bool        // cur's sending side was closed
	sending     bool        // a goroutine holds the send turn: it alone sends on cur
	sendingOn   int         // the attempt (opened) a kept message is being sent on, 0 if none
	replayErr   error       // a kept message's send on cur failed with an error of the client's own
	replayPanic *sendPanic  // a kept message's send on cur, on a goroutine of its own, panicked
	flushed     atomic.Bool // committed, and cur lacks nothing: SendMsg sends on it directly
}

// Context returns the context of the current attempt's stream, or the
// call's before one is open.
func (rs *retryStream) Context() context.Context {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	if rs.cur != nil {
		return rs.cur.Context()
	}
	return rs.ctx
}

// Trailer returns the current attempt's trailer (nil before one is open).
func (rs *retryStream) Trailer() metadata.MD {
	rs.mu.Lock()
	cur := rs.cur
	rs.mu.Unlock()
	if cur == nil {
		return nil
	}
	return cur.Trailer()
}

// Header returns the header of the stream, running the retry loop if the
// stream has not answered yet.
func (rs *retryStream) Header() (metadata.MD, error) {
	if !rs.committed.Load() {
		var h metadata.MD
		switch err := rs.run(trigHeader, nil, &h); err {
		case nil:
			return h, nil
		case errCommittedMeanwhile:
		default:
			return nil, err
		}
	}
	if rs.err != nil {
		return nil, rs.err
	}
	h, err := rs.cur.Header()
	if err != nil {
		rs.replayPanicked()
	}
	return h, rs.answered(err)
}

// RecvMsg receives a message; the first one is worth retries.
func (rs *retryStream) RecvMsg(m any) error {
	if !rs.committed.Load() {
		if err := rs.run(trigRecv, m, nil); err != errCommittedMeanwhile {
			return err
		}
	}
	switch {
	case rs.err != nil:
		return rs.err
	case rs.eof:
		return io.EOF
	}
	err := rs.answered(rs.cur.RecvMsg(m))
	if err != nil {
		rs.replayPanicked()
		rs.finish()
	}
	return err
}

// replayPanicked raises, in the caller's goroutine, the panic of a kept
// message's send on the committed stream's replay goroutine (which
// canceled the stream: its RecvMsg or Header failed for it), once.
func (rs *retryStream) replayPanicked() {
	rs.mu.Lock()
	p := rs.replayPanic
	rs.replayPanic = nil
	rs.mu.Unlock()
	if p != nil {
		panic(p.v)
	}
}

// errCommittedMeanwhile tells a caller of run that another call ran the
// loop while it waited: it goes on as on a committed stream.
var errCommittedMeanwhile = errors.New("grpcretry: committed meanwhile")

// run runs the stream's retry loop for trig (m is RecvMsg's message, h
// receives Header's result) and commits the stream. It returns
// errCommittedMeanwhile if another call committed it first.
func (rs *retryStream) run(trig trigger, m any, h *metadata.MD) error {
	rs.loopMu.Lock()
	return rs.runLocked(trig, m, h)
}

// runLocked is run for a caller that holds loopMu; it releases it.
func (rs *retryStream) runLocked(trig trigger, m any, h *metadata.MD) error {
	defer rs.loopMu.Unlock()
	if rs.committed.Load() {
		return errCommittedMeanwhile
	}
	rs.mu.Lock()
	rs.looping = true
	rs.mu.Unlock()
	var hdr metadata.MD
	var eof bool
	returned := false
	defer func() {
		if !returned { // an attempt panicked: the stream is over
			rs.mu.Lock()
			rs.looping, rs.err = false, errAttemptPanicked
			rs.committed.Store(true)
			rs.settle()
			rs.cond.Broadcast()
			rs.mu.Unlock()
		}
	}()
	err := rs.t.Policy.Do(rs.ctx, func(ctx context.Context, n int) error {
		return rs.attempt(ctx, n, trig, m, &hdr, &eof)
	})
	returned = true
	rs.mu.Lock()
	rs.looping = false
	if err != nil || trig != trigFlush {
		// A stream committed by a message past the buffer has had no
		// response yet: its attempt timeout runs on until the first one
		// (see answered).
		rs.timer.stop()
	}
	if err != nil {
		if re, ok := err.(*retry.Error); ok {
			err = newError(re, rs.s.key)
		}
		rs.err = err
	}
	rs.eof = eof
	rs.committed.Store(true)
	rs.settle() // or the holder of the send turn, or SendMsg, sends what cur lacks
	rs.cond.Broadcast()
	rs.mu.Unlock()
	switch {
	case err != nil:
		rs.finish()
		return err
	case eof:
		rs.finish()
		if trig == trigHeader {
			*h = metadata.MD{}
			return nil
		}
		return io.EOF
	case trig == trigHeader:
		*h = hdr
	}
	return nil
}

// attempt is the loop's operation: open attempt n's stream, replay what was
// sent, and wait for trig's answer.
func (rs *retryStream) attempt(ctx context.Context, n int, trig trigger, m any, hdr *metadata.MD, eof *bool) error {
	a, err := rs.open(ctx, n, trig)
	if a.cs == nil || err != nil {
		return err
	}
	cs, timer := a.cs, a.timer
	switch trig {
	case trigFlush:
		if timer != nil {
			// The stream is the caller's once open, read when the caller
			// reads: its first answer stops the timeout when it arrives
			// (the server's header comes before any response), not when
			// the caller reads it. The goroutine ends with the stream.
			go func() {
				if _, err := cs.Header(); err == nil {
					timer.answer()
				}
			}()
		}
	case trigRecv:
		err = cs.RecvMsg(m)
		if err == io.EOF {
			*eof, err = true, nil
		}
	case trigHeader:
		if *hdr, err = cs.Header(); err == nil && *hdr == nil {
			// The stream ended without a header (a trailers-only
			// answer), so without a message: RecvMsg tells how.
			if err = cs.RecvMsg(new(emptypb.Empty)); err == io.EOF {
				*eof, err = true, nil
			}
		}
	}
	if err != nil {
		return rs.attemptFailed(ctx, a, err)
	}
	if trig != trigFlush && !timer.answer() {
		// The timeout came first (at the same instant): cut off.
		*eof = false
		a.cancel(errAttemptTimeout)
		rs.mu.Lock()
		final := rs.pinnedOut
		rs.mu.Unlock()
		return rs.failed(ctx, a.actx, a.cancel, timer, errCutOff, cs, final)
	}
	return nil
}

// streamAttempt is an attempt's stream, with its number (rs.opened),
// context and timeout.
type streamAttempt struct {
	cs     grpc.ClientStream
	n      int
	actx   context.Context
	cancel context.CancelCauseFunc
	timer  *cutTimer
}

// open opens attempt n's stream and makes it the current one, its backlog
// (the messages kept, the close of its sending side) sent beside the
// receiver (see stream_send.go); a.cs is nil if it did not open, and err
// is then the attempt's error. A streamer or a replay that panics leaves
// rs.mu unlocked and the attempt's context released (a deferred CloseSend
// of the caller's must not block).
func (rs *retryStream) open(ctx context.Context, n int, trig trigger) (a streamAttempt, err error) {
	rs.mu.Lock()
	if rs.pinnedOut && rs.lastFail != nil {
		// A message past the bound went to an attempt while the loop
		// slept after its failure: the call is committed to that
		// attempt, and ends with its error (a new stream would lack the
		// message; it once ended "OK" with the messages lost).
		err := rs.lastFail
		rs.mu.Unlock()
		return a, retry.Permanent(err)
	}
	rs.opened++
	if rs.curCancel != nil {
		rs.curCancel(errSuperseded)
		rs.cur, rs.curCancel = nil, nil
	}
	a.actx, a.cancel = context.WithCancelCause(rs.c.attemptContext(ctx, n, rs.strip))
	if d := rs.c.cfg.attemptTimeout; d > 0 {
		a.timer = newCutTimer(d, a.cancel)
	}
	held, released := true, false
	defer func() {
		if held { // the streamer panicked
			rs.mu.Unlock()
		}
		if !released { // the streamer or a replay panicked: leave nothing held
			a.timer.stop()
			a.cancel(nil)
		}
	}()
	cs, err := rs.streamer(a.actx, rs.desc, rs.cc, rs.method, rs.opts...)
	if err != nil {
		final := rs.pinnedOut // a stream that did not open sent nothing: the next one carries it
		held, released = false, true
		rs.mu.Unlock()
		return a, rs.failed(ctx, a.actx, a.cancel, a.timer, err, nil, final)
	}
	a.cs, a.n = cs, rs.opened
	rs.cur, rs.curCancel, rs.timer = cs, a.cancel, a.timer
	rs.next, rs.closeSent, rs.replayErr, rs.replayPanic = 0, false, nil, nil
	// A message past the bound that opened the stream (trigFlush) sends
	// the backlog itself, before it; so does a holder of the send turn.
	replay := trig != trigFlush && !rs.sending && rs.backlog()
	rs.sending = rs.sending || replay
	rs.cond.Broadcast()
	held = false
	rs.mu.Unlock()
	switch {
	case replay && rs.desc.ClientStreams:
		// The caller may send and receive on two goroutines, and the
		// server wait for its answers to be read before it reads more:
		// the receiver reads at once, the backlog goes on its own.
		go rs.drain(true)
	case replay:
		// A server stream's request goes before its answer is awaited:
		// no one sends beside the receiver, and the server reads the
		// request before it answers.
		_ = rs.drain(false)
		rs.mu.Lock()
		replayErr := rs.replayErr
		rs.mu.Unlock()
		if replayErr != nil {
			// An error of the client's own (the message would not
			// marshal): nothing a retry would change. io.EOF means the
			// stream ended, and RecvMsg tells how.
			released = true
			return a, retry.Permanent(replayErr)
		}
	}
	released = true
	return a, nil
}

// attemptFailed judges the failure err of a's answer, once a send of a kept
// message on a's stream ended: if one failed with an error of the client's
// own, the attempt ends with that error, not retried, and if one panicked
// (on a goroutine of its own), the attempt panics with the value.
func (rs *retryStream) attemptFailed(ctx context.Context, a streamAttempt, err error) error {
	rs.mu.Lock()
	if rs.sendingOn == a.n {
		// The stream's failure ended the send (gRPC ends a stream whose
		// RecvMsg failed); the cancel ends it all the same.
		a.cancel(nil)
		for rs.sendingOn == a.n {
			rs.cond.Wait()
		}
	}
	final, replayErr, p := rs.pinnedOut, rs.replayErr, rs.replayPanic
	rs.mu.Unlock()
	switch {
	case p != nil:
		a.timer.stop()
		panic(p.v)
	case replayErr != nil:
		a.timer.stop()
		return retry.Permanent(replayErr)
	}
	return rs.failed(ctx, a.actx, a.cancel, a.timer, err, a.cs, final)
}

// answered is told of the end of a committed stream's Header or RecvMsg
// with err: the first answer stops the attempt timeout that a stream
// committed before its first response still runs (see run), and an attempt
// it cut off ends DEADLINE_EXCEEDED.
func (rs *retryStream) answered(err error) error {
	if err != nil && err != io.EOF {
		if ht, _ := rs.c.hedgeState(rs.t, rs.method, nil); ht != nil {
			ht.pushback(err, rs.cur.Trailer()) // held for the target's hedged calls
		}
	}
	if rs.timer == nil {
		return err
	}
	if !rs.timer.answer() {
		// The timeout came first (at the same instant as this answer):
		// the stream is cut off.
		rs.curCancel(errAttemptTimeout)
		if err == nil || err == io.EOF {
			return errCutOff
		}
	}
	return cutOff(rs.cur.Context(), err)
}

// failed judges a failed stream attempt; final says it may not be retried
// whatever the error.
func (rs *retryStream) failed(ctx, actx context.Context, cancel context.CancelCauseFunc, timer *cutTimer, err error, cs grpc.ClientStream, final bool) error {
	timer.stop()
	// Cut off by its timeout: DEADLINE_EXCEEDED, also when the caller's
	// deadline came at the same instant (the cut's CANCELED would say the
	// caller left); retried only if the caller still waits.
	err = cutOff(actx, err)
	timedOut := context.Cause(actx) == errAttemptTimeout && ctx.Err() == nil
	var trailer metadata.MD
	if cs != nil {
		trailer = cs.Trailer()
	} else {
		cancel(nil)
	}
	if ht, _ := rs.c.hedgeState(rs.t, rs.method, nil); ht != nil {
		ht.pushback(err, trailer) // held for the target's hedged calls
	}
	judged := rs.s.judge(err, trailer, timedOut)
	rs.mu.Lock()
	rs.lastFail = judged
	rs.mu.Unlock()
	if ae, ok := judged.(*attemptError); ok && final {
		return retry.Permanent(ae) // a failure of the target all the same
	}
	return judged
}

// finish releases the context of a stream that ended.
func (rs *retryStream) finish() {
	if rs.curCancel != nil {
		rs.curCancel(nil)
	}
}
