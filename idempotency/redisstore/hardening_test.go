package redisstore_test

import (
	"context"
	"crypto/rand"
	"net/http"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stormguard/stormguard/idempotency"
	"github.com/stormguard/stormguard/idempotency/redisstore"
	"github.com/stormguard/stormguard/idempotency/store"
	"github.com/stormguard/stormguard/idempotency/storetest"
	"github.com/stormguard/stormguard/internal/idemtest"
)

// proxied returns a store whose client reaches Redis through a TCP proxy
// the test controls, and the proxy. Its keys are deleted at cleanup,
// through a direct client.
func proxied(t *testing.T, opts redis.Options) (*redisstore.Store, *idemtest.TCPProxy) {
	t.Helper()
	direct, _ := client(t, 2)
	prefix := "stormguard-test:" + rand.Text() + ":"
	t.Cleanup(func() { deletePrefix(t, direct, prefix) })
	addr := storetest.ServiceAddress(t, addrEnv, "Redis", "127.0.0.1:6379")
	p, err := idemtest.NewTCPProxy(addr)
	if err != nil {
		t.Fatalf("NewTCPProxy: %v", err)
	}
	t.Cleanup(p.Close)
	opts.Addr = p.Addr()
	c := redis.NewClient(&opts)
	t.Cleanup(func() { c.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatalf("Redis through the proxy: %v", err)
	}
	s, err := redisstore.New(c, redisstore.Config{Prefix: prefix})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return s, p
}

// TestClaimResentAfterLostReply: go-redis sends the claim again after the
// connection dropped before the reply; the store must recognise its own
// lock and claim, not answer 409 to its own request.
func TestClaimResentAfterLostReply(t *testing.T) {
	s, p := proxied(t, redis.Options{})
	url := idemtest.Serve(t, s)
	p.CutReplyTo([]byte("$3\r\nset\r\n"))
	if code, body := idemtest.Post(t, url, idempotency.NewKey()); code != http.StatusCreated || body != idemtest.Charged {
		t.Fatalf("POST whose claim was resent: %d %q, want 201 \"charged\"", code, body)
	}
	if p.Cuts() != 1 {
		t.Fatalf("proxy cut %d replies, want 1 (the test did not test)", p.Cuts())
	}
}

// TestCompleteResentAfterLostReply: a completion resent after a lost
// reply finds its own record and succeeds.
func TestCompleteResentAfterLostReply(t *testing.T) {
	ctx := context.Background()
	s, p := proxied(t, redis.Options{})
	warm(t, s)
	k := testID("s", idempotency.NewKey())
	fp := store.NewFingerprint("POST", "/x", [32]byte{})
	res, err := s.Begin(ctx, k, fp, time.Minute)
	if err != nil || res.Outcome != store.Claimed {
		t.Fatalf("Begin = %v, %v", res.Outcome, err)
	}
	rec := store.Record{Status: 201, Body: []byte("charged")}
	p.CutReplyTo([]byte("$7\r\nevalsha\r\n"))
	if err := s.Complete(ctx, k, res.Owner, rec, time.Hour); err != nil {
		t.Fatalf("Complete resent after a lost reply: %v", err)
	}
	if p.Cuts() != 1 {
		t.Fatalf("proxy cut %d replies, want 1", p.Cuts())
	}
	if got, err := s.Begin(ctx, k, fp, time.Minute); err != nil || got.Outcome != store.Completed || string(got.Record.Body) != "charged" {
		t.Fatalf("Begin after Complete = %v %q, %v; want the record", got.Outcome, got.Record.Body, err)
	}
}

// TestBlackholedRedisAnswers503: Redis accepts the connection and never
// answers, and the client has no read timeout and ignores context
// deadlines: the middleware still answers 503 within its store timeout.
func TestBlackholedRedisAnswers503(t *testing.T) {
	s, p := proxied(t, redis.Options{ReadTimeout: -1, WriteTimeout: -1, MaxRetries: -1})
	url := idemtest.Serve(t, s)
	t.Cleanup(p.Close) // before the server's Close: ends the store call still waiting
	p.Blackhole(true)
	code, body := idemtest.Post(t, url, idempotency.NewKey())
	if code != http.StatusServiceUnavailable {
		t.Fatalf("POST with Redis blackholed: %d %q, want 503", code, body)
	}
}

func TestNewNilClient(t *testing.T) {
	var nilClient *redis.Client
	if _, err := redisstore.New(nilClient, redisstore.Config{}); err == nil {
		t.Fatal("New((*redis.Client)(nil)) = nil error")
	}
}

// TestCompletionBlip: Redis is unreachable (the proxy resets every
// connection) for 400 ms just as the handler's answer is stored: the answer
// is stored once it is back, and a retry after the lock timeout is a
// replay, not a second run.
func TestCompletionBlip(t *testing.T) {
	s, proxy := proxied(t, redis.Options{})
	idemtest.CompletionBlip(t, s, proxy.Refuse)
}

// TestSlowRenewal: with a short lock (1.5 s, renewed every 500 ms) and the
// default store timeout, Redis answers the first renewal 700 ms late (the
// proxy holds it): slower than the renewal period, before the lock's end.
// The lock is kept, the handler not canceled, and it runs once.
func TestSlowRenewal(t *testing.T) {
	s, proxy := proxied(t, redis.Options{})
	idemtest.SlowRenewal(t, s, proxy.Delay)
}
