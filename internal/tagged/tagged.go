// Package tagged packs a time-slot number and a count into one 64-bit word,
// so that a lock-free sliding window can reset a stale slot and count in the
// current one with a single compare-and-swap. Package budget uses it for its
// slices, package breaker for its buckets.
//
// A word holds the low 40 bits of the slot number (its tag) above a 24-bit
// count. Two tags compare correctly while their slots are less than 2^39
// apart.
package tagged

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
