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
// slice in which it was last seen. It is set-associative: a key's hash's
// low bits choose a bucket of keysWays words (64 bytes, a cache line's
// worth), and the key may sit in any of them; a new key takes the bucket's
// empty word, or else the one seen longest ago. A key counts as seen when
// a word of its bucket holds its fingerprint from a slice less than its
// span ago: the window, or the longest Retry-After the Controller sends and
// a slice more if that is longer (see newKeyTable). Memory is bounded (keysSize·8 bytes per Controller). With one
// word per key, a key lost its word to the next key of the same hash bits,
// and two live keys that shared a word both looked new at every resend:
// with 9,000 keys resending at once (450 payments a second resent for 20 s)
// 58% of the resends were recognised, and the rest passed for originals;
// with buckets of 8, 98% (TestKeyTableManyLiveKeys). Under more distinct
// keys at once than that, a retry may go unnoticed (counted as the
// client says); a new request is taken for a retry only if two keys share
// 40 bits of hash and a bucket.
const (
	keysBits   = 14
	keysSize   = 1 << keysBits
	keysWays   = 8
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
	span  uint64        // how many slices a key is remembered for: at least slices
	words [keysSize]atomic.Uint64
}

// newKeyTable returns an empty table whose slices are window/slices long
// and that remembers a key for the window or, if longer, for the longest
// Retry-After the Controller sends (longest) and one slice more: a client
// that honours a Retry-After of 10 s and resends with the same key after
// it is still resending.
func newKeyTable(now time.Time, window, longest time.Duration) *keyTable {
	slice := max(window/slices, 1)
	if longest/slice+2 > maxKeySpan {
		// A Retry-After long for the window's slices: slices coarse enough
		// that the span fits the slice numbers (a 24 h Retry-After with a
		// 10 ms window had its keys forgotten after 2h20m).
		slice = longest/(maxKeySpan-2) + 1
	}
	span := uint64(slices)
	if n := uint64(longest/slice) + 2; n > span {
		span = min(n, maxKeySpan)
	}
	return &keyTable{seed: maphash.MakeSeed(), epoch: now, slice: slice, span: span}
}

// sliceNumber returns the 24-bit number of slice n (counted from the
// table's epoch): n+1 modulo 2^24, and 1 for the 0 that would fall on
// every 2^24th slice, since 0 means never (a slice that wrapped to 0 was
// taken for an empty word: for a second every 194 days with 1 s slices, no
// resend was recognised and a client's retries went unbounded). That
// slice shares its number, and its words, with the next.
func sliceNumber(n time.Duration) uint64 {
	if s := uint64(n+1) & sliceMask; s != 0 {
		return s
	}
	return 1
}

// maxKeySpan bounds a key's span in slices, well within the 24-bit slice
// numbers (an age is read modulo 2^24).
const maxKeySpan = 1 << 22

// seen records key as seen now and reports whether it was already seen less
// than the table's span ago. It is safe for concurrent use, takes no lock and
// allocates nothing. Two new keys that race for one bucket may take the
// same word: one of them is then forgotten (its next resend counts as the
// client says).
func (t *keyTable) seen(key string, now time.Time) bool {
	h := maphash.String(t.seed, key)
	fp := h & fingerMask
	cur := sliceNumber(now.Sub(t.epoch) / t.slice)
	i := (h & (keysSize/keysWays - 1)) * keysWays
	b := t.words[i : i+keysWays : i+keysWays]
	victim, oldest := 0, uint64(0)
	for j := range b {
		old := b[j].Load()
		age := (cur - old) & sliceMask
		if old&sliceMask == 0 {
			age = sliceMask // empty: the best place for a new key
		}
		// At most span slices old: a key seen late in its slice is
		// remembered a whole Window (and up to a slice more), not forgotten
		// up to a slice early.
		if old&fingerMask == fp && age <= t.span {
			if age != 0 {
				b[j].Store(fp | cur)
			}
			return true
		}
		if age > oldest {
			victim, oldest = j, age
		}
	}
	b[victim].Store(fp | cur)
	return false
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
