package idempotency_test

import (
	"context"
	"crypto/sha256"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"

	"github.com/stormguard/stormguard/idempotency"
	"github.com/stormguard/stormguard/idempotency/store"
	"github.com/stormguard/stormguard/observe"
)

func ExampleNewKey() {
	// One key per logical operation, created before the first attempt and
	// sent unchanged with every retry.
	key := idempotency.NewKey()
	uuidV4 := regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`)
	fmt.Println(len(key), uuidV4.MatchString(key))

	req, _ := http.NewRequest(http.MethodPost, "https://pay.example/charges", strings.NewReader(`{"amount":100}`))
	req.Header.Set(idempotency.Header, key)
	fmt.Println(idempotency.Header, "set:", req.Header.Get("Idempotency-Key") == key)
	// Output:
	// 36 true
	// Idempotency-Key set: true
}

func ExampleNewMiddleware() {
	mem, err := idempotency.NewMemoryStore(idempotency.MemoryConfig{})
	if err != nil {
		log.Fatal(err)
	}
	mw, err := idempotency.NewMiddleware(mem,
		// The middleware runs after authentication; keys are per caller.
		idempotency.WithScope(func(r *http.Request) (string, error) {
			return r.Header.Get("X-Api-Key"), nil
		}),
	)
	if err != nil {
		log.Fatal(err)
	}
	charges := 0
	mux := http.NewServeMux()
	mux.Handle("POST /charges", mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		charges++
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"charge":%d}`, charges)
	})))
	srv := httptest.NewServer(mux)
	defer srv.Close()

	key := idempotency.NewKey()
	post := func(body string) {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/charges", strings.NewReader(body))
		req.Header.Set("X-Api-Key", "tenant-1")
		req.Header.Set(idempotency.Header, key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			log.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		fmt.Printf("%d replayed=%q %s\n", resp.StatusCode, resp.Header.Get(idempotency.ReplayHeader), strings.TrimSpace(string(b)))
	}
	post(`{"amount":100}`) // runs the handler
	post(`{"amount":100}`) // a retry: the stored response
	post(`{"amount":999}`) // the same key for another request
	fmt.Println("charges:", charges)
	// Output:
	// 201 replayed="" {"charge":1}
	// 201 replayed="true" {"charge":1}
	// 422 replayed="" {"type":"urn:stormguard:idempotency:key-reused","title":"Idempotency-Key reused","status":422,"detail":"This Idempotency-Key was used for a different request (method, route or body)."}
	// charges: 1
}

func ExampleParseKey() {
	for _, v := range []string{`"8e03978e-40d5-43e8-bc93-6894a57f9324"`, "8e03978e-40d5-43e8-bc93-6894a57f9324", "two, keys"} {
		k, err := idempotency.ParseKey(v)
		fmt.Printf("%q %v\n", k, err)
	}
	// Output:
	// "8e03978e-40d5-43e8-bc93-6894a57f9324" <nil>
	// "8e03978e-40d5-43e8-bc93-6894a57f9324" <nil>
	// "" idempotency: invalid key: comma in a bare key (more than one value?); quote the key as a structured-field string
}

func ExampleNewGuard() {
	// The core without HTTP: here, a consumer of queue messages that may
	// be delivered more than once, each carrying its sender and an
	// idempotency key.
	mem, err := idempotency.NewMemoryStore(idempotency.MemoryConfig{})
	if err != nil {
		log.Fatal(err)
	}
	g, err := idempotency.NewGuard(mem)
	if err != nil {
		log.Fatal(err)
	}
	shipped := 0
	deliver := func(sender, key, order string) {
		fp := store.NewFingerprint("ship", "orders", sha256.Sum256([]byte(order)))
		outcome, rec, err := g.Run(context.Background(), sender, key, fp, func(ctx context.Context) (store.Record, bool) {
			shipped++
			return store.Record{Status: 200, Body: fmt.Appendf(nil, "parcel %d", shipped)}, true
		})
		fmt.Printf("%v %q %v\n", outcome, rec.Body, err)
	}
	deliver("shop-1", "m-1", "2 books") // runs
	deliver("shop-1", "m-1", "2 books") // delivered again: the stored record
	deliver("shop-1", "m-1", "3 books") // the same key for another order
	fmt.Println("shipped:", shipped)
	// Output:
	// claimed "parcel 1" <nil>
	// completed "parcel 1" <nil>
	// mismatch "" <nil>
	// shipped: 1
}

func ExampleWithObserver() {
	mem, err := idempotency.NewMemoryStore(idempotency.MemoryConfig{})
	if err != nil {
		log.Fatal(err)
	}
	// otelstormguard.NewObserver turns these events into the metric
	// stormguard.idempotency.outcomes; here they are printed.
	obs := observe.Func(func(_ context.Context, e observe.Event) {
		fmt.Printf("%s name=%s outcome=%s err=%v\n", e.Kind, e.Name, e.Outcome, e.Err)
	})
	mw, err := idempotency.NewMiddleware(mem, idempotency.WithScope(func(*http.Request) (string, error) { return "shared", nil }),
		idempotency.WithObserver(obs), idempotency.WithName("charges"))
	if err != nil {
		log.Fatal(err)
	}
	h := mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
	}))
	for _, k := range []string{"", "k-1", "k-1", "bad\x7fkey"} {
		req := httptest.NewRequest(http.MethodPost, "/charges", strings.NewReader(`{"amount":100}`))
		if k != "" {
			req.Header.Set(idempotency.Header, k)
		}
		h.ServeHTTP(httptest.NewRecorder(), req)
	}
	// Output:
	// idempotency name=charges outcome=new err=<nil>
	// idempotency name=charges outcome=replay err=<nil>
	// idempotency name=charges outcome=invalid err=<nil>
}
