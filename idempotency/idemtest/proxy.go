package idemtest

import (
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/stormguard/stormguard/idempotency"
)

// ProxyConfig configures a [Proxy].
type ProxyConfig struct {
	// Upstreams are the base URLs ("http://127.0.0.1:port") of the servers
	// the proxy forwards to, in turn (round robin). At least one.
	Upstreams []string
	// ResetRate is the fraction of requests, from 0 to 1, whose client
	// connection is reset (RST) before anything is sent upstream: the
	// request never reaches a server. 0 means none.
	ResetRate float64
	// DropRate is the fraction of requests, from 0 to 1, forwarded and
	// answered upstream (the handler ran, the whole response was read)
	// whose response is then dropped: the client connection is reset
	// instead. 0 means none. ResetRate+DropRate must not exceed 1.
	DropRate float64
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
	// ResetFailures is the number of resets or drops the proxy could not
	// carry out (the connection could not be taken over); those requests
	// got 502 Bad Gateway. Always 0 on a working setup.
	ResetFailures int64
	// PerUpstream[i] is the number of requests forwarded to Upstreams[i].
	PerUpstream []int64
}

// Proxy is a lossy loopback HTTP/1.1 proxy in front of one or more
// upstream servers; see [ProxyConfig] for the faults it injects. It is
// safe for concurrent use. Close it when done.
type Proxy struct {
	srv       *httptest.Server
	upstreams []*url.URL
	transport *http.Transport
	resetRate float64
	dropRate  float64
	next      atomic.Uint64

	mu  sync.Mutex // guards rng
	rng *rand.Rand

	requests, resets, forwarded, upstreamErrors atomic.Int64
	drops, droppedOriginals                     atomic.Int64
	relayed, relayedReplays, relayedConflicts   atomic.Int64
	resetFailures                               atomic.Int64
	perUpstream                                 []atomic.Int64
}

// NewProxy starts a proxy on a loopback port. It fails when no upstream is
// given, an upstream is not an absolute http URL, or a rate is out of range.
func NewProxy(cfg ProxyConfig) (*Proxy, error) {
	if len(cfg.Upstreams) == 0 {
		return nil, errors.New("idemtest: NewProxy: no upstream")
	}
	if !(cfg.ResetRate >= 0 && cfg.DropRate >= 0 && cfg.ResetRate+cfg.DropRate <= 1) {
		return nil, fmt.Errorf("idemtest: NewProxy: reset rate %v and drop rate %v must be >= 0 with a sum <= 1", cfg.ResetRate, cfg.DropRate)
	}
	p := &Proxy{
		resetRate:   cfg.ResetRate,
		dropRate:    cfg.DropRate,
		rng:         rand.New(rand.NewPCG(cfg.Seed, 0x6964656d74657374)),
		perUpstream: make([]atomic.Int64, len(cfg.Upstreams)),
	}
	for _, s := range cfg.Upstreams {
		u, err := url.Parse(s)
		if err != nil || u.Scheme != "http" || u.Host == "" {
			return nil, fmt.Errorf("idemtest: NewProxy: upstream %q is not an absolute http URL", s)
		}
		p.upstreams = append(p.upstreams, u)
	}
	idle := cfg.MaxIdleConnsPerUpstream
	if idle <= 0 {
		idle = 64
	}
	p.transport = &http.Transport{
		Proxy:               nil,
		MaxIdleConnsPerHost: idle,
		DisableCompression:  true,
	}
	p.srv = httptest.NewServer(p)
	return p, nil
}

// URL returns the proxy's base URL, e.g. "http://127.0.0.1:41234".
func (p *Proxy) URL() string { return p.srv.URL }

// Close stops the proxy, waits for its requests to end and closes its
// upstream connections.
func (p *Proxy) Close() {
	p.srv.Close()
	p.transport.CloseIdleConnections()
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
		ResetFailures:    p.resetFailures.Load(),
		PerUpstream:      make([]int64, len(p.perUpstream)),
	}
	for i := range p.perUpstream {
		s.PerUpstream[i] = p.perUpstream[i].Load()
	}
	return s
}

type fault int

const (
	pass fault = iota
	resetBefore
	dropAfter
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
	}
	return pass
}

// hopHeaders are the hop-by-hop header fields (RFC 9110 section 7.6.1)
// not forwarded.
var hopHeaders = []string{
	"Connection", "Keep-Alive", "Proxy-Connection", "Proxy-Authenticate",
	"Proxy-Authorization", "Te", "Trailer", "Transfer-Encoding", "Upgrade",
}

// ServeHTTP handles one request: reset, or forward and then drop or relay.
func (p *Proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	p.requests.Add(1)
	f := p.draw()
	if f == resetBefore {
		p.resets.Add(1)
		p.reset(w)
		return
	}
	i := int((p.next.Add(1) - 1) % uint64(len(p.upstreams)))
	p.forwarded.Add(1)
	p.perUpstream[i].Add(1)
	status, header, body, err := p.forward(r, p.upstreams[i])
	if err != nil {
		p.upstreamErrors.Add(1)
		http.Error(w, "idemtest proxy: upstream: "+err.Error(), http.StatusBadGateway)
		return
	}
	replay := header.Get(idempotency.ReplayHeader) == "true"
	if f == dropAfter {
		p.drops.Add(1)
		if status/100 == 2 && !replay {
			p.droppedOriginals.Add(1)
		}
		p.reset(w)
		return
	}
	p.relayed.Add(1)
	if replay {
		p.relayedReplays.Add(1)
	}
	if status == http.StatusConflict {
		p.relayedConflicts.Add(1)
	}
	h := w.Header()
	for k, v := range header {
		h[k] = v
	}
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

// forward sends r to upstream u and reads the whole response.
func (p *Proxy) forward(r *http.Request, u *url.URL) (int, http.Header, []byte, error) {
	target := *u
	target.Path = strings.TrimSuffix(u.Path, "/") + r.URL.Path
	target.RawPath = ""
	target.RawQuery = r.URL.RawQuery
	out, err := http.NewRequestWithContext(r.Context(), r.Method, target.String(), r.Body)
	if err != nil {
		return 0, nil, nil, err
	}
	out.ContentLength = r.ContentLength
	if r.ContentLength == 0 {
		out.Body = http.NoBody
	}
	out.Header = r.Header.Clone()
	for _, k := range hopHeaders {
		delete(out.Header, k)
	}
	resp, err := p.transport.RoundTrip(out)
	if err != nil {
		return 0, nil, nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, nil, nil, err
	}
	for _, k := range hopHeaders {
		delete(resp.Header, k)
	}
	delete(resp.Header, "Content-Length") // the proxy's server sets its own
	return resp.StatusCode, resp.Header, body, nil
}

// reset takes the client connection over and closes it with a TCP RST
// (SO_LINGER 0), sending nothing: the client sees "connection reset by
// peer" (or EOF) and no response.
// If the connection cannot be taken over (not on this HTTP/1.1 server) it
// answers 502 instead and counts a reset failure, so that the statistics
// never claim a fault that did not happen.
func (p *Proxy) reset(w http.ResponseWriter) {
	conn, _, err := http.NewResponseController(w).Hijack()
	if err != nil {
		p.resetFailures.Add(1)
		http.Error(w, "idemtest proxy: cannot reset: "+err.Error(), http.StatusBadGateway)
		return
	}
	if tc, ok := conn.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	_ = conn.Close()
}
