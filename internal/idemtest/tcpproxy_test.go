package idemtest_test

import (
	"bufio"
	"math"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stormguard/stormguard/internal/idemtest"
)

// echoServer answers each line it reads with "echo: " and the line, and
// counts the lines in n (if not nil) before it answers.
func echoServer(t *testing.T, n *atomic.Int64) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				r := bufio.NewReader(c)
				for {
					line, err := r.ReadString('\n')
					if err != nil {
						return
					}
					if n != nil {
						n.Add(1)
					}
					if _, err := c.Write([]byte("echo: " + line)); err != nil {
						return
					}
				}
			}()
		}
	}()
	return ln.Addr().String()
}

// exchange sends line and reads one line back, waiting at most wait (the
// black hole check needs a bound: "no answer" is a read that times out).
func exchange(t *testing.T, c net.Conn, r *bufio.Reader, line string, wait time.Duration) (string, error) {
	t.Helper()
	if _, err := c.Write([]byte(line + "\n")); err != nil {
		return "", err
	}
	_ = c.SetReadDeadline(time.Now().Add(wait))
	got, err := r.ReadString('\n')
	return strings.TrimSuffix(got, "\n"), err
}

func TestTCPProxy(t *testing.T) {
	p, err := idemtest.NewTCPProxy(echoServer(t, nil))
	if err != nil {
		t.Fatalf("NewTCPProxy: %v", err)
	}
	defer p.Close()
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	r := bufio.NewReader(c)
	if got, err := exchange(t, c, r, "one", 10*time.Second); err != nil || got != "echo: one" {
		t.Fatalf("relay: %q, %v; want \"echo: one\"", got, err)
	}
	p.Blackhole(true)
	if got, err := exchange(t, c, r, "two", 200*time.Millisecond); err == nil {
		t.Fatalf("black hole: got %q, want no answer", got)
	}
	p.Blackhole(false)
	if got, err := exchange(t, c, r, "three", 10*time.Second); err != nil || got != "echo: three" {
		t.Fatalf("after the black hole: %q, %v; want \"echo: three\" (\"two\" stays lost)", got, err)
	}
	p.CutReplyTo([]byte("four"))
	if got, err := exchange(t, c, r, "four", 10*time.Second); err == nil {
		t.Fatalf("cut: got %q, want a reset", got)
	}
	if n := p.Cuts(); n != 1 {
		t.Fatalf("Cuts() = %d, want 1", n)
	}
	// A new connection relays again: the cut was one-shot.
	c2, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	if got, err := exchange(t, c2, bufio.NewReader(c2), "four", 10*time.Second); err != nil || got != "echo: four" {
		t.Fatalf("after the cut: %q, %v; want \"echo: four\"", got, err)
	}
}

func TestNewTCPProxyError(t *testing.T) {
	if _, err := idemtest.NewTCPProxy(""); err == nil {
		t.Fatal("NewTCPProxy(\"\") = nil error")
	}
}

// TestTCPProxyFaults: a reset drops what the client sent before the
// server sees it; a cut lets the server act on it and drops its reply;
// the rates are those asked for; the zero TCPFaults turns them off.
func TestTCPProxyFaults(t *testing.T) {
	var lines atomic.Int64
	p, err := idemtest.NewTCPProxy(echoServer(t, &lines))
	if err != nil {
		t.Fatalf("NewTCPProxy: %v", err)
	}
	defer p.Close()
	dial := func() (net.Conn, *bufio.Reader) {
		c, err := net.Dial("tcp", p.Addr())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c, bufio.NewReader(c)
	}
	for _, f := range []idemtest.TCPFaults{{ResetRate: -0.1}, {CutRate: 1.1}, {ResetRate: 0.6, CutRate: 0.6}} {
		if err := p.SetFaults(f); err == nil {
			t.Errorf("SetFaults(%+v) = nil, want an error", f)
		}
	}

	if err := p.SetFaults(idemtest.TCPFaults{ResetRate: 1}); err != nil {
		t.Fatal(err)
	}
	c, r := dial()
	if got, err := exchange(t, c, r, "reset", 10*time.Second); err == nil {
		t.Fatalf("reset: got %q, want an error", got)
	}
	if err := p.SetFaults(idemtest.TCPFaults{CutRate: 1}); err != nil {
		t.Fatal(err)
	}
	c, r = dial()
	if got, err := exchange(t, c, r, "cut", 10*time.Second); err == nil {
		t.Fatalf("cut: got %q, want an error", got)
	}
	if n := lines.Load(); n != 1 { // the server echoed before its reply was cut
		t.Fatalf("server read %d lines after a reset and a cut, want 1 (the cut one)", n)
	}
	if p.Resets() != 1 || p.Cuts() != 1 || p.Chunks() != 2 {
		t.Fatalf("Resets %d, Cuts %d, Chunks %d; want 1, 1, 2", p.Resets(), p.Cuts(), p.Chunks())
	}

	// The rates: over 2,000 one-line exchanges, 10% reset and 20% cut,
	// each on a connection of its own (a fault closes it).
	if err := p.SetFaults(idemtest.TCPFaults{ResetRate: 0.1, CutRate: 0.2, Seed: 7}); err != nil {
		t.Fatal(err)
	}
	const n = 2000
	failed := 0
	for range n {
		c, r := dial()
		if _, err := exchange(t, c, r, "x", 10*time.Second); err != nil {
			failed++
		}
		c.Close()
	}
	resets, cuts := p.Resets()-1, p.Cuts()-1
	for _, x := range []struct {
		what string
		got  int64
		rate float64
	}{{"resets", resets, 0.1}, {"cuts", cuts, 0.2}} {
		if tol := 5 * math.Sqrt(x.rate*(1-x.rate)/n); math.Abs(float64(x.got)/n-x.rate) > tol {
			t.Errorf("%s: %d of %d, want %.2f ± %.3f", x.what, x.got, n, x.rate, tol)
		}
	}
	if int64(failed) != resets+cuts {
		t.Errorf("%d exchanges failed, want the %d resets and cuts", failed, resets+cuts)
	}

	if err := p.SetFaults(idemtest.TCPFaults{}); err != nil {
		t.Fatal(err)
	}
	c, r = dial()
	if got, err := exchange(t, c, r, "clean", 10*time.Second); err != nil || got != "echo: clean" {
		t.Fatalf("faults off: %q, %v; want \"echo: clean\"", got, err)
	}
}

// TestTCPProxyRefuseAndDelay: Refuse resets a connection that sends
// while it is on, and the server answers again once it is off; Delay
// holds what a client sends at least that long.
func TestTCPProxyRefuseAndDelay(t *testing.T) {
	var lines atomic.Int64
	p, err := idemtest.NewTCPProxy(echoServer(t, &lines))
	if err != nil {
		t.Fatalf("NewTCPProxy: %v", err)
	}
	defer p.Close()
	dial := func() (net.Conn, *bufio.Reader) {
		t.Helper()
		c, err := net.Dial("tcp", p.Addr())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c, bufio.NewReader(c)
	}
	c, r := dial()
	p.Refuse(true)
	if got, err := exchange(t, c, r, "one", 10*time.Second); err == nil || lines.Load() != 0 {
		t.Fatalf("Refuse(true): got %q, %v, the server saw %d lines; want a reset and nothing relayed", got, err, lines.Load())
	}
	p.Refuse(false)
	c, r = dial()
	if got, err := exchange(t, c, r, "two", 10*time.Second); err != nil || got != "echo: two" {
		t.Fatalf("Refuse(false): %q, %v; want \"echo: two\"", got, err)
	}
	const d = 100 * time.Millisecond
	p.Delay(d)
	start := time.Now()
	if got, err := exchange(t, c, r, "three", 10*time.Second); err != nil || got != "echo: three" || time.Since(start) < d {
		t.Fatalf("Delay(%v): %q, %v after %v; want \"echo: three\" after at least %v", d, got, err, time.Since(start), d)
	}
	if p.Resets() != 0 {
		t.Errorf("Resets() = %d after refusals, want 0 (it counts the random faults)", p.Resets())
	}
}
