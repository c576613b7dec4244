// Package tagged packs a time-slot number and a count into one 64-bit word,
// so that a lock-free sliding window can reset a stale slot and count in the
// current one with a single compare-and-swap. Package budget uses it for its
// slices, package breaker for its buckets.
//
// A word holds the low 40 bits of the slot number (its tag) above a 24-bit
// count. Two tags compare correctly while their slots are less than 2^39
// apart.
package tagged

import (
	"math/rand/v2"
	"sync/atomic"
)

const (
	countBits = 24
	tagBits   = 64 - countBits
	tagMask   = 1<<tagBits - 1
)

// MaxCount is the largest count a word holds (16,777,215); counters
// saturate there.
const MaxCount = 1<<countBits - 1

// Never is the slot number every word starts with: long before any slot a
// window will see, so that slots before the window's start (negative
// numbers) count too.
const Never = -1 << 32

// Pack returns the word for slot s holding count n (n <= MaxCount).
func Pack(s int64, n uint64) uint64 { return uint64(s)&tagMask<<countBits | n }

// Unpack splits a word into its 40-bit tag and its count.
func Unpack(w uint64) (tag, n uint64) { return w >> countBits, w & MaxCount }

// Tag returns the 40-bit tag of slot s.
func Tag(s int64) uint64 { return uint64(s) & tagMask }

// Diff returns a−b for two tags as a signed number; it is exact while the
// slots are less than 2^39 apart.
func Diff(a, b uint64) int64 { return int64((a-b)<<countBits) >> countBits }

// Striped is a ring of slot-tagged counters, one per slot position, each
// spread over several stripes on cache lines of their own, so that
// goroutines on different cores counting in the same slot rarely write the
// same cache line: an increment picks a stripe at random, a read sums the
// stripes. Its zero value is not usable; build one with [NewStriped].
type Striped struct {
	words   []atomic.Uint64 // stripe k, position i at k*stride+i
	n       int64           // positions
	stride  int64           // words per stripe, a multiple of 16 (128 bytes)
	stripes uint32          // a power of two
}

// maxStripedWords bounds the memory of a Striped: above it, fewer stripes.
const maxStripedWords = 1 << 12

// NewStriped returns n counters (n >= 1), every word holding slot Never and
// count 0.
func NewStriped(n int) *Striped {
	stride := (int64(n) + 15) &^ 15
	stripes := uint32(8)
	for stripes > 1 && int64(stripes)*stride > maxStripedWords {
		stripes /= 2
	}
	s := &Striped{words: make([]atomic.Uint64, int64(stripes)*stride), n: int64(n), stride: stride, stripes: stripes}
	empty := Pack(Never, 0)
	for i := range s.words {
		s.words[i].Store(empty)
	}
	return s
}

// Add adds add to the counter at position i for slot slot (resetting a
// stripe word that holds an older slot), saturating at MaxCount per
// stripe. A word that already holds a later slot is left alone: the count
// is too old for any window still to come. Add takes no lock and allocates
// nothing.
func (s *Striped) Add(i, slot int64, add uint64) {
	k := int64(rand.Uint32() & (s.stripes - 1))
	w := &s.words[k*s.stride+i]
	tag := Tag(slot)
	for {
		old := w.Load()
		otag, n := Unpack(old)
		var next uint64
		switch d := Diff(tag, otag); {
		case d == 0:
			if n == MaxCount {
				return // saturated
			}
			next = old + min(add, MaxCount-n)
		case d > 0:
			next = Pack(slot, min(add, MaxCount)) // the word held an expired slot
		default:
			return // the word holds a later slot
		}
		if w.CompareAndSwap(old, next) {
			return
		}
	}
}

// Get returns the count at position i for slot slot: the sum of the
// stripes that hold it, or 0 if any stripe at i has moved on to a later
// slot (then slot has expired, as it would have for one unstriped word,
// whatever the other stripes still hold).
func (s *Striped) Get(i, slot int64) uint64 {
	tag := Tag(slot)
	var sum uint64
	for k := int64(0); k < int64(s.stripes); k++ {
		t, n := Unpack(s.words[k*s.stride+i].Load())
		switch d := Diff(t, tag); {
		case d == 0:
			sum += n
		case d > 0:
			return 0
		}
	}
	return sum
}
