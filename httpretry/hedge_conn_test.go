package httpretry_test

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stormguard/stormguard/httpretry"
	"github.com/stormguard/stormguard/retry"
	"github.com/stormguard/stormguard/wire"
)

// connCounter is a net.Listener that counts the connections it accepted
// and those still open (accepted, not yet closed by the server).
type connCounter struct {
	net.Listener
	accepted atomic.Int64
	open     atomic.Int64
}

func (l *connCounter) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	l.accepted.Add(1)
	l.open.Add(1)
	return &countedConn{Conn: c, open: &l.open}, nil
}

type countedConn struct {
	net.Conn
	open   *atomic.Int64
	closed atomic.Bool
}

func (c *countedConn) Close() error {
	if c.closed.CompareAndSwap(false, true) {
		c.open.Add(-1)
	}
	return c.Conn.Close()
}

// granter is a retry budget that grants every withdrawal: every race
// here gets its hedge.
type granter struct{}

func (granter) Deposit()       {}
func (granter) Withdraw() bool { return true }

// TestHedgeLosersLeakNoConnection races GETs on loopback, through a real
// http.Transport, against a server whose first copy of each request does
// not answer before its hedge: the loser is canceled (a handler that waits
// for its context to end returns, unless the cancel came before the
// request reached the server) or, when it answers after the winner, its
// body is closed.
// Once the races are over, the server's open connections are at most the
// client's idle ones, and none once the client closes its idle
// connections: no connection leaks. A first copy that answers before
// the delay reuses one connection throughout. Real time: the server is
// outside any synctest bubble; nothing here checks a delay.
func TestHedgeLosersLeakNoConnection(t *testing.T) {
	const races = 30
	tests := []struct {
		name string
		// first is what the first copy's handler does; release is
		// signaled when the hedge has answered.
		first        func(w http.ResponseWriter, r *http.Request, release <-chan struct{}) bool
		hedged       bool
		wantAccepted func(n int64) bool
	}{
		{"loser canceled in flight", func(w http.ResponseWriter, r *http.Request, _ <-chan struct{}) bool {
			<-r.Context().Done()
			return true
		}, true, func(n int64) bool { return n > 1 }},
		{"loser answers after the winner", func(w http.ResponseWriter, r *http.Request, release <-chan struct{}) bool {
			select {
			case <-r.Context().Done():
				return true
			case <-release:
				_, _ = io.WriteString(w, "first")
				return false
			}
		}, true, func(n int64) bool { return n >= 1 }},
		{"first copy answers before the delay", func(w http.ResponseWriter, r *http.Request, _ <-chan struct{}) bool {
			_, _ = io.WriteString(w, "first")
			return false
		}, false, func(n int64) bool { return n == 1 }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var release atomic.Pointer[chan struct{}] // one per race
			var canceled atomic.Int64
			srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.Header.Get(wire.AttemptHeader) == "" { // the first copy
					if tt.first(w, r, *release.Load()) {
						canceled.Add(1)
					}
					return
				}
				_, _ = io.WriteString(w, "hedge")
				w.(http.Flusher).Flush()
				select {
				case *release.Load() <- struct{}{}:
				default:
				}
			}))
			ln := &connCounter{Listener: srv.Listener}
			srv.Listener = ln
			srv.Start()
			defer srv.Close()
			base := &http.Transport{MaxIdleConnsPerHost: 4}
			defer base.CloseIdleConnections()
			delay := time.Millisecond
			if !tt.hedged {
				delay = time.Hour
			}
			want := "first"
			if tt.hedged {
				want = "hedge"
			}
			if tt.name == "loser answers after the winner" {
				want = "" // either may win: the answers cross
			}
			for i := range races {
				ch := make(chan struct{}, 1)
				release.Store(&ch)
				// A transport of its own per race, over the one base (whose
				// connections are counted): every race here reaches its
				// delay, which a transport's hedging counts as a stall
				// after 5 in a second, sending no more hedges.
				tr, err := httpretry.NewTransport(base, httpretry.WithHedging(delay, 0, 1),
					httpretry.WithGuards(func(string) (retry.Guards, error) { return retry.Guards{Budget: granter{}}, nil }))
				if err != nil {
					t.Fatal(err)
				}
				req, _ := http.NewRequestWithContext(context.Background(), http.MethodGet, srv.URL, nil)
				resp, err := tr.RoundTrip(req)
				if err != nil {
					t.Fatalf("race %d: %v", i, err)
				}
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if want != "" && string(b) != want || string(b) != "first" && string(b) != "hedge" {
					t.Fatalf("race %d: body %q, want %q", i, b, want)
				}
			}
			// The server closes a connection the client dropped when it
			// notices: wait for the count to settle (no delay is checked).
			waitFor(t, func() bool { return ln.open.Load() <= int64(base.MaxIdleConnsPerHost) })
			base.CloseIdleConnections()
			waitFor(t, func() bool { return ln.open.Load() == 0 })
			t.Logf("%d GETs: %d connections accepted, %d first copies canceled", races, ln.accepted.Load(), canceled.Load())
			if !tt.wantAccepted(ln.accepted.Load()) {
				t.Errorf("%d connections accepted", ln.accepted.Load())
			}
		})
	}
}

// waitFor polls cond until it holds, failing the test after 10 s.
func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	for end := time.Now().Add(10 * time.Second); !cond(); time.Sleep(time.Millisecond) {
		if time.Now().After(end) {
			t.Fatal("condition not met within 10 s")
		}
	}
}
