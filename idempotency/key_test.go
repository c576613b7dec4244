package idempotency_test

import (
	"crypto/sha256"
	"regexp"
	"strings"
	"sync"
	"testing"

	"github.com/stormguard/stormguard/idempotency"
	"github.com/stormguard/stormguard/idempotency/store"
)

var uuidV4 = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`)

// maxKeyLen is the longest key ParseKey accepts, as its doc says.
const maxKeyLen = 255

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
	long := strings.Repeat("a", maxKeyLen)
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
		{`"` + strings.Repeat(`\"`, maxKeyLen) + `"`, strings.Repeat(`"`, maxKeyLen), true},
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
		if !tc.ok && (err == nil || !strings.HasPrefix(err.Error(), "idempotency: invalid key: ")) {
			t.Errorf("ParseKey(%q) = %q, %v; want an invalid-key error", tc.in, got, err)
		}
	}
}

func TestQuotedKeyRoundTrip(t *testing.T) {
	for _, k := range []string{"abc", `a"b`, `a\b`, `\"\\`, "a,b", "a b", idempotency.NewKey()} {
		f := quoteKey(k)
		if got, err := idempotency.ParseKey(f); err != nil || got != k {
			t.Errorf("ParseKey(quoteKey(%q) = %s) = %q, %v; want %q", k, f, got, err, k)
		}
	}
	if got := quoteKey(`a"b`); got != `"a\"b"` {
		t.Errorf(`quoteKey(a"b) = %s, want "a\"b"`, got)
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
			t.Errorf("hashKey%q == hashKey%q", p[0], p[1])
		}
	}
	// Known answer: 8 bytes of the SHA-256 of a domain tag and the scope,
	// then 24 of the SHA-256 of another tag, the scope's length, the scope
	// and the key. Stored IDs depend on it: it must never change.
	scope := sha256.Sum256([]byte("stormguard-idempotency-scope\x00alice"))
	key := sha256.Sum256([]byte("stormguard-idempotency-key\x00\x05alicek-1"))
	var want store.ID
	copy(want[:8], scope[:])
	copy(want[8:], key[:])
	if got := idempotency.HashKey("alice", "k-1"); got != want {
		t.Errorf("hashKey(alice, k-1) = %x, want %x", got, want)
	}
	// The first 8 bytes are the scope's (store.ID's doc promises it).
	if a, b := idempotency.HashKey("alice", "k-1"), idempotency.HashKey("alice", "k-2"); [8]byte(a[:8]) != [8]byte(b[:8]) || a == b {
		t.Errorf("two keys of alice: %x and %x, want the same first 8 bytes and different IDs", a, b)
	}
	if a, b := idempotency.HashKey("alice", "k"), idempotency.HashKey("bob", "k"); [8]byte(a[:8]) == [8]byte(b[:8]) {
		t.Errorf("keys of alice and bob: the same first 8 bytes %x", a[:8])
	}
}

func FuzzParseKey(f *testing.F) {
	for _, s := range []string{"abc", `"abc"`, `"a\"b"`, `"a\\"`, "a,b", `"abc";x`, "", `"`, "\x00", strings.Repeat("k", 256), idempotency.NewKey()} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		k, err := idempotency.ParseKey(in)
		if err != nil {
			if !strings.HasPrefix(err.Error(), "idempotency: invalid key: ") {
				t.Fatalf("ParseKey(%q) error %v is not an invalid-key error", in, err)
			}
			return
		}
		if len(k) == 0 || len(k) > maxKeyLen {
			t.Fatalf("ParseKey(%q) = %q: length %d outside 1-%d", in, k, len(k), maxKeyLen)
		}
		for i := 0; i < len(k); i++ {
			if k[i] < 0x20 || k[i] > 0x7e {
				t.Fatalf("ParseKey(%q) = %q: byte 0x%02x not printable ASCII", in, k, k[i])
			}
		}
		// The quoted form always parses back to the same key.
		if back, err := idempotency.ParseKey(quoteKey(k)); err != nil || back != k {
			t.Fatalf("ParseKey(quoteKey(%q)) = %q, %v", k, back, err)
		}
	})
}

// quoteKey returns key as the IETF draft writes the Idempotency-Key field:
// a structured-field string (RFC 8941), quoted, with '"' and '\' escaped.
func quoteKey(key string) string {
	var b strings.Builder
	b.WriteByte('"')
	for i := 0; i < len(key); i++ {
		if c := key[i]; c == '"' || c == '\\' {
			b.WriteByte('\\')
		}
		b.WriteByte(key[i])
	}
	b.WriteByte('"')
	return b.String()
}
