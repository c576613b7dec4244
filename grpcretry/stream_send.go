package grpcretry

import (
	"io"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
)

// The sending side of a retried stream. Nothing is ever sent under rs.mu:
// a send may block on flow control until the caller reads, and a receive
// needs rs.mu (to open an attempt, to commit). Instead one goroutine at a
// time holds the send turn (rs.sending) and sends on the current attempt's
// stream, rs.mu released, what it lacks: the kept messages it has not had
// (rs.sent[rs.next:]), then the close of its sending side once the caller
// closed it (the backlog). The turn is the caller's sending goroutine's in
// SendMsg and CloseSend when no one holds it; an attempt that opens with a
// backlog and finds the turn free takes it for a goroutine of its own (for
// a stream whose caller sends; a server stream's one request is sent by
// the receive that opens it), so that the receive that opened it reads at
// once; an attempt opened by a message past the bound leaves the backlog
// to that message's SendMsg. A holder sends until the backlog is empty,
// also across attempts: when the stream it sends on fails and a new one
// opens, it replays the kept messages on the new one. A caller's message
// within the bound is kept; SendMsg sends it itself if it can take the
// turn, else leaves it to the holder. Once the stream is committed and its
// stream has had everything (rs.flushed), SendMsg sends directly.

// SendMsg sends m. Until the stream commits, m is kept for replay (up to
// the buffer's bound); the failure of an attempt shows in RecvMsg, which
// retries it.
func (rs *retryStream) SendMsg(m any) error {
	if !rs.committed.Load() {
		done, err := rs.sendUncommitted(m)
		if done {
			return err
		}
	}
	if !rs.flushed.Load() {
		rs.flushCommitted()
	}
	if rs.err != nil {
		return io.EOF
	}
	return rs.cur.SendMsg(m)
}

// CloseSend closes the sending side, after the messages kept before it; an
// attempt opened later closes it too.
func (rs *retryStream) CloseSend() error {
	rs.mu.Lock()
	rs.closed = true
	if rs.sending || !rs.backlog() {
		// The holder of the turn closes it after its sends; an attempt
		// not open yet has it in its backlog.
		rs.mu.Unlock()
		return nil
	}
	rs.sending = true
	rs.mu.Unlock()
	return rs.drain(false)
}

// sendUncommitted is SendMsg before the stream committed; done is false if
// it committed meanwhile and m is still to be sent on rs.cur.
func (rs *retryStream) sendUncommitted(m any) (done bool, err error) {
	rs.mu.Lock()
	if rs.committed.Load() {
		rs.mu.Unlock()
		return false, nil
	}
	if !rs.pinned {
		if pm, ok := m.(proto.Message); ok {
			if n := proto.Size(pm); rs.size+n <= rs.c.cfg.streamBuffer {
				rs.sent = append(rs.sent, m)
				rs.size += n
				if rs.cur == nil || rs.sending {
					// The attempt that opens, or the holder of the
					// turn, sends it.
					rs.mu.Unlock()
					return true, nil
				}
				rs.sending = true
				rs.mu.Unlock()
				// A failure shows in RecvMsg, which retries with m.
				_ = rs.drain(false)
				return true, nil
			}
		}
		rs.pinned = true
	}
	return rs.sendPinned(m)
}

// sendPinned sends m, a message the buffer cannot keep, on the current
// attempt's stream after the kept messages: that attempt is the last one.
// done is false if the stream committed meanwhile and m is still to be
// sent on rs.cur. It is called with rs.mu held, and releases it.
func (rs *retryStream) sendPinned(m any) (done bool, err error) {
	for {
		switch {
		case rs.committed.Load():
			rs.mu.Unlock()
			return false, nil
		case rs.cur != nil && rs.sending, rs.cur == nil && rs.looping:
			// Another send is on, or the loop sleeps between attempts.
			rs.cond.Wait()
			continue
		case rs.cur != nil && rs.backlog():
			rs.sending = true // the kept messages go first
			rs.mu.Unlock()
			_ = rs.drain(false)
			rs.mu.Lock()
			continue
		case rs.cur != nil:
			cs := rs.cur
			rs.sent, rs.next, rs.pinnedOut = nil, 0, true
			rs.sending = true
			rs.mu.Unlock()
			p, err := rs.sendOne(cs, m, false)
			rs.mu.Lock()
			rs.release()
			rs.mu.Unlock()
			if p != nil {
				panic(p.v)
			}
			return true, err
		}
		if !rs.loopMu.TryLock() {
			// Another call (a first RecvMsg or Header) runs the loop
			// and is about to open an attempt: m goes on that one.
			// Waiting for the loop's lock instead would wait for that
			// attempt's answer, which may need m.
			rs.cond.Wait()
			continue
		}
		rs.mu.Unlock()
		if err := rs.runLocked(trigFlush, nil, nil); err != nil && err != errCommittedMeanwhile {
			return true, err
		}
		return false, nil
	}
}

// flushCommitted waits until the committed stream had everything it lacked
// (sending it if no one else does), so that SendMsg sends directly.
func (rs *retryStream) flushCommitted() {
	rs.mu.Lock()
	for !rs.flushed.Load() {
		if rs.sending {
			rs.cond.Wait()
			continue
		}
		rs.sending = true
		rs.mu.Unlock()
		_ = rs.drain(false)
		rs.mu.Lock()
	}
	rs.mu.Unlock()
}

// backlog reports whether the current attempt's stream lacks kept messages
// or the close of its sending side (rs.mu held).
func (rs *retryStream) backlog() bool {
	return rs.cur != nil && rs.err == nil && (rs.next < len(rs.sent) || rs.closed && !rs.closeSent)
}

// release ends the send turn (rs.mu held).
func (rs *retryStream) release() {
	rs.sending = false
	rs.cond.Broadcast()
	rs.settle()
}

// settle marks a committed stream that lacks nothing, with no send on,
// flushed: its kept messages are dropped, and SendMsg sends directly
// (rs.mu held).
func (rs *retryStream) settle() {
	if rs.committed.Load() && !rs.sending && !rs.backlog() {
		rs.sent, rs.next = nil, 0
		rs.flushed.Store(true)
	}
}

// drain sends the backlog on the calling goroutine, which holds the send
// turn and not rs.mu, and releases the turn once it is empty; it returns
// the error of a CloseSend it made. The error of the client's own of a kept
// message's send (not io.EOF, a stream that ended, which RecvMsg tells) is
// left for the attempt, which ends with it (rs.replayErr). A send that
// panics releases the turn; on a goroutine of drain's own (async) the
// attempt's stream is canceled, and the attempt panics with the value in
// its place (rs.replayPanic).
func (rs *retryStream) drain(async bool) (closeErr error) {
	rs.mu.Lock()
	for rs.backlog() {
		cs, n := rs.cur, rs.opened // streams are not compared: their type may not be comparable
		var m any
		closing := rs.next == len(rs.sent)
		if closing {
			rs.closeSent = true
		} else {
			m = rs.sent[rs.next]
			rs.next++
		}
		rs.sendingOn = n
		rs.mu.Unlock()
		p, err := rs.sendOne(cs, m, closing)
		rs.mu.Lock()
		rs.sendingOn = 0
		if p != nil {
			rs.release()
			if !async {
				rs.mu.Unlock()
				panic(p.v)
			}
			if rs.opened == n && rs.replayPanic == nil {
				rs.replayPanic = p
				rs.curCancel(errAttemptPanicked)
			}
			break
		}
		if closing {
			closeErr = err
		}
		if err != nil && err != io.EOF && rs.opened == n && rs.replayErr == nil {
			rs.replayErr = err
		}
		rs.cond.Broadcast() // for an attempt waiting for this send to end
	}
	if rs.sending {
		rs.release()
	}
	rs.mu.Unlock()
	return closeErr
}

// sendPanic is the value a send panicked with.
type sendPanic struct{ v any }

// sendOne sends m on cs (or closes its sending side), rs.mu not held; p is
// not nil if it panicked. If it exits its goroutine (runtime.Goexit), it
// releases the send turn on the way.
func (rs *retryStream) sendOne(cs grpc.ClientStream, m any, closing bool) (p *sendPanic, err error) {
	returned := false
	defer func() {
		if returned {
			return
		}
		if v := recover(); v != nil {
			p = &sendPanic{v}
			return
		}
		rs.mu.Lock()
		rs.sendingOn = 0
		rs.release()
		rs.mu.Unlock()
	}()
	if closing {
		err = cs.CloseSend()
	} else {
		err = cs.SendMsg(m)
	}
	returned = true
	return nil, err
}
