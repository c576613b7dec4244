package idemtest

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"sync"
	"sync/atomic"

	"github.com/stormguard/stormguard/idempotency"
)

// ProxyConfig configures a [Proxy].
type ProxyConfig struct {
	// Upstreams are the base URLs ("http://127.0.0.1:port", no path) of
	// the servers the proxy forwards to, in turn (round robin). At least
	// one. A request keeps its target (path and query).
	Upstreams []string
	// ResetRate is the fraction of requests, from 0 to 1, whose client
	// connection is reset (RST) before anything is sent upstream: the
	// request never reaches a server. 0 means none.
	ResetRate float64
	// DropRate is the fraction of requests, from 0 to 1, forwarded and
	// answered upstream (the handler ran, the whole response was read)
	// whose response is then dropped: the client connection is reset
	// instead. 0 means none.
	DropRate float64
	// CutRate is the fraction of requests, from 0 to 1, forwarded on a
	// connection of their own whose response is cut mid-way: the proxy
	// reads the response head and at most 1 KiB of the body, then resets
	// both the upstream and the client connection. The server sees its
	// client go away while it answers; the client sees a reset. 0 means
	// none. ResetRate+DropRate+CutRate must not exceed 1.
	CutRate float64
	// Seed seeds the fault sequence (PCG, math/rand/v2): the n-th request
	// the proxy receives gets the n-th draw, so the same seed gives the same
	// sequence of faults. Which logical request is the n-th depends on
	// scheduling when clients send concurrently.
	Seed uint64
	// MaxIdleConnsPerUpstream bounds the idle keep-alive connections kept
	// to each upstream; 0 means 64.
	MaxIdleConnsPerUpstream int
}

// ProxyStats are the counts of a [Proxy] since it started.
type ProxyStats struct {
	// Requests is the number of requests the proxy received (attempts
	// that reached it, including those the client's net/http transport
	// resent on its own).
	Requests int64
	// Resets is the number of requests reset before forwarding.
	Resets int64
	// Forwarded is the number of requests sent upstream.
	Forwarded int64
	// UpstreamErrors is the number of forwarded requests that got no
	// complete upstream response; the client got 502 Bad Gateway.
	UpstreamErrors int64
	// Drops is the number of upstream responses dropped (client connection
	// reset after the handler ran).
	Drops int64
	// DroppedOriginals is the part of Drops that were 2xx answers of the
	// handler itself, not replays: each is a payment whose only "applied"
	// answer was lost, so its client can only learn of it by a replay.
	DroppedOriginals int64
	// Relayed is the number of upstream responses passed to the client.
	Relayed int64
	// RelayedReplays is the part of Relayed marked "Idempotent-Replayed".
	RelayedReplays int64
	// RelayedConflicts is the part of Relayed with status 409 Conflict.
	RelayedConflicts int64
	// Cuts is the number of responses cut mid-way (see
	// [ProxyConfig.CutRate]).
	Cuts int64
	// CutOriginals is the part of Cuts that were 2xx answers of the
	// handler itself, not replays.
	CutOriginals int64
	// PerUpstream[i] is the number of requests forwarded to Upstreams[i].
	PerUpstream []int64
}

// Proxy is a lossy loopback HTTP/1.1 proxy in front of one or more
// upstream servers; see [ProxyConfig] for the faults it injects. It works
// on raw TCP connections, one goroutine per client connection reading
// requests with [http.ReadRequest], so that a reset is a real TCP RST on
// the connection the client sent the request on. It keeps a pool of
// keep-alive connections to each upstream. It is safe for concurrent use.
// Close it when done.
type Proxy struct {
	ln        net.Listener
	upstreams []*upstream
	resetRate float64
	dropRate  float64
	cutRate   float64
	next      atomic.Uint64

	mu    sync.Mutex // guards rng
	rng   *rand.Rand
	conns connSet
	bufs  sync.Pool // of *connBufs, reused from one client connection to the next

	requests, resets, forwarded, upstreamErrors atomic.Int64
	drops, droppedOriginals                     atomic.Int64
	relayed, relayedReplays, relayedConflicts   atomic.Int64
	cuts, cutOriginals                          atomic.Int64
}

// upstream is one server behind the proxy and its idle connections.
type upstream struct {
	addr string // host:port
	idle chan *upConn
	sent atomic.Int64
}

// connBufs are the buffers of one client connection: its reader and
// writer and the buffer that holds each upstream answer before it is
// relayed (16 KiB answers in hostile runs: pooled, they are not allocated,
// grown and collected again for every request).
type connBufs struct {
	r    *bufio.Reader
	w    *bufio.Writer
	body bytes.Buffer
}

// upConn is a keep-alive connection to an upstream.
type upConn struct {
	conn net.Conn
	r    *bufio.Reader
	w    *bufio.Writer
}

// NewProxy starts a proxy on a loopback port. It fails when no upstream is
// given, an upstream is not an absolute http URL without a path, or a rate
// is out of range.
func NewProxy(cfg ProxyConfig) (*Proxy, error) {
	if len(cfg.Upstreams) == 0 {
		return nil, errors.New("idemtest: NewProxy: no upstream")
	}
	if !(cfg.ResetRate >= 0 && cfg.DropRate >= 0 && cfg.CutRate >= 0 && cfg.ResetRate+cfg.DropRate+cfg.CutRate <= 1) {
		return nil, fmt.Errorf("idemtest: NewProxy: reset rate %v, drop rate %v and cut rate %v must be >= 0 with a sum <= 1", cfg.ResetRate, cfg.DropRate, cfg.CutRate)
	}
	idle := cfg.MaxIdleConnsPerUpstream
	if idle <= 0 {
		idle = 64
	}
	p := &Proxy{
		resetRate: cfg.ResetRate,
		dropRate:  cfg.DropRate,
		cutRate:   cfg.CutRate,
		rng:       rand.New(rand.NewPCG(cfg.Seed, 0x6964656d74657374)),
	}
	for _, s := range cfg.Upstreams {
		u, err := url.Parse(s)
		if err != nil || u.Scheme != "http" || u.Host == "" || (u.Path != "" && u.Path != "/") {
			return nil, fmt.Errorf("idemtest: NewProxy: upstream %q is not an absolute http URL without a path", s)
		}
		p.upstreams = append(p.upstreams, &upstream{addr: u.Host, idle: make(chan *upConn, idle)})
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("idemtest: NewProxy: %w", err)
	}
	p.ln = ln
	p.conns.serve(ln, p.serve)
	return p, nil
}

// URL returns the proxy's base URL, e.g. "http://127.0.0.1:41234".
func (p *Proxy) URL() string { return "http://" + p.ln.Addr().String() }

// Close stops the proxy: it closes the listener and every client and
// upstream connection, and waits for its goroutines to end.
func (p *Proxy) Close() {
	p.conns.close(p.ln)
	for _, u := range p.upstreams {
	drain:
		for {
			select {
			case uc := <-u.idle:
				_ = uc.conn.Close()
			default:
				break drain
			}
		}
	}
}

// Stats returns the proxy's counts so far.
func (p *Proxy) Stats() ProxyStats {
	s := ProxyStats{
		Requests:         p.requests.Load(),
		Resets:           p.resets.Load(),
		Forwarded:        p.forwarded.Load(),
		UpstreamErrors:   p.upstreamErrors.Load(),
		Drops:            p.drops.Load(),
		DroppedOriginals: p.droppedOriginals.Load(),
		Relayed:          p.relayed.Load(),
		RelayedReplays:   p.relayedReplays.Load(),
		RelayedConflicts: p.relayedConflicts.Load(),
		Cuts:             p.cuts.Load(),
		CutOriginals:     p.cutOriginals.Load(),
		PerUpstream:      make([]int64, len(p.upstreams)),
	}
	for i, u := range p.upstreams {
		s.PerUpstream[i] = u.sent.Load()
	}
	return s
}

type fault int

const (
	pass fault = iota
	resetBefore
	dropAfter
	cutMidway
)

// draw returns the next fault of the seeded sequence.
func (p *Proxy) draw() fault {
	p.mu.Lock()
	x := p.rng.Float64()
	p.mu.Unlock()
	switch {
	case x < p.resetRate:
		return resetBefore
	case x < p.resetRate+p.dropRate:
		return dropAfter
	case x < p.resetRate+p.dropRate+p.cutRate:
		return cutMidway
	}
	return pass
}

// serve handles the requests of one client connection until it is
// closed or reset.
func (p *Proxy) serve(c net.Conn) {
	b, _ := p.bufs.Get().(*connBufs)
	if b == nil {
		b = &connBufs{r: bufio.NewReader(c), w: bufio.NewWriter(c)}
	} else {
		b.r.Reset(c)
		b.w.Reset(c)
	}
	defer func() {
		b.r.Reset(nil)
		b.w.Reset(nil)
		p.bufs.Put(b)
	}()
	r, w := b.r, b.w
	for {
		req, err := http.ReadRequest(r)
		if err != nil {
			return // EOF, or a client that went away
		}
		p.requests.Add(1)
		f := p.draw()
		if f == resetBefore {
			p.resets.Add(1)
			reset(c)
			return
		}
		body, err := io.ReadAll(req.Body)
		if err != nil {
			return
		}
		u := p.upstreams[(p.next.Add(1)-1)%uint64(len(p.upstreams))]
		p.forwarded.Add(1)
		u.sent.Add(1)
		if f == cutMidway {
			p.cut(u, req, body)
			reset(c)
			return
		}
		b.body.Reset()
		resp, err := p.forward(u, req, body, &b.body)
		respBody := b.body.Bytes()
		if err != nil {
			p.upstreamErrors.Add(1)
			msg := "idemtest proxy: upstream: " + err.Error()
			resp = &http.Response{
				StatusCode: http.StatusBadGateway, ProtoMajor: 1, ProtoMinor: 1,
				Header: http.Header{"Content-Type": {"text/plain; charset=utf-8"}},
			}
			respBody = []byte(msg)
		} else {
			replay := resp.Header.Get(idempotency.ReplayHeader) == "true"
			if f == dropAfter {
				p.drops.Add(1)
				if resp.StatusCode/100 == 2 && !replay {
					p.droppedOriginals.Add(1)
				}
				reset(c)
				return
			}
			p.relayed.Add(1)
			if replay {
				p.relayedReplays.Add(1)
			}
			if resp.StatusCode == http.StatusConflict {
				p.relayedConflicts.Add(1)
			}
		}
		resp.Body = io.NopCloser(bytes.NewReader(respBody))
		resp.ContentLength = int64(len(respBody))
		resp.TransferEncoding = nil
		resp.Close = req.Close
		resp.Request = req
		if err := resp.Write(w); err != nil || w.Flush() != nil || req.Close {
			return
		}
	}
}

// forward sends req with body to u over an idle or new connection and
// reads the whole response, its body into respBody.
func (p *Proxy) forward(u *upstream, req *http.Request, body []byte, respBody *bytes.Buffer) (*http.Response, error) {
	var uc *upConn
	select {
	case uc = <-u.idle:
	default:
		conn, err := net.Dial("tcp", u.addr)
		if err != nil {
			return nil, err
		}
		uc = &upConn{conn: conn, r: bufio.NewReader(conn), w: bufio.NewWriter(conn)}
	}
	out := outgoing(req, body)
	err := out.Write(uc.w)
	if err == nil {
		err = uc.w.Flush()
	}
	var resp *http.Response
	if err == nil {
		resp, err = http.ReadResponse(uc.r, out)
	}
	if err == nil {
		_, err = respBody.ReadFrom(resp.Body)
		_ = resp.Body.Close()
	}
	if err != nil {
		_ = uc.conn.Close()
		return nil, err
	}
	if resp.Close {
		_ = uc.conn.Close()
	} else {
		select {
		case u.idle <- uc:
		default:
			_ = uc.conn.Close()
		}
	}
	return resp, nil
}

// cut sends req with body to u on a new connection, reads the response
// head and at most 1 KiB of its body, and resets the connection.
func (p *Proxy) cut(u *upstream, req *http.Request, body []byte) {
	conn, err := net.Dial("tcp", u.addr)
	if err != nil {
		p.upstreamErrors.Add(1)
		return
	}
	defer reset(conn)
	out := outgoing(req, body)
	w := bufio.NewWriter(conn)
	err = out.Write(w)
	if err == nil {
		err = w.Flush()
	}
	var resp *http.Response
	if err == nil {
		resp, err = http.ReadResponse(bufio.NewReader(conn), out)
	}
	if err != nil {
		p.upstreamErrors.Add(1)
		return
	}
	_, _ = io.ReadFull(resp.Body, make([]byte, 1<<10)) // at most a part: short bodies end sooner
	p.cuts.Add(1)
	if resp.StatusCode/100 == 2 && resp.Header.Get(idempotency.ReplayHeader) != "true" {
		p.cutOriginals.Add(1)
	}
}

// outgoing returns the request to send upstream for req with body.
func outgoing(req *http.Request, body []byte) *http.Request {
	out := &http.Request{
		Method:        req.Method,
		URL:           req.URL,
		Host:          req.Host,
		Header:        req.Header,
		ContentLength: int64(len(body)),
		Body:          io.NopCloser(bytes.NewReader(body)),
	}
	for _, k := range hopHeaders {
		delete(out.Header, k)
	}
	if len(body) == 0 {
		out.Body = http.NoBody
	}
	return out
}

// hopHeaders are the hop-by-hop header fields (RFC 9110 section 7.6.1)
// not forwarded.
var hopHeaders = []string{
	"Connection", "Keep-Alive", "Proxy-Connection", "Proxy-Authenticate",
	"Proxy-Authorization", "Te", "Trailer", "Transfer-Encoding", "Upgrade",
}

// reset closes c with a TCP RST (SO_LINGER 0) after sending nothing more:
// the client sees "connection reset by peer" (or EOF) and no response.
func reset(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	_ = c.Close()
}
