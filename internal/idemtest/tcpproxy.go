package idemtest

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// TCPProxy is a TCP proxy in front of one server (PostgreSQL, Redis...)
// whose faults a test switches on and off while clients are connected:
// [TCPProxy.Blackhole] swallows all traffic without closing anything, and
// [TCPProxy.CutReplyTo] drops the server's reply to one chosen request and
// resets the client's connection, so that the client cannot know whether
// the server executed it, and [TCPProxy.Delay] holds what clients send for
// a while (a slow network or a loaded server). Each client connection gets its own connection to
// the server. [TCPProxy.SetFaults] makes it lossy: it resets or cuts
// connections at random. It is safe for concurrent use. Close it when
// done.
type TCPProxy struct {
	ln     net.Listener
	target string

	conns connSet

	mu sync.Mutex
	// Fields below are guarded by mu.
	blackhole bool
	refuse    bool
	delay     time.Duration
	cutMatch  []byte // non-nil: the one-shot cut is armed
	faults    TCPFaults
	rng       *rand.Rand // nil: no random faults

	chunks, resets, cuts atomic.Int64
}

// TCPFaults are the random faults of a [TCPProxy]: each chunk a client
// sends (each read of its connection, which may hold a part of a request,
// one request or several) meets at most one. The zero TCPFaults has none.
type TCPFaults struct {
	// ResetRate is the fraction of chunks, from 0 to 1, that are dropped
	// with both connections reset: the server never sees the chunk, and
	// the client sees its connection reset.
	ResetRate float64
	// CutRate is the fraction of chunks that are forwarded to the server,
	// after which the server's next reply on that connection is dropped
	// and both connections are reset: the server acts on what the client
	// sent, and the client cannot know whether it did.
	CutRate float64
	// Seed seeds the sequence of faults; 0 means 1.
	Seed uint64
}

// NewTCPProxy starts a proxy on a loopback port that relays every
// connection to target ("host:port").
func NewTCPProxy(target string) (*TCPProxy, error) {
	if target == "" {
		return nil, errors.New("idemtest: NewTCPProxy: empty target")
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("idemtest: NewTCPProxy: %w", err)
	}
	p := &TCPProxy{ln: ln, target: target}
	p.conns.serve(ln, p.serve)
	return p, nil
}

// Addr returns the proxy's address, "127.0.0.1:port".
func (p *TCPProxy) Addr() string { return p.ln.Addr().String() }

// Blackhole switches the black hole on or off. While it is on, the proxy
// still accepts connections but every byte either side sends, on new and
// existing connections, is read and dropped: clients wait for answers that
// never come. Bytes dropped stay lost when it is switched off.
func (p *TCPProxy) Blackhole(on bool) {
	p.mu.Lock()
	p.blackhole = on
	p.mu.Unlock()
}

// Refuse switches refusal on or off. While it is on, every chunk a client
// sends, on new and existing connections, is dropped with both
// connections reset: the server looks down (connection refused or reset),
// and comes back when it is switched off.
func (p *TCPProxy) Refuse(on bool) {
	p.mu.Lock()
	p.refuse = on
	p.mu.Unlock()
}

// Delay makes the proxy hold every chunk a client sends from now on for d
// before forwarding it (in order, per connection), until Delay(0): each
// request then meets d more latency. A chunk already held keeps its delay.
func (p *TCPProxy) Delay(d time.Duration) {
	p.mu.Lock()
	p.delay = max(d, 0)
	p.mu.Unlock()
}

// CutReplyTo arms a one-shot cut: the next chunk a client sends that
// contains match is forwarded to the server, but the server's reply is
// dropped and both connections are reset (the client sees a reset after
// its request went out). [TCPProxy.Cuts] counts the cuts made.
func (p *TCPProxy) CutReplyTo(match []byte) {
	p.mu.Lock()
	p.cutMatch = bytes.Clone(match)
	p.mu.Unlock()
}

// SetFaults sets the random faults for the chunks clients send from now
// on, on every connection (the zero TCPFaults turns them off). Each call
// starts the sequence of faults anew from f.Seed; which chunk meets which
// fault depends on the order in which concurrent connections send, so
// only the rates are reproducible. Rates outside 0 to 1, or whose sum is
// over 1, are an error.
func (p *TCPProxy) SetFaults(f TCPFaults) error {
	if !(f.ResetRate >= 0 && f.CutRate >= 0 && f.ResetRate+f.CutRate <= 1) {
		return fmt.Errorf("idemtest: SetFaults: rates %v and %v must be from 0 to 1, together at most 1", f.ResetRate, f.CutRate)
	}
	if f.Seed == 0 {
		f.Seed = 1
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.faults, p.rng = f, nil
	if f.ResetRate > 0 || f.CutRate > 0 {
		p.rng = rand.New(rand.NewPCG(f.Seed, 0x5eed))
	}
	return nil
}

// Cuts returns the number of cuts made so far: by [TCPProxy.CutReplyTo]
// and by the random faults.
func (p *TCPProxy) Cuts() int64 { return p.cuts.Load() }

// Resets returns the number of chunks the random faults dropped, with
// their connections reset, so far.
func (p *TCPProxy) Resets() int64 { return p.resets.Load() }

// Chunks returns the number of chunks clients sent that the proxy read so
// far, outside a black hole: the chunks the random faults are drawn for.
func (p *TCPProxy) Chunks() int64 { return p.chunks.Load() }

// Close stops the proxy: it closes the listener and every connection, and
// waits for its goroutines to end.
func (p *TCPProxy) Close() { p.conns.close(p.ln) }

// serve relays one client connection.
func (p *TCPProxy) serve(c net.Conn) {
	u, err := net.Dial("tcp", p.target)
	if err != nil || !p.conns.add(u) {
		return
	}
	defer p.conns.remove(u)
	var cutPending atomic.Bool
	done := make(chan struct{})
	go func() { // client -> server
		defer close(done)
		buf := make([]byte, 32<<10)
		for {
			n, err := c.Read(buf)
			if n > 0 {
				p.mu.Lock()
				drop, refuse, delay := p.blackhole, p.refuse && !p.blackhole, p.delay
				resetNow := false
				if !drop && !refuse {
					p.chunks.Add(1)
					switch {
					case p.cutMatch != nil && bytes.Contains(buf[:n], p.cutMatch):
						p.cutMatch = nil
						cutPending.Store(true)
					case p.rng != nil:
						switch x := p.rng.Float64(); {
						case x < p.faults.ResetRate:
							resetNow = true
						case x < p.faults.ResetRate+p.faults.CutRate:
							cutPending.Store(true)
						}
					}
				}
				p.mu.Unlock()
				if resetNow || refuse {
					if resetNow {
						p.resets.Add(1)
					}
					reset(c)
					_ = u.Close()
					return
				}
				if delay > 0 && !drop {
					time.Sleep(delay)
				}
				if !drop {
					if _, err := u.Write(buf[:n]); err != nil {
						return
					}
				}
			}
			if err != nil {
				_ = u.Close()
				return
			}
		}
	}()
	buf := make([]byte, 32<<10)
	for { // server -> client
		n, err := u.Read(buf)
		if n > 0 {
			p.mu.Lock()
			drop := p.blackhole
			p.mu.Unlock()
			if cutPending.Load() {
				p.cuts.Add(1)
				reset(c)
				_ = u.Close()
				break
			}
			if !drop {
				if _, err := c.Write(buf[:n]); err != nil {
					break
				}
			}
		}
		if err != nil {
			break
		}
	}
	_ = c.Close()
	<-done
}
