package idempotency

import (
	"bufio"
	"errors"
	"net"
	"net/http"
	"slices"
)

// recorder passes a response through to the client and keeps what the
// handler produced, for the record: final status, allow-listed header
// fields, body up to max bytes. What reaches the client does not change
// what is kept: when writing to the client fails (it went away, an
// http.TimeoutHandler in front gave up, a writer that errors), the
// recorder stops writing to it but keeps accepting the body, so that the
// handler finishes its answer and the record is whole; only once the body
// is over max does the handler see the client's error.
//
// It has the optional methods handlers use: Flush (http.Flusher), Hijack
// (http.Hijacker; a hijacked exchange is never stored), and Unwrap, through
// which http.ResponseController reaches the rest. It has no ReadFrom: the
// recorder must see the bytes, so the sendfile path of the underlying
// writer could not be used anyway.
type recorder struct {
	w           http.ResponseWriter
	replay      []string
	max         int
	wroteHeader bool
	status      int
	header      http.Header
	body        []byte
	overflow    bool  // the body went over max and is not kept
	clientErr   error // the first error writing to the client
	hijacked    bool
}

var (
	_ http.Flusher  = (*recorder)(nil)
	_ http.Hijacker = (*recorder)(nil)
)

func (rw *recorder) Header() http.Header { return rw.w.Header() }

func (rw *recorder) WriteHeader(code int) {
	if rw.hijacked {
		return
	}
	if !rw.wroteHeader && (code >= 200 || code == http.StatusSwitchingProtocols) {
		rw.snapshot(code)
	}
	rw.w.WriteHeader(code)
}

// snapshot records the final status and the allow-listed header fields as
// they are when the header is written.
func (rw *recorder) snapshot(code int) {
	rw.wroteHeader = true
	rw.status = code
	h := rw.w.Header()
	for _, name := range rw.replay {
		if vs, ok := h[name]; ok {
			if rw.header == nil {
				rw.header = make(http.Header, len(rw.replay))
			}
			rw.header[name] = slices.Clone(vs)
		}
	}
}

func (rw *recorder) Write(p []byte) (int, error) {
	if rw.hijacked {
		return 0, http.ErrHijacked
	}
	if !rw.wroteHeader {
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
	if !rw.overflow {
		if len(rw.body)+len(p) > rw.max {
			rw.overflow = true
			rw.body = nil
		} else {
			rw.body = append(rw.body, p...)
		}
	}
	if rw.overflow && rw.clientErr != nil {
		return 0, rw.clientErr
	}
	return len(p), nil
}

// FlushError flushes the underlying writer through http.ResponseController.
// Once writing to the client has failed it does nothing (see Write).
func (rw *recorder) FlushError() error {
	if rw.hijacked {
		return http.ErrHijacked
	}
	if !rw.wroteHeader {
		rw.WriteHeader(http.StatusOK)
	}
	if rw.clientErr == nil {
		err := http.NewResponseController(rw.w).Flush()
		if err == nil || errors.Is(err, http.ErrNotSupported) {
			return err
		}
		rw.clientErr = err
	}
	if rw.overflow {
		return rw.clientErr
	}
	return nil
}

// Flush implements http.Flusher for handlers that type-assert it.
func (rw *recorder) Flush() { _ = rw.FlushError() }

// Hijack implements http.Hijacker through http.ResponseController, so it
// fails with an error wrapping http.ErrNotSupported where the underlying
// writer cannot hijack (HTTP/2). A hijacked exchange is not stored.
func (rw *recorder) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	conn, brw, err := http.NewResponseController(rw.w).Hijack()
	if err == nil {
		rw.hijacked = true
	}
	return conn, brw, err
}

// Unwrap returns the underlying writer, for http.ResponseController.
func (rw *recorder) Unwrap() http.ResponseWriter { return rw.w }
