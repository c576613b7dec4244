package test

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stormguard/stormguard/idempotency"
)

// A replay through the real idempotency middleware: a new key, its replay
// and a mismatch are counted by outcome, each with one store duration.
func TestIdempotencyMiddleware(t *testing.T) {
	s := newSDK(t)
	store, err := idempotency.NewMemoryStore(idempotency.MemoryConfig{})
	if err != nil {
		t.Fatal(err)
	}
	mw, err := idempotency.NewMiddleware(store, idempotency.WithScope(func(*http.Request) (string, error) { return "shared", nil }),
		idempotency.WithObserver(s.obs), idempotency.WithName("orders"))
	if err != nil {
		t.Fatal(err)
	}
	h := mw(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusCreated) }))
	codes := []int{}
	for _, body := range []string{"a", "a", "b"} {
		req := httptest.NewRequest(http.MethodPost, "/orders", strings.NewReader(body))
		req.Header.Set(idempotency.Header, "k-1")
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		codes = append(codes, rec.Code)
	}
	if codes[0] != 201 || codes[1] != 201 || codes[2] != 422 {
		t.Fatalf("answers %v, want 201, 201 (replay), 422", codes)
	}
	got := s.series(t)
	for _, outcome := range []string{"new", "replay", "mismatch"} {
		name := "stormguard.idempotency.outcomes{stormguard.name=orders,stormguard.outcome=" + outcome + "}"
		if got[name] != 1 {
			t.Errorf("%s = %v, want 1", name, got[name])
		}
		dur := "stormguard.idempotency.store.duration{stormguard.name=orders,stormguard.outcome=" + outcome + "} count"
		if got[dur] != 1 {
			t.Errorf("%s = %v, want 1", dur, got[dur])
		}
	}
}
