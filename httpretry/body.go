package httpretry

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"
)

// drainLimit is how much of a discarded response body is read before it is
// closed: enough for the usual error page, so the connection goes back to
// the pool, small enough that a huge body is cut off instead (the
// connection is then closed, not the pool).
const drainLimit = 64 << 10

// drainTimeout bounds how long a discarded response body is read: a body
// that stalls after its headers (a server that sent a 503 and hung) must
// not hold the retry; closing it unread costs only its connection.
const drainTimeout = 50 * time.Millisecond

// drainClose reads up to drainLimit bytes of rc, for at most drainTimeout,
// and closes it. It asks for one byte more than drainLimit: a body of
// exactly drainLimit bytes is read to its end (a chunked body's last,
// empty chunk included), so that its connection is reused.
func drainClose(rc io.ReadCloser) {
	t := time.AfterFunc(drainTimeout, func() { _ = rc.Close() })
	_, _ = io.CopyN(io.Discard, rc, drainLimit+1)
	t.Stop()
	_ = rc.Close()
}

// discardBody drains and closes a discarded response body (see
// drainClose), or only closes one that detachBody already read for its
// time: a longer body (what was read, then the rest) or a stalled one
// (the pipe), which would otherwise hold the retry a second drainTimeout.
func discardBody(rc io.ReadCloser) {
	switch b := rc.(type) {
	case *onceBody:
		_ = b.Close()
		return
	case *body:
		if _, ok := b.ReadCloser.(*io.PipeReader); ok {
			_ = b.Close()
			return
		}
	}
	drainClose(rc)
}

// body wraps the body of a response handed to the caller when there is
// something to do as it is read or on Close: cancel the contexts made for
// the call, keep the body for the stale cache.
type body struct {
	io.ReadCloser
	cancelAttempt context.CancelFunc // nil if none
	cancelCall    context.CancelFunc // nil if none
	keep          *keeper            // nil if the stale cache does not keep it (stale.go)
}

// Read reads from the response body; at EOF it releases the contexts.
func (b *body) Read(p []byte) (int, error) {
	var n int
	var err error
	if k := b.keep; k != nil {
		k.rmu.Lock()
		n, err = b.ReadCloser.Read(p)
		k.read(p[:n], err)
		k.rmu.Unlock()
	} else {
		n, err = b.ReadCloser.Read(p)
	}
	if err == io.EOF {
		b.cancel()
	}
	return n, err
}

// Close closes the response body and releases the contexts.
func (b *body) Close() error {
	if b.keep != nil {
		b.keep.close()
	}
	err := b.ReadCloser.Close()
	b.cancel()
	return err
}

func (b *body) cancel() {
	if b.cancelAttempt != nil {
		b.cancelAttempt()
	}
	if b.cancelCall != nil {
		b.cancelCall()
	}
}

// bufferBody reads up to limit bytes of req's body. If the whole body fits,
// it returns the bytes (the body is closed) and replayable true. Otherwise
// it returns a body that sends what was read followed by the rest, to be
// sent once, and replayable false. A read error is returned as is, with
// the body closed; a Read that panics closes it too (the panic goes on).
func bufferBody(rc io.ReadCloser, contentLength, limit int64) (data []byte, once io.ReadCloser, replayable bool, err error) {
	if contentLength > limit {
		return nil, rc, false, nil
	}
	capHint := limit + 1
	if contentLength > 0 {
		capHint = contentLength + 1
	}
	buf := bytes.NewBuffer(make([]byte, 0, min(capHint, 32<<10)))
	read := false
	defer func() {
		if !read { // the body's Read panicked: closed all the same, and the panic goes on
			_ = rc.Close()
		}
	}()
	_, err = buf.ReadFrom(io.LimitReader(rc, limit+1))
	read = true
	if err != nil {
		_ = rc.Close()
		return nil, nil, false, err
	}
	if int64(buf.Len()) <= limit {
		_ = rc.Close()
		return buf.Bytes(), nil, true, nil
	}
	return nil, &onceBody{Reader: io.MultiReader(bytes.NewReader(buf.Bytes()), rc), closer: rc}, false, nil
}

// onceBody is a body read partly from a buffer and then from the original.
type onceBody struct {
	io.Reader
	closer io.Closer
}

func (b *onceBody) Close() error { return b.closer.Close() }

// bytesBody returns a fresh reader over data for one attempt.
func bytesBody(data []byte) io.ReadCloser {
	if len(data) == 0 {
		return http.NoBody
	}
	return io.NopCloser(bytes.NewReader(data))
}

// closeReqBody closes req's body, if any.
func closeReqBody(req *http.Request) {
	if req.Body != nil {
		_ = req.Body.Close()
	}
}

// detachBody reads a failed attempt's body (up to drainLimit, for at most
// drainTimeout) into memory and closes it, so that its connection goes back
// to the pool before the sleep rather than after it; the bytes stay
// readable for the caller if this is the response it gets. A longer body
// is left as it is (what was read, then the rest); a stalled one is read
// on in the background and handed whole to the caller if it gets it (a
// body that came 120 ms after its headers was closed at 50 ms, and the
// caller read nothing). The read ends halfway to the request's deadline
// if that comes sooner, so that an answer that came in time is not taken
// for the attempt running out of time (a 503 whose body still streamed at
// the call's deadline once ended the call as "deadline", skipped the
// breaker and went to the fallback). ctx is the attempt's: its deadline
// is the request's (taken from ctx, not from resp.Request, which a base
// transport may leave nil).
func detachBody(ctx context.Context, resp *http.Response) {
	rc := resp.Body
	if rc == nil || rc == http.NoBody {
		return
	}
	wait := drainTimeout
	if dl, ok := ctx.Deadline(); ok {
		wait = min(wait, max(time.Until(dl)/2, 0))
	}
	var buf []byte
	var err error
	done := make(chan struct{})
	go func() {
		buf, err = io.ReadAll(io.LimitReader(rc, drainLimit+1))
		close(done)
	}()
	t := time.NewTimer(wait)
	select {
	case <-done:
		t.Stop()
		if err == nil && len(buf) <= drainLimit {
			_ = rc.Close()
			resp.Body = io.NopCloser(bytes.NewReader(buf))
			return
		}
		resp.Body = &onceBody{Reader: io.MultiReader(bytes.NewReader(buf), rc), closer: rc}
	case <-t.C:
		// Stalled: read on in the background, and handed whole through
		// a pipe to the caller if this is the response it gets. Closing
		// it closes the pipe and the body (which ends a stalled read).
		pr, pw := io.Pipe()
		go func() {
			<-done
			werr := err
			if _, e := pw.Write(buf); e == nil && err == nil && len(buf) > drainLimit {
				_, werr = io.Copy(pw, rc)
			}
			_ = rc.Close()
			_ = pw.CloseWithError(werr)
		}()
		resp.Body = &body{ReadCloser: pr, cancelAttempt: func() { _ = rc.Close() }}
	}
}

// rewind gets the body of the next send from GetBody as soon as an attempt
// failed, while its answer is at hand: a body that cannot be rewound ends
// the call with an error (rewindError) that holds that answer (the host's 503, the
// broken connection), which the breaker and the limiter count as what it
// is, instead of with an attempt that sends nothing (once counted a success
// of the host and a latency sample of 0 s). Nothing to do for a body kept
// in memory or none.
func (c *call) rewind() error {
	req := c.req
	if c.next != nil || c.data != nil || c.once != nil || req.Body == nil || req.Body == http.NoBody || req.GetBody == nil {
		return nil
	}
	b, err := req.GetBody()
	if err != nil {
		return err
	}
	c.next = b
	return nil
}

// rewindError ends a call whose request body GetBody could not rewind
// after a failed attempt: err is GetBody's error, answer the attempt's
// (a *StatusError or the send's error), which the classifier judges.
func rewindError(answer, err error) error {
	return fmt.Errorf("httpretry: rewind request body: %w (after %w)", err, answer)
}

// body returns the request body for the next send.
func (c *call) body() (io.ReadCloser, error) {
	req := c.req
	switch {
	case c.data != nil:
		return bytesBody(c.data), nil
	case c.once != nil:
		b := c.once
		c.once, c.owned = nil, nil
		return b, nil
	case req.Body == nil || req.Body == http.NoBody:
		return req.Body, nil
	case c.sends == 0:
		c.owned = nil // the base transport closes it from now on
		return req.Body, nil
	case c.next != nil:
		b := c.next
		c.next = nil
		return b, nil
	case req.GetBody != nil:
		return req.GetBody()
	}
	// Only reached if a non-replayable body were sent twice, which the
	// Permanent marks prevent.
	return nil, errors.New("httpretry: request body cannot be replayed")
}
