package fleet

import (
	"bufio"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// proxyMode is what a proxy does with traffic.
type proxyMode int32

const (
	pass      proxyMode = iota // forward both ways
	cut                        // close every connection, refuse new ones
	blackhole                  // accept and read, never answer
	delayed                    // forward each command after the delay
)

// proxy is a TCP proxy in front of a Redis server that a test controls: it
// can cut, blackhole or delay the traffic, and counts the commands it
// forwards, by name.
type proxy struct {
	ln     net.Listener
	target string
	mode   atomic.Int32
	delay  atomic.Int64 // ns, in delayed mode

	mu       sync.Mutex
	conns    map[net.Conn]bool // guarded by mu
	commands map[string]int64  // guarded by mu: forwarded commands by upper-case name
	wg       sync.WaitGroup
}

// newProxy starts a proxy to target on a free local port, stopped with t.
func newProxy(t testing.TB, target string) *proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{ln: ln, target: target, conns: map[net.Conn]bool{}, commands: map[string]int64{}}
	p.wg.Go(p.accept)
	t.Cleanup(p.close)
	return p
}

func (p *proxy) addr() string { return p.ln.Addr().String() }

// set switches the proxy to mode m; cut also closes every open connection.
func (p *proxy) set(m proxyMode, delay time.Duration) {
	p.delay.Store(int64(delay))
	p.mode.Store(int32(m))
	if m == cut {
		p.mu.Lock()
		for c := range p.conns {
			c.Close()
		}
		p.mu.Unlock()
	}
}

// count returns the commands named name (e.g. "EVALSHA") forwarded so far.
func (p *proxy) count(name string) int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.commands[name]
}

func (p *proxy) close() {
	p.ln.Close()
	p.set(cut, 0)
	p.wg.Wait()
}

func (p *proxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if proxyMode(p.mode.Load()) == cut {
		return false
	}
	p.conns[c] = true
	return true
}

func (p *proxy) untrack(c net.Conn) {
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
	c.Close()
}

func (p *proxy) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		if !p.track(c) {
			c.Close()
			continue
		}
		p.wg.Go(func() { p.serve(c) })
	}
}

// serve forwards one client connection, command by command.
func (p *proxy) serve(client net.Conn) {
	defer p.untrack(client)
	var server net.Conn
	defer func() {
		if server != nil {
			p.untrack(server)
		}
	}()
	r := bufio.NewReader(client)
	for {
		cmd, name, err := readCommand(r)
		if err != nil {
			return
		}
		switch proxyMode(p.mode.Load()) {
		case blackhole:
			continue // swallowed
		case delayed:
			time.Sleep(time.Duration(p.delay.Load()))
		case cut:
			return
		}
		if server == nil {
			if server, err = net.Dial("tcp", p.target); err != nil {
				return
			}
			if !p.track(server) {
				return
			}
			p.wg.Go(func() {
				// Replies go back as they come, unless blackholed.
				buf := make([]byte, 32<<10)
				for {
					n, err := server.Read(buf)
					if n > 0 && proxyMode(p.mode.Load()) != blackhole {
						if _, err := client.Write(buf[:n]); err != nil {
							return
						}
					}
					if err != nil {
						client.Close()
						return
					}
				}
			})
		}
		p.mu.Lock()
		p.commands[name]++
		p.mu.Unlock()
		if _, err := server.Write(cmd); err != nil {
			return
		}
	}
}

// readCommand reads one RESP command (an array of bulk strings, or an
// inline command) and returns its bytes and its upper-case name.
func readCommand(r *bufio.Reader) (cmd []byte, name string, err error) {
	line, err := r.ReadBytes('\n')
	if err != nil {
		return nil, "", err
	}
	if len(line) == 0 || line[0] != '*' {
		f := strings.Fields(string(line))
		if len(f) > 0 {
			name = strings.ToUpper(f[0])
		}
		return line, name, nil
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(line[1:])))
	if err != nil {
		return nil, "", err
	}
	cmd = line
	for i := range n {
		hdr, err := r.ReadBytes('\n')
		if err != nil {
			return nil, "", err
		}
		size, err := strconv.Atoi(strings.TrimSpace(string(hdr[1:])))
		if err != nil || size < 0 {
			return nil, "", io.ErrUnexpectedEOF
		}
		body := make([]byte, size+2)
		if _, err := io.ReadFull(r, body); err != nil {
			return nil, "", err
		}
		if i == 0 {
			name = strings.ToUpper(string(body[:size]))
		}
		cmd = append(append(cmd, hdr...), body...)
	}
	return cmd, name, nil
}
