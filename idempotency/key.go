package idempotency

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"

	"github.com/stormguard/stormguard/idempotency/store"
)

// Header is the name of the request header field that carries an
// idempotency key.
const Header = "Idempotency-Key"

// legacyHeader is the older, unregistered name of [Header] that many
// clients still send (and that net/http's Transport, like [Header], takes
// as a sign that a request may be resent). The middleware ([NewMiddleware]) takes a key
// from either; a request that carries both must give the same key in each.
const legacyHeader = "X-Idempotency-Key"

// ReplayHeader is the response header field the middleware ([NewMiddleware]) adds, with the
// value "true", to a response it replays from the store instead of running
// the handler.
const ReplayHeader = "Idempotent-Replayed"

// BodyOmittedHeader is the response header field the middleware ([NewMiddleware]) adds,
// with the value "true", to a replay whose body was not kept (it was over
// the size cap, or the store had no room for it): the replay has the
// original status and allow-listed header fields and an empty body. The
// handler did run, once.
const BodyOmittedHeader = "Idempotent-Body-Omitted"

// maxKeyLen is the longest idempotency key ParseKey accepts, in characters
// (bytes: keys are ASCII).
const maxKeyLen = 255

// errInvalidKey is wrapped by every error [ParseKey] returns (it returns
// no other kind).
var errInvalidKey = errors.New("idempotency: invalid key")

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

// ParseKey parses the value of one Idempotency-Key header line and returns
// the key.
//
// Two forms are accepted: the draft's structured-field string ("..." with \"
// and \\ escapes, RFC 8941 section 3.3.3, without parameters) and the common
// bare form (the key as is, e.g. a UUID). Surrounding spaces and tabs are
// ignored. The key must be 1 to 255 printable ASCII characters
// (0x20-0x7E); a bare key must not contain a comma, since a comma is what a
// proxy puts between two header lines it folds into one. An error (its
// text "idempotency: invalid key: " and what is wrong) means the value is
// not a key: ParseKey returns no other kind. ParseKey never panics.
func ParseKey(value string) (string, error) {
	v := strings.Trim(value, " \t")
	if v == "" {
		return "", fmt.Errorf("%w: empty", errInvalidKey)
	}
	if v[0] == '"' {
		return parseQuoted(v)
	}
	if len(v) > maxKeyLen {
		return "", fmt.Errorf("%w: %d characters, at most %d allowed", errInvalidKey, len(v), maxKeyLen)
	}
	for i := 0; i < len(v); i++ {
		c := v[i]
		if c < 0x20 || c > 0x7e {
			return "", fmt.Errorf("%w: byte 0x%02x at offset %d is not printable ASCII", errInvalidKey, c, i)
		}
		if c == ',' {
			return "", fmt.Errorf("%w: comma in a bare key (more than one value?); quote the key as a structured-field string", errInvalidKey)
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
				return "", fmt.Errorf("%w: bad escape at offset %d (only \\\" and \\\\ are allowed)", errInvalidKey, i)
			}
			if b == nil {
				b = make([]byte, 0, len(v))
			}
			b = append(b, v[start:i]...)
			i++
			start = i
		case c == '"':
			if i != len(v)-1 {
				return "", fmt.Errorf("%w: characters after the closing quote (parameters and lists are not allowed)", errInvalidKey)
			}
			var key string
			if b == nil {
				key = v[1:i]
			} else {
				key = string(append(b, v[start:i]...))
			}
			switch {
			case key == "":
				return "", fmt.Errorf("%w: empty", errInvalidKey)
			case len(key) > maxKeyLen:
				return "", fmt.Errorf("%w: %d characters, at most %d allowed", errInvalidKey, len(key), maxKeyLen)
			}
			return key, nil
		case c < 0x20 || c > 0x7e:
			return "", fmt.Errorf("%w: byte 0x%02x at offset %d is not printable ASCII", errInvalidKey, c, i)
		}
	}
	return "", fmt.Errorf("%w: missing closing quote", errInvalidKey)
}

// scopeLen is the number of leading bytes of a store.ID that hash the
// scope alone.
const scopeLen = 8

// hashKey returns the store ID of the idempotency key key sent by the
// caller identified by scope (see [store.ID]). Different scopes always
// give different IDs for the same key (the scope is length-prefixed, so
// ("ab", "c") and ("a", "bc") differ too), and every ID of one scope
// starts with the same 8 bytes. Stored IDs depend on it: it must never
// change.
func hashKey(scope, key string) store.ID {
	var id store.ID
	var sum [sha256.Size]byte
	h := sha256.New()
	h.Write([]byte("stormguard-idempotency-scope\x00"))
	h.Write([]byte(scope))
	copy(id[:scopeLen], h.Sum(sum[:0]))
	h.Reset()
	var n [binary.MaxVarintLen64]byte
	h.Write([]byte("stormguard-idempotency-key\x00"))
	h.Write(n[:binary.PutUvarint(n[:], uint64(len(scope)))])
	h.Write([]byte(scope))
	h.Write([]byte(key))
	copy(id[scopeLen:], h.Sum(sum[:0]))
	return id
}

// scopeOf returns the part of id that hashes the caller's scope.
func scopeOf(id store.ID) uint64 { return binary.BigEndian.Uint64(id[:scopeLen]) }
