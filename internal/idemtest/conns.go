package idemtest

import (
	"net"
	"sync"
)

// connSet tracks the open connections of a proxy, so that closing the
// proxy closes them all, and serves the connections a listener accepts.
// The zero connSet is empty and open; it is safe for concurrent use.
type connSet struct {
	mu sync.Mutex
	// Fields below are guarded by mu.
	conns  map[net.Conn]struct{}
	closed bool

	wg sync.WaitGroup
}

// add tracks c; false (and c closed) if the set is closed.
func (s *connSet) add(c net.Conn) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		_ = c.Close()
		return false
	}
	if s.conns == nil {
		s.conns = make(map[net.Conn]struct{})
	}
	s.conns[c] = struct{}{}
	return true
}

// remove closes c and stops tracking it.
func (s *connSet) remove(c net.Conn) {
	s.mu.Lock()
	delete(s.conns, c)
	s.mu.Unlock()
	_ = c.Close()
}

// serve accepts connections on ln until ln is closed and serves each in a
// goroutine of its own with serve; the connection is closed after.
func (s *connSet) serve(ln net.Listener, serve func(net.Conn)) {
	s.wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil || !s.add(c) {
				return // closed
			}
			s.wg.Go(func() {
				defer s.remove(c)
				serve(c)
			})
		}
	})
}

// close closes ln and every tracked connection, and waits for the
// goroutines of serve to end.
func (s *connSet) close(ln net.Listener) {
	s.mu.Lock()
	s.closed = true
	for c := range s.conns {
		_ = c.Close()
	}
	s.mu.Unlock()
	_ = ln.Close()
	s.wg.Wait()
}
