package idempotency

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
)

// Header is the name of the request header field that carries an
// idempotency key.
const Header = "Idempotency-Key"

// LegacyHeader is the older, unregistered name of [Header] that many
// clients still send (and that net/http's Transport, like [Header], takes
// as a sign that a request may be resent). The [Middleware] takes a key
// from either; a request that carries both must give the same key in each.
const LegacyHeader = "X-Idempotency-Key"

// ReplayHeader is the response header field the [Middleware] adds, with the
// value "true", to a response it replays from the store instead of running
// the handler.
const ReplayHeader = "Idempotent-Replayed"

// BodyOmittedHeader is the response header field the [Middleware] adds,
// with the value "true", to a replay whose body was not kept (it was over
// the size cap, or the store had no room for it): the replay has the
// original status and allow-listed header fields and an empty body. The
// handler did run, once.
const BodyOmittedHeader = "Idempotent-Body-Omitted"

// MaxKeyLen is the longest idempotency key [ParseKey] accepts, in characters
// (bytes: keys are ASCII).
const MaxKeyLen = 255

// ErrInvalidKey is wrapped by every error [ParseKey] returns.
var ErrInvalidKey = errors.New("idempotency: invalid key")

// NewKey returns a new idempotency key: a random (version 4) UUID in its
// canonical lower-case text form, e.g. "1b4e28ba-2fa1-41d2-883f-0e1a7c9a6f3b",
// with 122 random bits from crypto/rand.
//
// Create the key once per logical operation, before the first attempt, and
// reuse it for every retry of that operation. NewKey is safe for concurrent
// use.
func NewKey() string {
	var u [16]byte
	_, _ = rand.Read(u[:])  // never fails (Go 1.24+: it crashes the program instead)
	u[6] = u[6]&0x0f | 0x40 // version 4
	u[8] = u[8]&0x3f | 0x80 // variant 10 (RFC 9562)
	var b [36]byte
	hex.Encode(b[0:8], u[0:4])
	b[8] = '-'
	hex.Encode(b[9:13], u[4:6])
	b[13] = '-'
	hex.Encode(b[14:18], u[6:8])
	b[18] = '-'
	hex.Encode(b[19:23], u[8:10])
	b[23] = '-'
	hex.Encode(b[24:], u[10:])
	return string(b[:])
}

// FormatKey returns key in the form the IETF draft specifies for the
// Idempotency-Key field: a structured-field string (RFC 8941), i.e. quoted,
// with '"' and '\' escaped. It does not validate key; [ParseKey] of the
// result returns key when key is valid.
func FormatKey(key string) string {
	var b strings.Builder
	b.Grow(len(key) + 2)
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

// ParseKey parses the value of one Idempotency-Key header line and returns
// the key.
//
// Two forms are accepted: the draft's structured-field string ("..." with \"
// and \\ escapes, RFC 8941 section 3.3.3, without parameters) and the common
// bare form (the key as is, e.g. a UUID). Surrounding spaces and tabs are
// ignored. The key must be 1 to [MaxKeyLen] printable ASCII characters
// (0x20-0x7E); a bare key must not contain a comma, since a comma is what a
// proxy puts between two header lines it folds into one. Errors wrap
// [ErrInvalidKey]. ParseKey never panics.
func ParseKey(value string) (string, error) {
	v := strings.Trim(value, " \t")
	if v == "" {
		return "", fmt.Errorf("%w: empty", ErrInvalidKey)
	}
	if v[0] == '"' {
		return parseQuoted(v)
	}
	if len(v) > MaxKeyLen {
		return "", fmt.Errorf("%w: %d characters, at most %d allowed", ErrInvalidKey, len(v), MaxKeyLen)
	}
	for i := 0; i < len(v); i++ {
		c := v[i]
		if c < 0x20 || c > 0x7e {
			return "", fmt.Errorf("%w: byte 0x%02x at offset %d is not printable ASCII", ErrInvalidKey, c, i)
		}
		if c == ',' {
			return "", fmt.Errorf("%w: comma in a bare key (more than one value?); quote the key as a structured-field string", ErrInvalidKey)
		}
	}
	return v, nil
}

// parseQuoted parses a structured-field string; v starts with '"'.
func parseQuoted(v string) (string, error) {
	var b []byte // allocated only when an escape is met
	start := 1
	for i := 1; i < len(v); i++ {
		c := v[i]
		switch {
		case c == '\\':
			if i+1 >= len(v) || (v[i+1] != '"' && v[i+1] != '\\') {
				return "", fmt.Errorf("%w: bad escape at offset %d (only \\\" and \\\\ are allowed)", ErrInvalidKey, i)
			}
			if b == nil {
				b = make([]byte, 0, len(v))
			}
			b = append(b, v[start:i]...)
			i++
			start = i
		case c == '"':
			if i != len(v)-1 {
				return "", fmt.Errorf("%w: characters after the closing quote (parameters and lists are not allowed)", ErrInvalidKey)
			}
			var key string
			if b == nil {
				key = v[1:i]
			} else {
				key = string(append(b, v[start:i]...))
			}
			switch {
			case key == "":
				return "", fmt.Errorf("%w: empty", ErrInvalidKey)
			case len(key) > MaxKeyLen:
				return "", fmt.Errorf("%w: %d characters, at most %d allowed", ErrInvalidKey, len(key), MaxKeyLen)
			}
			return key, nil
		case c < 0x20 || c > 0x7e:
			return "", fmt.Errorf("%w: byte 0x%02x at offset %d is not printable ASCII", ErrInvalidKey, c, i)
		}
	}
	return "", fmt.Errorf("%w: missing closing quote", ErrInvalidKey)
}

// Key identifies an idempotency key inside a [Store]: a hash of the
// caller's scope and the raw key, built by [HashKey]. Its first 8 bytes are
// a hash of the scope alone ([Key.Scope]), the other 24 a SHA-256 hash of
// (scope, raw key). A store never sees the raw key or the scope. The zero
// Key is not produced by HashKey.
type Key [sha256.Size]byte

// scopeLen is the number of leading bytes of a Key that hash the scope.
const scopeLen = 8

// HashKey returns the store key for the raw idempotency key raw sent by the
// caller identified by scope. Different scopes always give different keys
// for the same raw key (the scope is length-prefixed, so ("ab", "c") and
// ("a", "bc") differ too), and every key of one scope has the same
// [Key.Scope].
func HashKey(scope, raw string) Key {
	var k Key
	var sum [sha256.Size]byte
	h := sha256.New()
	h.Write([]byte("stormguard-idempotency-scope\x00"))
	h.Write([]byte(scope))
	copy(k[:scopeLen], h.Sum(sum[:0]))
	h.Reset()
	var n [binary.MaxVarintLen64]byte
	h.Write([]byte("stormguard-idempotency-key\x00"))
	h.Write(n[:binary.PutUvarint(n[:], uint64(len(scope)))])
	h.Write([]byte(scope))
	h.Write([]byte(raw))
	copy(k[scopeLen:], h.Sum(sum[:0]))
	return k
}

// Scope returns the part of k that identifies the caller's scope: equal
// for every key [HashKey] made for one scope, and, but for a one in 2^64
// chance, different between two scopes. A bounded store shares its room
// fairly between scopes by it.
func (k Key) Scope() uint64 { return binary.BigEndian.Uint64(k[:scopeLen]) }

// String returns k in hexadecimal.
func (k Key) String() string { return hex.EncodeToString(k[:]) }

// Fingerprint identifies what a request asked for: the SHA-256 hash of its
// method, its route and the SHA-256 hash of its body, built by
// [NewFingerprint]. A key reused with a different fingerprint is refused
// (422) rather than replayed.
type Fingerprint [sha256.Size]byte

// NewFingerprint returns the fingerprint of a request with the given method,
// route (e.g. the ServeMux pattern "POST /payments") and body hash (SHA-256
// of the body bytes).
func NewFingerprint(method, route string, bodySHA256 [sha256.Size]byte) Fingerprint {
	h := sha256.New()
	var n [binary.MaxVarintLen64]byte
	h.Write([]byte("stormguard-idempotency-fingerprint\x00"))
	h.Write(n[:binary.PutUvarint(n[:], uint64(len(method)))])
	h.Write([]byte(method))
	h.Write(n[:binary.PutUvarint(n[:], uint64(len(route)))])
	h.Write([]byte(route))
	h.Write(bodySHA256[:])
	var f Fingerprint
	h.Sum(f[:0])
	return f
}

// String returns f in hexadecimal.
func (f Fingerprint) String() string { return hex.EncodeToString(f[:]) }

// Owner is the token that proves which request holds the lock on a key. A
// [Store] creates a new random Owner each time [Store.Begin] claims a key;
// only that owner may complete or release it. The zero Owner is never
// issued.
type Owner [16]byte

// NewOwner returns a random owner token from crypto/rand, for [Store]
// implementations. It is safe for concurrent use.
func NewOwner() Owner {
	var o Owner
	for o == (Owner{}) {
		_, _ = rand.Read(o[:])
	}
	return o
}

// String returns o in hexadecimal.
func (o Owner) String() string { return hex.EncodeToString(o[:]) }
