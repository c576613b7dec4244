// Package lathist keeps the recent latencies of one destination in a fixed,
// log-bucketed histogram of atomic counters, decayed by window: Record takes
// no lock and allocates nothing, so it can sit on every call's success path.
//
// The histogram has 16 buckets per power of two of microseconds (each
// bucket is at most 6.25% wide) from 1 µs to about 275 s; longer latencies count in
// the last bucket. It holds two windows of Period each, the current one and
// the one before: a quantile is read over both (between one and two periods
// of samples), so that old latencies stop counting after at most two
// periods. A ring keeps the latest 32 samples besides, whose median shows
// a shift within a few dozen answers. When a window ends, its median becomes the recent median, and the
// baseline follows it: down at once, up by a sixty-fourth of the gap per
// window, so that an incident of a few minutes does not become the norm.
//
// Two recorders that meet the start of a new window at the same time may
// lose a sample or count one in the new window: the counts are
// estimates, never wrong by more than the samples recorded in that instant.
package lathist

import (
	"math/bits"
	"sync/atomic"
	"time"
)

const (
	subBits  = 4
	sub      = 1 << subBits // buckets per power of two
	octaves  = 28           // 1.024 µs units: up to 2^28 of them, ~275 s
	nBuckets = (octaves - subBits + 1) * sub

	// minSamples is the fewest samples a quantile is read from.
	minSamples = 20
	// refreshes is how many times per period the cached reads are
	// recomputed (every 39 ms for a 10 s period).
	refreshes = 256
	// ringSize is how many of the latest samples the ring keeps: their
	// median is the quickest sign of a shift.
	ringSize = 32
)

// window is one period's counts.
type window struct {
	epoch  atomic.Int64 // the period these counts are of
	counts [nBuckets]atomic.Uint32
}

// Hist is the latency histogram of one destination. Make it with [New]. It
// is safe for concurrent use.
type Hist struct {
	base   time.Time
	period time.Duration
	q      float64

	w [2]window

	// Cached reads, refreshed refreshes times per period.
	cachedAt atomic.Int64 // refresh slot (since base / (period/refreshes)) + 1; 0: never
	quantile atomic.Int64 // the q-quantile over both windows, ns; 0: too few samples
	current  atomic.Int64 // the current window's median, ns; 0: too few samples

	recent   atomic.Int64 // the last ended window's median, ns; 0: none
	baseline atomic.Int64 // the baseline median, ns; 0: none yet

	// The latest ringSize samples, and the median of the ring (cached).
	ring    [ringSize]atomic.Int64
	ringPos atomic.Uint64
	ringMid atomic.Int64
}

// New returns a histogram with windows of period (at least 1 ms) whose
// [Hist.Quantile] reads quantile q (0 < q < 1).
func New(period time.Duration, q float64) *Hist {
	if period < time.Millisecond {
		period = time.Millisecond
	}
	h := &Hist{base: time.Now(), period: period, q: q}
	h.w[1].epoch.Store(-1)
	h.w[0].epoch.Store(-2) // neither slot holds a live window yet
	return h
}

// index returns the bucket of d.
func index(d time.Duration) int {
	if d <= 0 {
		return 0
	}
	v := uint64(d) >> 10
	if v < sub {
		return int(v)
	}
	e := bits.Len64(v) - 1
	if e >= octaves {
		return nBuckets - 1
	}
	return (e-subBits+1)<<subBits | int(v>>(e-subBits))&(sub-1)
}

// bounds returns the lower bound and the width of bucket i.
func bounds(i int) (lo, width time.Duration) {
	if i < sub {
		return time.Duration(i) << 10, 1 << 10
	}
	e := i>>subBits + subBits - 1
	m := i & (sub - 1)
	return time.Duration(sub|m) << (e - subBits) << 10, 1 << (e - subBits) << 10
}

// epoch returns the period number of now.
func (h *Hist) epoch(now time.Time) int64 { return int64(now.Sub(h.base) / h.period) }

// Record counts the latency of an answer that started at start and ended
// now. It takes no lock and allocates nothing.
func (h *Hist) Record(start time.Time) {
	now := time.Now()
	ep := h.epoch(now)
	w := &h.w[ep&1]
	if e := w.epoch.Load(); e != ep {
		if e > ep || !w.epoch.CompareAndSwap(e, ep) {
			// Another recorder opens this window (or a stale reading):
			// count the sample there anyway.
			w.counts[index(now.Sub(start))].Add(1)
			return
		}
		h.open(ep, w)
	}
	w.counts[index(now.Sub(start))].Add(1)
	h.ring[h.ringPos.Add(1)%ringSize].Store(int64(now.Sub(start)))
}

// open clears w, the slot of the new window ep, after folding the window
// before it into the recent median and the baseline.
func (h *Hist) open(ep int64, w *window) {
	prev := &h.w[(ep-1)&1]
	if prev.epoch.Load() == ep-1 {
		if m := quantileOf(0.5, prev); m > 0 {
			h.recent.Store(int64(m))
			b := h.baseline.Load()
			switch {
			case b == 0 || int64(m) < b:
				b = int64(m)
			default:
				b += (int64(m) - b) / 64
			}
			h.baseline.Store(b)
		}
	} else {
		h.recent.Store(0) // a quiet period: nothing recent
	}
	for i := range w.counts {
		w.counts[i].Store(0)
	}
	h.cachedAt.Store(0)
}

// quantileOf returns the q-quantile of the windows ws, read as the upper
// bound of its bucket (never below the true one, at most a bucket's width,
// 6.25%, above it), or 0 with fewer than minSamples samples. Not
// interpolated within the bucket: a provider's answers often come at a few
// exact times, and an interpolated p95 can fall just under the mass that
// holds it (answers at 12 ms read as 11.95 ms), so that a fifth of the races
// reach a hedge delay meant for one in twenty.
func quantileOf(q float64, ws ...*window) time.Duration {
	var counts [nBuckets]uint32
	var n uint64
	for i := range nBuckets {
		for _, w := range ws {
			counts[i] += w.counts[i].Load()
		}
		n += uint64(counts[i])
	}
	if n < minSamples {
		return 0
	}
	rank := q * float64(n)
	var seen float64
	for i, c := range counts {
		if c == 0 {
			continue
		}
		if seen+float64(c) >= rank {
			lo, width := bounds(i)
			return lo + width
		}
		seen += float64(c)
	}
	lo, width := bounds(nBuckets - 1)
	return lo + width
}

// refresh recomputes the cached reads if they are older than a
// sixteenth of a period.
func (h *Hist) refresh() {
	now := time.Now()
	slot := int64(now.Sub(h.base)/(h.period/refreshes)) + 1
	at := h.cachedAt.Load()
	if at == slot || !h.cachedAt.CompareAndSwap(at, slot) {
		return
	}
	ep := h.epoch(now)
	cur, prev := &h.w[ep&1], &h.w[(ep-1)&1]
	switch {
	case cur.epoch.Load() == ep && prev.epoch.Load() == ep-1:
		h.quantile.Store(int64(quantileOf(h.q, cur, prev)))
	case cur.epoch.Load() == ep:
		h.quantile.Store(int64(quantileOf(h.q, cur)))
	case prev.epoch.Load() == ep-1:
		h.quantile.Store(int64(quantileOf(h.q, prev)))
	default:
		h.quantile.Store(0)
	}
	if cur.epoch.Load() == ep {
		h.current.Store(int64(quantileOf(0.5, cur)))
	} else {
		h.current.Store(0)
	}
	h.ringMid.Store(h.ringMedian())
}

// ringMedian returns the median of the latest ringSize samples, 0 until
// the ring is full.
func (h *Hist) ringMedian() int64 {
	if h.ringPos.Load() < ringSize {
		return 0
	}
	var v [ringSize]int64
	for i := range v {
		v[i] = h.ring[i].Load()
	}
	for i := 1; i < len(v); i++ { // insertion sort: 32 values, no allocation
		for j := i; j > 0 && v[j] < v[j-1]; j-- {
			v[j], v[j-1] = v[j-1], v[j]
		}
	}
	return v[ringSize/2]
}

// Quantile returns the histogram's quantile of the latencies recorded in
// the current and the previous window, or 0 if they hold fewer than 20
// samples. It is recomputed at most 256 times per period, and allocates
// nothing.
func (h *Hist) Quantile() time.Duration {
	h.refresh()
	return time.Duration(h.quantile.Load())
}

// Inflated reports whether recent latency is more than factor times the
// baseline: the median of the last ended window, of the current one once
// it holds 20 samples, or of the latest 32 samples, against the baseline
// median. Without a baseline it reports false.
func (h *Hist) Inflated(factor float64) bool {
	h.refresh()
	b := h.baseline.Load()
	if b == 0 {
		return false
	}
	r := max(h.recent.Load(), h.current.Load(), h.ringMid.Load())
	return float64(r) > factor*float64(b)
}
