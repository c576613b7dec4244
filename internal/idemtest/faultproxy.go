package idemtest

// FaultProxy: the TCP proxy of the fault scenarios (RunFaults), which
// cuts, mutes, holds or resets a store client's link on demand.

import (
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"sync"
	"sync/atomic"
	"testing"
)

// ---- the proxy -----------------------------------------------------------

type fltMode int

const (
	fltPass      fltMode = iota
	fltBlackhole         // every byte either way dropped, nothing closed
	fltMuteReply         // requests forwarded, replies dropped, nothing closed
	fltRefuse            // every chunk a client sends: both sides reset
	fltHold              // client chunks held until the mode changes, then forwarded
)

type FaultProxy struct {
	ln     net.Listener
	target string

	mu                 sync.Mutex
	cond               *sync.Cond
	mode               fltMode
	cutNext            int // >0: the next client chunks forward, then their reply is cut
	resetRate, cutRate float64
	rng                *rand.Rand
	conns              map[*fltPair]struct{}
	closed             bool

	chunks atomic.Int64
	cuts   atomic.Int64
}

type fltPair struct {
	c, s   net.Conn
	cutRep atomic.Bool
	once   sync.Once
}

func (p *fltPair) kill() {
	p.once.Do(func() {
		if tc, ok := p.c.(*net.TCPConn); ok {
			tc.SetLinger(0)
		}
		if tc, ok := p.s.(*net.TCPConn); ok {
			tc.SetLinger(0)
		}
		p.c.Close()
		p.s.Close()
	})
}

func NewFaultProxy(t *testing.T, target string) *FaultProxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &FaultProxy{ln: ln, target: target, conns: map[*fltPair]struct{}{}}
	p.cond = sync.NewCond(&p.mu)
	go p.accept()
	t.Cleanup(p.Close)
	return p
}

func (p *FaultProxy) Addr() string { return p.ln.Addr().String() }

func (p *FaultProxy) Close() {
	p.mu.Lock()
	p.closed = true
	p.mode = fltPass
	for c := range p.conns {
		c.kill()
	}
	p.cond.Broadcast()
	p.mu.Unlock()
	p.ln.Close()
}

func (p *FaultProxy) Set(m fltMode) {
	p.mu.Lock()
	p.mode = m
	p.cond.Broadcast()
	p.mu.Unlock()
}

// Random: each client chunk is reset (not forwarded) with probability
// reset, or forwarded and its reply cut with probability cut.
func (p *FaultProxy) Random(reset, cut float64, seed uint64) {
	p.mu.Lock()
	p.resetRate, p.cutRate = reset, cut
	p.rng = rand.New(rand.NewPCG(seed, 7))
	p.mu.Unlock()
}

// CutNext: the next n chunks any client sends are forwarded, and the
// server's reply to each is dropped and both connections reset.
func (p *FaultProxy) CutNext(n int) {
	p.mu.Lock()
	p.cutNext = n
	p.mu.Unlock()
}

func (p *FaultProxy) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		s, err := net.Dial("tcp", p.target)
		if err != nil {
			c.Close()
			continue
		}
		pr := &fltPair{c: c, s: s}
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			pr.kill()
			return
		}
		p.conns[pr] = struct{}{}
		p.mu.Unlock()
		go p.up(pr)
		go p.down(pr)
	}
}

func (p *FaultProxy) up(pr *fltPair) {
	defer func() {
		pr.kill()
		p.mu.Lock()
		delete(p.conns, pr)
		p.mu.Unlock()
	}()
	buf := make([]byte, 64<<10)
	for {
		n, err := pr.c.Read(buf)
		if n > 0 {
			p.chunks.Add(1)
			p.mu.Lock()
			for p.mode == fltHold && !p.closed {
				p.cond.Wait()
			}
			mode := p.mode
			cut := false
			if mode == fltPass || mode == fltMuteReply {
				if p.cutNext > 0 {
					p.cutNext--
					cut = true
				} else if p.rng != nil {
					x := p.rng.Float64()
					switch {
					case x < p.resetRate:
						mode = fltRefuse
					case x < p.resetRate+p.cutRate:
						cut = true
					}
				}
			}
			p.mu.Unlock()
			switch mode {
			case fltBlackhole:
				continue
			case fltRefuse:
				return
			}
			if cut {
				pr.cutRep.Store(true)
			}
			if _, werr := pr.s.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

func (p *FaultProxy) down(pr *fltPair) {
	defer pr.kill()
	buf := make([]byte, 64<<10)
	for {
		n, err := pr.s.Read(buf)
		if n > 0 {
			if pr.cutRep.Load() {
				p.cuts.Add(1)
				return
			}
			p.mu.Lock()
			mode := p.mode
			p.mu.Unlock()
			if mode == fltBlackhole || mode == fltMuteReply {
				continue
			}
			if _, werr := pr.c.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			if !errors.Is(err, io.EOF) {
				return
			}
			return
		}
	}
}

// ---- store through the proxy ----------------------------------------------
