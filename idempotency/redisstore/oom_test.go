package redisstore_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stormguard/stormguard/idempotency"
	"github.com/stormguard/stormguard/idempotency/redisstore"
)

// TestOutOfMemoryWhileStoring: a Redis of its own fills up (maxmemory,
// noeviction) while a handler runs, so that the store has no room for its
// answer, not even for the status alone, and has room again 150 ms later,
// well within the lock timeout. The Guard keeps trying the status with the
// lock held: a retry is a replay (without the body), and the handler runs
// once. It ran twice when no room for the status was taken as final.
func TestOutOfMemoryWhileStoring(t *testing.T) {
	c := ownRedis(t, "--maxmemory-policy", "noeviction")
	ctx := context.Background()
	s, err := redisstore.New(c, redisstore.Config{Prefix: "oom:"})
	if err != nil {
		t.Fatal(err)
	}
	mw, err := idempotency.NewMiddleware(s, idempotency.WithScope(func(*http.Request) (string, error) { return "tenant", nil }), idempotency.WithLockTimeout(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	// Room for the claim and its renewals, none for anything new: filler
	// over a maxmemory below what Redis holds.
	if err := c.Set(ctx, "filler", strings.Repeat("x", 4<<20), 0).Err(); err != nil {
		t.Fatal(err)
	}
	var runs atomic.Int32
	h := mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		if err := c.ConfigSet(ctx, "maxmemory", "1mb").Err(); err != nil {
			t.Error(err)
		}
		time.AfterFunc(150*time.Millisecond, func() { c.ConfigSet(ctx, "maxmemory", "0") })
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, strings.Repeat("B", 1<<20))
	}))
	do := func() *httptest.ResponseRecorder {
		req := httptest.NewRequest(http.MethodPost, "/payments", strings.NewReader("pay"))
		req.Header.Set(idempotency.Header, "oom-key")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		return w
	}
	if first := do(); first.Code != http.StatusCreated {
		t.Fatalf("first request: %d, want 201", first.Code)
	}
	retry := do()
	if n := runs.Load(); n != 1 {
		t.Errorf("the handler ran %d times, want once", n)
	}
	if retry.Code != http.StatusCreated || retry.Header().Get(idempotency.ReplayHeader) == "" {
		t.Errorf("retry: %d, %s %q; want the 201 replayed", retry.Code, idempotency.ReplayHeader, retry.Header().Get(idempotency.ReplayHeader))
	}
}

// ownRedis starts a redis-server of the test's own on a free loopback
// port, without persistence, with args added to its command line, and
// returns a client of it (ContextTimeoutEnabled) once it answers. Both are
// stopped at cleanup.
func ownRedis(t *testing.T, args ...string) *redis.Client {
	t.Helper()
	serverPath, _ := lookTools(t)
	port := freePort(t)
	addr := "127.0.0.1:" + strconv.Itoa(port)
	expectRefusedDials(addr)
	cmd := exec.Command(serverPath, append([]string{"--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
		"--daemonize", "no", "--loglevel", "warning"}, args...)...)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { kill(cmd) })
	c := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true})
	t.Cleanup(func() { c.Close() })
	if !eventually(10*time.Second, func() bool { return c.Ping(context.Background()).Err() == nil }) {
		t.Fatalf("redis-server on %s did not answer within 10s", addr)
	}
	return c
}
