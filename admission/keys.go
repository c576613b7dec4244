package admission

import (
	"hash/maphash"
	"strings"
	"sync/atomic"
	"time"
)

// Keyed requests seen in the window, so that a request whose idempotency
// key was already seen counts as a retry whatever its attempt header says
// (a client that sends none, or always says 1).
//
// The table is a fixed array of keysSize words, each the fingerprint of a
// key (its hash's upper 40 bits) above the 24-bit number of the window
// slice in which it was last seen; a key's slot is its hash's low bits.
// A key counts as seen when its slot holds its fingerprint from a slice
// less than a window ago. Memory is bounded (keysSize·8 bytes per
// Controller): a slot is overwritten by the next key that hashes to it, so
// under more distinct keys per window than slots a retry may go unnoticed
// (counted as the client says); a new request is taken for a retry only if
// two keys share 40 bits of hash and a slot.
const (
	keysBits   = 14
	keysSize   = 1 << keysBits
	sliceBits  = 24
	sliceMask  = 1<<sliceBits - 1
	fingerMask = ^uint64(sliceMask)
)

// keyTable is the table of keys seen; the zero value is empty (slice 0 of
// a fingerprint 0 is treated as never seen).
type keyTable struct {
	seed  maphash.Seed
	epoch time.Time
	slice time.Duration // Window/slices
	words [keysSize]atomic.Uint64
}

// newKeyTable returns an empty table whose slices are window/slices long.
func newKeyTable(now time.Time, window time.Duration) *keyTable {
	return &keyTable{seed: maphash.MakeSeed(), epoch: now, slice: max(window/slices, 1)}
}

// seen records key as seen now and reports whether it was already seen less
// than a window ago. It is safe for concurrent use, takes no lock and
// allocates nothing.
func (t *keyTable) seen(key string, now time.Time) bool {
	h := maphash.String(t.seed, key)
	cur := uint64(now.Sub(t.epoch)/t.slice+1) & sliceMask // +1: slice 0 means never
	w := &t.words[h&(keysSize-1)]
	old := w.Swap(h&fingerMask | cur)
	if old&fingerMask != h&fingerMask || old&sliceMask == 0 {
		return false
	}
	return (cur-old)&sliceMask < slices
}

// requestKey returns the idempotency key of a request whose
// Idempotency-Key field (the draft's name, as package idempotency names it)
// has the values k and X-Idempotency-Key (the older name) xk: the first
// that is not blank, "" if none.
func requestKey(k, xk []string) string {
	if len(k) > 0 {
		if v := strings.TrimSpace(k[0]); v != "" {
			return v
		}
	}
	if len(xk) > 0 {
		return strings.TrimSpace(xk[0])
	}
	return ""
}

// The idempotency key's fields, in canonical form.
const (
	idempotencyKeyHeader  = "Idempotency-Key"
	xIdempotencyKeyHeader = "X-Idempotency-Key"
)
