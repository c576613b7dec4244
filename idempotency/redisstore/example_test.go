package redisstore_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/stormguard/stormguard/idempotency"
	"github.com/stormguard/stormguard/idempotency/redisstore"
	"github.com/stormguard/stormguard/idempotency/storetest"
)

// Keys in Redis behind the idempotency middleware: a payment sent
// twice with one key runs its handler once; the second answer is the
// first, replayed.
//
// The example needs a Redis server, at REDIS_ADDR, so go test compiles it
// but does not run it (it has no Output comment); TestExample runs it on
// the test server when STORMGUARD_REDIS_ADDR is set.
func Example() {
	client := redis.NewClient(&redis.Options{Addr: os.Getenv("REDIS_ADDR"), ContextTimeoutEnabled: true}) // or a *redis.ClusterClient
	defer client.Close()
	// Keys expire by Redis's own TTLs: nothing to migrate or clean up.
	keys, err := redisstore.New(client, redisstore.Config{Prefix: "payments:idempotency:"})
	if err != nil {
		panic(err)
	}
	mw, err := idempotency.NewMiddleware(keys,
		idempotency.WithScope(func(r *http.Request) (string, error) { return r.Header.Get("X-Merchant"), nil }))
	if err != nil {
		panic(err)
	}
	charges := 0
	payments := mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		charges++
		w.WriteHeader(http.StatusCreated)
	}))

	key := idempotency.NewKey()
	for range 2 {
		req := httptest.NewRequest(http.MethodPost, "/payments", strings.NewReader(`{"amount":12}`))
		req.Header.Set(idempotency.Header, key)
		req.Header.Set("X-Merchant", "m-42")
		rec := httptest.NewRecorder()
		payments.ServeHTTP(rec, req)
		fmt.Println(rec.Code, "replayed:", rec.Header().Get("Idempotent-Replayed") == "true")
	}
	fmt.Println("charges:", charges)
	// With a server, it prints:
	// 201 replayed: false
	// 201 replayed: true
	// charges: 1
}

// TestExample runs Example on the test server and checks what it prints.
func TestExample(t *testing.T) {
	t.Setenv("REDIS_ADDR", storetest.ServiceAddress(t, addrEnv, "Redis", "127.0.0.1:6379"))
	if got, want := stdout(t, Example), "201 replayed: false\n201 replayed: true\ncharges: 1\n"; got != want {
		t.Errorf("Example printed\n%s\nwant\n%s", got, want)
	}
}

// stdout returns what f writes to os.Stdout.
func stdout(t *testing.T, f func()) string {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	saved := os.Stdout
	os.Stdout = w
	defer func() { os.Stdout = saved }()
	done := make(chan string)
	go func() {
		b, _ := io.ReadAll(r)
		done <- string(b)
	}()
	f()
	w.Close()
	return <-done
}
