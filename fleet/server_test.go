package fleet

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/budget"
)

// redisServer is a redis-server the test started, on its own port.
type redisServer struct {
	t    *testing.T
	port int
	cmd  *exec.Cmd
}

// freePort returns a TCP port nothing listens on now.
func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// lookTool returns the path of the program name, skipping t if it is not
// installed (failing it if STORMGUARD_REQUIRE_SERVICES=1).
func lookTool(t *testing.T, name string) string {
	t.Helper()
	path, err := exec.LookPath(name)
	if err != nil {
		if os.Getenv("STORMGUARD_REQUIRE_SERVICES") == "1" {
			t.Fatalf("%s not installed and STORMGUARD_REQUIRE_SERVICES=1: %v", name, err)
		}
		t.Skipf("%s not installed: %v", name, err)
	}
	return path
}

// startRedisServer starts redis-server on port (no persistence, and the
// extra arguments) and waits until it answers; it is killed when t ends.
func startRedisServer(t *testing.T, port int, extra ...string) *redisServer {
	t.Helper()
	s, err := tryRedisServer(t, port, extra...)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// tryRedisServer is startRedisServer returning an error, with what the
// server wrote, when it does not answer within 5 s (it is killed then): a
// port taken by another socket between freePort and the server's bind
// ends the server at once, and a caller that chose the ports may choose
// again.
func tryRedisServer(t *testing.T, port int, extra ...string) (*redisServer, error) {
	t.Helper()
	path := lookTool(t, "redis-server")
	cmd := exec.Command(path, append([]string{"--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "",
		"--appendonly", "no", "--daemonize", "no", "--loglevel", "warning"}, extra...)...)
	out := &lockedBuffer{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	s := &redisServer{t: t, port: port, cmd: cmd}
	t.Cleanup(s.kill)
	expectRefusedDials(s.addr()) // the test may kill it
	c := redis.NewClient(&redis.Options{Addr: s.addr()})
	defer c.Close()
	if !eventually(5*time.Second, func() bool { return c.Ping(context.Background()).Err() == nil }) {
		s.kill()
		return nil, fmt.Errorf("redis-server on port %d did not answer within 5s; it wrote: %q", port, out.String())
	}
	return s, nil
}

// lockedBuffer is a bytes.Buffer safe for a writer and a reader at once.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func (s *redisServer) addr() string { return "127.0.0.1:" + strconv.Itoa(s.port) }

// kill kills the server at once (SIGKILL) and waits for it.
func (s *redisServer) kill() {
	if s.cmd.ProcessState != nil {
		return
	}
	_ = s.cmd.Process.Kill()
	_ = s.cmd.Wait()
}

// TestRedisServerKilled starts its own redis-server and kills it mid-run,
// then starts it again: callers see no error caused by Redis, the local
// budget holds during the outage, and the fleet returns to fleet mode
// within a few sync intervals of the server being back.
func TestRedisServerKilled(t *testing.T) {
	redisAddr(t) // the same skip-or-require rule as every Redis test
	port := freePort(t)
	srv := startRedisServer(t, port)
	const every = 20 * time.Millisecond
	cfg := Config{Name: uniqueName(t), SyncEvery: every, Timeout: 100 * time.Millisecond,
		LocalBudget: budget.Config{Ratio: 0.1, MinPerSecond: 1, Window: 10 * time.Second},
		MinCalls:    1_000_000, Breaker: breaker.Config{MinCalls: 1_000_000}}
	f, err := New(newClient(t, srv.addr()), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if f.Mode() != ModeFleet {
		t.Fatalf("mode %v with the server up", f.Mode())
	}
	good := startWorkload(newPolicy(t, f, "api"), 4, ok)
	time.Sleep(10 * every)

	srv.kill()
	if !eventually(2*time.Second, func() bool { return f.Mode() == ModeLocal }) {
		t.Fatal("still in fleet mode 2s after the server was killed")
	}
	bad := startWorkload(newPolicy(t, f, "flaky"), 2, fail)
	time.Sleep(20 * every)
	bad.end()
	retries := bad.attempts.Load() - bad.calls.Load()
	if limit := 0.1*float64(bad.calls.Load()) + 10; float64(retries) > limit {
		t.Errorf("%d retries for %d failing calls with Redis dead, over the local budget's %.1f", retries, bad.calls.Load(), limit)
	}
	if len(bad.badErrs) > 0 {
		t.Errorf("a failing call ended with %v, not the dependency's error", bad.badErrs[0])
	}
	if f.Mode() != ModeLocal {
		t.Errorf("mode %v with the server dead", f.Mode())
	}

	restart := time.Now()
	startRedisServer(t, port)
	back := time.Now() // the server answers

	if !eventually(5*time.Second, func() bool { return f.Mode() == ModeFleet }) {
		t.Fatalf("still local 5s after the server came back: %+v", f.stats())
	}
	took := time.Since(back)
	time.Sleep(10 * every)
	good.end()
	s := f.stats()
	t.Logf("server answering %v after its restart began; fleet mode back %v later (%.1f sync intervals); %d successful calls, %d errors; %d failing calls made %d retries in local mode; stats %+v",
		back.Sub(restart), took, float64(took)/float64(every), good.calls.Load(), good.errs.Load(), bad.calls.Load(), retries, s)
	if took > 10*every {
		t.Errorf("fleet mode came back after %v, more than 10 sync intervals", took)
	}
	if good.errs.Load() != 0 {
		t.Errorf("%d successful calls returned an error: %v", good.errs.Load(), good.badErrs)
	}
	if s.LeaseCalls != 0 || s.ProbeCalls != 0 {
		t.Errorf("round trips on callers' paths: %+v", s)
	}
	if f.Mode() != ModeFleet {
		t.Errorf("mode %v at the end", f.Mode())
	}
}
