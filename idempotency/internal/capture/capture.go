// Package capture passes a handler's response through to the client while
// it keeps what the handler produced, for the idempotency middleware to
// store: [Writer] is the http.ResponseWriter the guarded handler writes to,
// [Body] the request body it reads.
package capture

import (
	"bufio"
	"bytes"
	"errors"
	"net"
	"net/http"
	"slices"
)

// Writer passes a response through to the client and keeps what the
// handler produced, for the record: final status, allow-listed header
// fields, body up to a cap. What reaches the client does not change
// what is kept: when writing to the client fails (it went away, an
// http.TimeoutHandler in front gave up, a writer that errors), the
// writer stops writing to it but keeps accepting the body, so that the
// handler finishes its answer and the record is whole; only once the body
// is over max does the handler see the client's error.
//
// It has the optional methods handlers use: Flush (http.Flusher), Hijack
// (http.Hijacker; a hijacked exchange is never stored), and Unwrap, through
// which http.ResponseController reaches the rest. It has no ReadFrom: the
// writer must see the bytes, so the sendfile path of the underlying
// writer could not be used anyway.
//
// A Writer is used by the handler's goroutine only; read its fields once
// the handler has returned.
type Writer struct {
	w      http.ResponseWriter
	replay []string
	max    int

	// WroteHeader reports whether the handler wrote its final header (or
	// a body, which writes a 200 header).
	WroteHeader bool
	// Status is the final status written, valid when WroteHeader.
	Status int
	// Fields holds the allow-listed header fields as they were when the
	// header was written; nil if none.
	Fields http.Header
	// Body is the body written, if it was at most the cap.
	Body []byte
	// Overflow reports that the body went over the cap and is not kept.
	Overflow bool
	// Hijacked reports that the handler hijacked the connection.
	Hijacked bool

	clientErr error // the first error writing to the client
}

var (
	_ http.Flusher  = (*Writer)(nil)
	_ http.Hijacker = (*Writer)(nil)
)

// Exchange is a Writer and a Body in one allocation.
type Exchange struct {
	W    Writer
	Body Body
}

// New returns an Exchange whose writer passes the response through to w
// and keeps the header fields named in replay (canonical names) and at
// most max body bytes, and whose body reads body.
func New(w http.ResponseWriter, replay []string, max int, body []byte) *Exchange {
	x := &Exchange{W: Writer{w: w, replay: replay, max: max}}
	x.Body.Reset(body)
	return x
}

// Body is the request body a guarded handler reads: the bytes the
// middleware read to fingerprint the request.
type Body struct{ bytes.Reader }

// Close does nothing.
func (*Body) Close() error { return nil }

// Header returns the underlying writer's header.
func (rw *Writer) Header() http.Header { return rw.w.Header() }

// WriteHeader writes the header to the client and, for a final status,
// keeps it.
func (rw *Writer) WriteHeader(code int) {
	if rw.Hijacked {
		return
	}
	if !rw.WroteHeader && (code >= 200 || code == http.StatusSwitchingProtocols) {
		rw.Snapshot(code)
	}
	rw.w.WriteHeader(code)
}

// Snapshot keeps code as the final status and the allow-listed header
// fields as they are now, without writing anything: for a handler that
// returned without writing (an implicit 200).
func (rw *Writer) Snapshot(code int) {
	rw.WroteHeader = true
	rw.Status = code
	h := rw.w.Header()
	for _, name := range rw.replay {
		if vs, ok := h[name]; ok {
			if rw.Fields == nil {
				rw.Fields = make(http.Header, len(rw.replay))
			}
			rw.Fields[name] = slices.Clone(vs)
		}
	}
}

// Write writes p to the client and keeps it, up to the cap.
func (rw *Writer) Write(p []byte) (int, error) {
	if rw.Hijacked {
		return 0, http.ErrHijacked
	}
	if !rw.WroteHeader {
		rw.WriteHeader(http.StatusOK)
	}
	if rw.clientErr == nil {
		if _, err := rw.w.Write(p); err != nil {
			if errors.Is(err, http.ErrBodyNotAllowed) {
				return 0, err // the status has no body: nothing was produced
			}
			rw.clientErr = err
		}
	}
	if !rw.Overflow {
		if len(rw.Body)+len(p) > rw.max {
			rw.Overflow = true
			rw.Body = nil
		} else {
			rw.Body = append(rw.Body, p...)
		}
	}
	if rw.Overflow && rw.clientErr != nil {
		return 0, rw.clientErr
	}
	return len(p), nil
}

// FlushError flushes the underlying writer through http.ResponseController.
// Once writing to the client has failed it does nothing (see Write).
func (rw *Writer) FlushError() error {
	if rw.Hijacked {
		return http.ErrHijacked
	}
	if !rw.WroteHeader {
		rw.WriteHeader(http.StatusOK)
	}
	headerOnly := len(rw.Body) == 0 && !rw.Overflow
	if rw.clientErr == nil {
		err := http.NewResponseController(rw.w).Flush()
		if errors.Is(err, http.ErrNotSupported) {
			// Nothing was sent (a writer that cannot flush, such as
			// http.TimeoutHandler's): the header goes out with the first
			// bytes, and net/http picks a Content-Type from them.
			return err
		}
		if headerOnly {
			rw.noTypeSent()
		}
		if err == nil {
			return nil
		}
		rw.clientErr = err
	} else if headerOnly {
		rw.noTypeSent()
	}
	if rw.Overflow {
		return rw.clientErr
	}
	return nil
}

// noTypeSent records, for a header flushed before any body byte, that it
// went without a Content-Type if the handler set none: net/http picks one
// from the first bytes it sends, and had none to pick from. The replay
// then sends none either, instead of picking one from its whole body.
func (rw *Writer) noTypeSent() {
	const ct = "Content-Type"
	if _, set := rw.w.Header()[ct]; set || !slices.Contains(rw.replay, ct) {
		return
	}
	if rw.Fields == nil {
		rw.Fields = make(http.Header, len(rw.replay))
	}
	if _, kept := rw.Fields[ct]; !kept {
		rw.Fields[ct] = nil
	}
}

// Flush implements http.Flusher for handlers that type-assert it.
func (rw *Writer) Flush() { _ = rw.FlushError() }

// Hijack implements http.Hijacker through http.ResponseController, so it
// fails with an error wrapping http.ErrNotSupported where the underlying
// writer cannot hijack (HTTP/2). A hijacked exchange is not stored.
func (rw *Writer) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	conn, brw, err := http.NewResponseController(rw.w).Hijack()
	if err == nil {
		rw.Hijacked = true
	}
	return conn, brw, err
}

// Unwrap returns the underlying writer, for http.ResponseController.
func (rw *Writer) Unwrap() http.ResponseWriter { return rw.w }
