package admission

import (
	"hash/maphash"
	"sync/atomic"
	"time"
)

// Per-client retry accounting (Config.Client): a fixed table of clientsSize
// buckets, a client's bucket chosen by a hash of its identity. Each bucket
// keeps the client's originals and admitted retries over the window, in one
// word per slice: the slice's number (24 bits, 0 meaning unused), then the
// originals and the retries counted in it (20 bits each, saturating). Two
// identities that hash to one bucket share it: they are one client to the
// ratio, which can only make them share one allowance; the global window
// is checked as well, so no collision admits more than it does.
const (
	clientsBits  = 10
	clientsSize  = 1 << clientsBits
	countBits    = 20
	countMax     = 1<<countBits - 1
	origShift    = countBits
	sliceShift   = 2 * countBits
	clientFloor  = 1.0 // retries per window a client may send with no originals
	clientUnused = 0
)

// clientBucket is one bucket: a word per slice of the window.
type clientBucket struct {
	words [slices]atomic.Uint64
}

// clientTable is the table of buckets; safe for concurrent use, lock-free,
// and nothing in it allocates.
type clientTable struct {
	seed    maphash.Seed
	epoch   time.Time
	slice   time.Duration // Window/slices
	ratio   float64       // retries per original, >= 0
	floor   float64       // retries per window with no originals
	buckets [clientsSize]clientBucket
}

// newClientTable returns an empty table for the effective config.
func newClientTable(now time.Time, window time.Duration, ratio, reserve float64) *clientTable {
	return &clientTable{
		seed:  maphash.MakeSeed(),
		epoch: now,
		slice: max(window/slices, 1),
		ratio: ratio,
		floor: min(clientFloor, reserve), // never more than the global floor
	}
}

// bucket returns the bucket of the client named id.
func (t *clientTable) bucket(id string) *clientBucket {
	return &t.buckets[maphash.String(t.seed, id)&(clientsSize-1)]
}

// sliceAt returns the number of the slice now falls in, never 0.
func (t *clientTable) sliceAt(now time.Time) uint64 {
	return sliceNumber(now.Sub(t.epoch) / t.slice)
}

// add adds dOrig originals and dRetry retries (each 0, 1 or, for dRetry
// only, -1 to undo) to b's word of slice cur, starting it afresh if it
// holds an older slice. An undo of a slice already gone does nothing.
func (b *clientBucket) add(cur uint64, dOrig, dRetry int) {
	w := &b.words[cur%slices]
	for {
		old := w.Load()
		var orig, retry uint64
		if old>>sliceShift == cur {
			orig, retry = old>>origShift&countMax, old&countMax
		} else if dRetry < 0 {
			return // the slice was started afresh: nothing to undo
		}
		if dOrig > 0 && orig < countMax {
			orig++
		}
		switch {
		case dRetry > 0 && retry < countMax:
			retry++
		case dRetry < 0 && retry > 0:
			retry--
		}
		if w.CompareAndSwap(old, cur<<sliceShift|orig<<origShift|retry) {
			return
		}
	}
}

// sums returns b's originals and retries over the window ending in slice
// cur.
func (b *clientBucket) sums(cur uint64) (orig, retry uint64) {
	for i := range b.words {
		w := b.words[i].Load()
		s := w >> sliceShift
		if s == clientUnused || (cur-s)&sliceMask >= slices {
			continue
		}
		orig += w >> origShift & countMax
		retry += w & countMax
	}
	return orig, retry
}

// deposit counts an original of b's client now.
func (t *clientTable) deposit(b *clientBucket, now time.Time) {
	b.add(t.sliceAt(now), 1, 0)
}

// reserve counts a retry of b's client now if, with it, the client's
// retries over the window stay within ratio·originals + floor; it reports
// whether it did. The retry is counted before the check, so that
// concurrent retries of one client never pass together beyond the bound
// (at worst they are refused together). Give it back with unreserve if
// the retry is then refused elsewhere.
func (t *clientTable) reserve(b *clientBucket, now time.Time) (slice uint64, ok bool) {
	cur := t.sliceAt(now)
	b.add(cur, 0, 1)
	orig, retry := b.sums(cur)
	// The product's rounding allowed for, as package budget does: 0.29·100
	// + 1 is 29.999999999999996 in floating point, and 30 is within it.
	if float64(retry) <= (t.ratio*float64(orig)+t.floor)*(1+1e-12) {
		return cur, true
	}
	b.add(cur, 0, -1)
	return cur, false
}

// unreserve gives back a retry reserve counted in slice cur.
func (t *clientTable) unreserve(b *clientBucket, cur uint64) {
	b.add(cur, 0, -1)
}
