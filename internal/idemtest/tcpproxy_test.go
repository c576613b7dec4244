package idemtest_test

import (
	"bufio"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/stormguard/stormguard/internal/idemtest"
)

// echoServer answers each line it reads with "echo: " and the line.
func echoServer(t *testing.T) string {
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
	p, err := idemtest.NewTCPProxy(echoServer(t))
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
