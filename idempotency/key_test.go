package idempotency_test

import (
	"crypto/sha256"
	"errors"
	"regexp"
	"strings"
	"sync"
	"testing"

	"github.com/stormguard/stormguard/idempotency"
)

var uuidV4 = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`)

func TestNewKey(t *testing.T) {
	seen := make(map[string]bool)
	var mu sync.Mutex
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 500 {
				k := idempotency.NewKey()
				if !uuidV4.MatchString(k) {
					t.Errorf("NewKey() = %q, want a lower-case UUIDv4", k)
				}
				if got, err := idempotency.ParseKey(k); err != nil || got != k {
					t.Errorf("ParseKey(NewKey() %q) = %q, %v", k, got, err)
				}
				mu.Lock()
				if seen[k] {
					t.Errorf("NewKey() = %q twice", k)
				}
				seen[k] = true
				mu.Unlock()
			}
		})
	}
	wg.Wait()
}

func TestParseKey(t *testing.T) {
	long := strings.Repeat("a", idempotency.MaxKeyLen)
	tests := []struct {
		in, want string
		ok       bool
	}{
		{"abc", "abc", true},
		{"  abc\t", "abc", true},
		{`"abc"`, "abc", true},
		{` "abc" `, "abc", true},
		{`"a b"`, "a b", true},
		{"a b", "a b", true},
		{`"a,b"`, "a,b", true},
		{`"a\"b\\c"`, `a"b\c`, true},
		{`"\\"`, `\`, true},
		{long, long, true},
		{`"` + long + `"`, long, true},
		{`"` + strings.Repeat(`\"`, idempotency.MaxKeyLen) + `"`, strings.Repeat(`"`, idempotency.MaxKeyLen), true},
		{"~!@#$%^&*()", "~!@#$%^&*()", true},
		{"", "", false},
		{"   ", "", false},
		{`""`, "", false},
		{long + "a", "", false},
		{`"` + long + `a"`, "", false},
		{"a,b", "", false},
		{"é", "", false},
		{"a\x7fb", "", false},
		{"a\x00b", "", false},
		{"a\nb", "", false},
		{`"abc`, "", false},
		{`"abc\"`, "", false},
		{`"a\b"`, "", false},
		{`"abc";p=1`, "", false},
		{`"a", "b"`, "", false},
		{`"a"b"`, "", false},
		{`"é"`, "", false},
		{"\"a\tb\"", "", false},
	}
	for _, tc := range tests {
		got, err := idempotency.ParseKey(tc.in)
		if tc.ok && (err != nil || got != tc.want) {
			t.Errorf("ParseKey(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
		}
		if !tc.ok && (err == nil || !errors.Is(err, idempotency.ErrInvalidKey)) {
			t.Errorf("ParseKey(%q) = %q, %v; want an error wrapping ErrInvalidKey", tc.in, got, err)
		}
	}
}

func TestFormatKeyRoundTrip(t *testing.T) {
	for _, k := range []string{"abc", `a"b`, `a\b`, `\"\\`, "a,b", "a b", idempotency.NewKey()} {
		f := idempotency.FormatKey(k)
		if got, err := idempotency.ParseKey(f); err != nil || got != k {
			t.Errorf("ParseKey(FormatKey(%q) = %s) = %q, %v; want %q", k, f, got, err, k)
		}
	}
	if got := idempotency.FormatKey(`a"b`); got != `"a\"b"` {
		t.Errorf(`FormatKey(a"b) = %s, want "a\"b"`, got)
	}
}

func TestHashKeySeparatesScopes(t *testing.T) {
	pairs := [][2][2]string{
		{{"alice", "k"}, {"bob", "k"}},
		{{"ab", "c"}, {"a", "bc"}},
		{{"", "ab"}, {"a", "b"}},
	}
	for _, p := range pairs {
		if idempotency.HashKey(p[0][0], p[0][1]) == idempotency.HashKey(p[1][0], p[1][1]) {
			t.Errorf("HashKey%q == HashKey%q", p[0], p[1])
		}
	}
	// Known answer: 8 bytes of the SHA-256 of a domain tag and the scope,
	// then 24 of the SHA-256 of another tag, the scope's length, the scope
	// and the raw key. Stored keys depend on it: it must never change.
	scope := sha256.Sum256([]byte("stormguard-idempotency-scope\x00alice"))
	key := sha256.Sum256([]byte("stormguard-idempotency-key\x00\x05alicek-1"))
	var want idempotency.Key
	copy(want[:8], scope[:])
	copy(want[8:], key[:])
	if got := idempotency.HashKey("alice", "k-1"); got != want {
		t.Errorf("HashKey(alice, k-1) = %v, want %v", got, want)
	}
	if a, b := idempotency.HashKey("alice", "k-1"), idempotency.HashKey("alice", "k-2"); a.Scope() != b.Scope() || a == b {
		t.Errorf("two keys of alice: Scope() %x and %x, want equal (keys %v, %v differ)", a.Scope(), b.Scope(), a, b)
	}
	if a, b := idempotency.HashKey("alice", "k"), idempotency.HashKey("bob", "k"); a.Scope() == b.Scope() {
		t.Errorf("keys of alice and bob: same Scope() %x", a.Scope())
	}
	if s := idempotency.HashKey("alice", "secret-key").String(); strings.Contains(s, "secret") || len(s) != 64 {
		t.Errorf("HashKey(...).String() = %q, want 64 hex digits", s)
	}
}

func TestFingerprintParts(t *testing.T) {
	base := idempotency.NewFingerprint("POST", "/a", [32]byte{1})
	for name, fp := range map[string]idempotency.Fingerprint{
		"method": idempotency.NewFingerprint("PATCH", "/a", [32]byte{1}),
		"route":  idempotency.NewFingerprint("POST", "/b", [32]byte{1}),
		"body":   idempotency.NewFingerprint("POST", "/a", [32]byte{2}),
		"split":  idempotency.NewFingerprint("POST/", "a", [32]byte{1}),
	} {
		if fp == base {
			t.Errorf("fingerprint with another %s equals the base one", name)
		}
	}
	if base != idempotency.NewFingerprint("POST", "/a", [32]byte{1}) {
		t.Error("NewFingerprint is not deterministic")
	}
}

func TestNewOwner(t *testing.T) {
	a, b := idempotency.NewOwner(), idempotency.NewOwner()
	if a == b || a == (idempotency.Owner{}) {
		t.Fatalf("NewOwner() = %v, %v; want two distinct non-zero tokens", a, b)
	}
}

func TestOutcomeString(t *testing.T) {
	for o, want := range map[idempotency.Outcome]string{
		idempotency.Claimed: "claimed", idempotency.InProgress: "in-progress",
		idempotency.Completed: "completed", idempotency.Mismatch: "mismatch", 0: "Outcome(0)",
	} {
		if got := o.String(); got != want {
			t.Errorf("Outcome(%d).String() = %q, want %q", uint8(o), got, want)
		}
	}
}

func FuzzParseKey(f *testing.F) {
	for _, s := range []string{"abc", `"abc"`, `"a\"b"`, `"a\\"`, "a,b", `"abc";x`, "", `"`, "\x00", strings.Repeat("k", 256), idempotency.NewKey()} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		k, err := idempotency.ParseKey(in)
		if err != nil {
			if !errors.Is(err, idempotency.ErrInvalidKey) {
				t.Fatalf("ParseKey(%q) error %v does not wrap ErrInvalidKey", in, err)
			}
			return
		}
		if len(k) == 0 || len(k) > idempotency.MaxKeyLen {
			t.Fatalf("ParseKey(%q) = %q: length %d outside 1-%d", in, k, len(k), idempotency.MaxKeyLen)
		}
		for i := 0; i < len(k); i++ {
			if k[i] < 0x20 || k[i] > 0x7e {
				t.Fatalf("ParseKey(%q) = %q: byte 0x%02x not printable ASCII", in, k, k[i])
			}
		}
		// The quoted form always parses back to the same key.
		if back, err := idempotency.ParseKey(idempotency.FormatKey(k)); err != nil || back != k {
			t.Fatalf("ParseKey(FormatKey(%q)) = %q, %v", k, back, err)
		}
	})
}
