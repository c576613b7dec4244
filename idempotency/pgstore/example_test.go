package pgstore_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/stormguard/stormguard/idempotency"
	"github.com/stormguard/stormguard/idempotency/pgstore"
	"github.com/stormguard/stormguard/idempotency/storetest"
)

// Keys in PostgreSQL behind the idempotency middleware: a payment sent
// twice with one key runs its handler once; the second answer is the
// first, replayed.
//
// The example needs a PostgreSQL server, named by DATABASE_URL, so go test
// compiles it but does not run it (it has no Output comment);
// TestExample runs it on the test server when STORMGUARD_POSTGRES_URL is
// set.
func Example() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	keys, err := pgstore.New(pool, pgstore.Config{Table: "idempotency_keys"})
	if err != nil {
		panic(err)
	}
	if err := keys.Migrate(ctx); err != nil { // once, e.g. at deploy time
		panic(err)
	}
	// Run keys.DeleteExpired(ctx) every few minutes, from one server.
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
	t.Setenv("DATABASE_URL", storetest.ServiceAddress(t, urlEnv, "PostgreSQL", "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"))
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
