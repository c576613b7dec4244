package httpretry

import (
	"io"
	"sync"
)

// keeper keeps the body of a response the cache stores once it has been
// read to the end: it copies what the caller reads, up to room bytes. It
// belongs to the response's body: rmu orders the body's Reads (one that
// net/http allows to run at once would append its bytes out of order),
// and mu orders a Read's bytes with a Close, which may come from another
// goroutine while a Read runs (net/http lets a Close abort a Read).
type keeper struct {
	rmu    sync.Mutex
	mu     sync.Mutex
	s      *staleCache
	key    string
	e      *staleEntry
	room   int64 // most body bytes the entry may hold
	length int64 // the response's ContentLength, -1 if unknown
	buf    []byte
	done   bool // stored, or given up on
}

// read is told what a Read of the body returned.
func (k *keeper) read(p []byte, err error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.done {
		return
	}
	if int64(len(k.buf)+len(p)) > k.room {
		k.giveUp() // larger than the cache may hold: passed through, not kept
		return
	}
	if need := len(k.buf) + len(p); need > cap(k.buf) && k.length > 0 {
		// Grow by doubling, to the Content-Length at most: memory follows
		// what was read (a server that announces a large body and stalls
		// holds no more than it sent), and a body that says its length
		// ends with no spare capacity.
		n := int(min(max(int64(2*cap(k.buf)), int64(need)), max(k.length, int64(need))))
		k.buf = append(make([]byte, 0, n), k.buf...)
	}
	k.buf = append(k.buf, p...)
	switch {
	case err == io.EOF, err == nil && k.length >= 0 && int64(len(k.buf)) == k.length:
		// The end, or all its Content-Length said (a body need not say
		// io.EOF with its last bytes, nor the caller read again for it).
		k.finish()
	case err != nil:
		// Cut short (a broken connection, a timeout, a cancel): not an
		// answer of the host's, so the one kept before stands.
		k.done, k.buf = true, nil
		k.s.settle(k.key, k.e, false, false)
	}
}

// close is told the caller closed the body: one read to its Content-Length
// is kept even if the caller stopped before it saw io.EOF; one closed
// before its end is not kept, and the one kept before for the same
// request stands (the caller, not the host, cut it short).
func (k *keeper) close() {
	k.mu.Lock()
	defer k.mu.Unlock()
	if !k.done {
		if k.length >= 0 && int64(len(k.buf)) == k.length {
			k.finish()
		} else {
			k.done, k.buf = true, nil
			k.s.settle(k.key, k.e, false, false)
		}
	}
}

func (k *keeper) finish() {
	k.done = true
	if k.length >= 0 && int64(len(k.buf)) != k.length {
		// Cut short: not the response the server sent.
		k.buf = nil
		k.s.settle(k.key, k.e, false, false)
		return
	}
	k.e.body, k.e.length = k.buf, int64(len(k.buf))
	k.buf = nil
	k.s.settle(k.key, k.e, true, false)
}

func (k *keeper) giveUp() {
	k.done, k.buf = true, nil
	k.s.settle(k.key, k.e, false, true)
}
