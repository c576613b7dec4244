package store_test

import (
	"crypto/sha256"
	"testing"

	"github.com/stormguard/stormguard/idempotency/store"
)

// TestFingerprintParts: moving bytes between method and route, or changing
// the body, changes the fingerprint.
func TestFingerprintParts(t *testing.T) {
	body := sha256.Sum256([]byte("body"))
	a := store.NewFingerprint("POST", "/ab", body)
	for _, other := range []store.Fingerprint{
		store.NewFingerprint("POST/", "ab", body),
		store.NewFingerprint("POS", "T/ab", body),
		store.NewFingerprint("POST", "/ab", sha256.Sum256([]byte("other"))),
		store.NewFingerprint("PUT", "/ab", body),
	} {
		if other == a {
			t.Fatalf("NewFingerprint: two different requests share fingerprint %x", a)
		}
	}
	if store.NewFingerprint("POST", "/ab", body) != a {
		t.Fatal("NewFingerprint is not deterministic")
	}
}

// TestNewOwner: owners are never zero and never repeat (over a few
// thousand draws).
func TestNewOwner(t *testing.T) {
	seen := map[store.Owner]bool{}
	for range 4096 {
		o := store.NewOwner()
		if o == (store.Owner{}) || seen[o] {
			t.Fatalf("NewOwner() = %x: zero or repeated", o)
		}
		seen[o] = true
	}
}
