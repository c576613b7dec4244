package fleet

import (
	"encoding/binary"
	"math"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// FuzzModelBudget runs random deposits, lease requests and returns through
// the script's model and holds it to a reference that keeps every slice's
// counts in a plain map: the ring of slices counts exactly what the
// reference's window counts, and every grant is the most the rule allows:
// retries + k <= Ratio·requests + floor, and one more would break it.
func FuzzModelBudget(f *testing.F) {
	f.Add([]byte{1, 2, 3, 4, 5, 6, 7, 8})
	f.Add([]byte("deposits then leases then the clock jumps"))
	f.Fuzz(func(t *testing.T, data []byte) {
		src := &byteSource{data}
		s := settings{
			sliceUS:  []int64{1000, 3000, 1_000_000}[src.next(3)],
			slices:   []int64{1, 2, 5, 10}[src.next(4)],
			ratio:    []float64{0, 0.1, 0.3, 1}[src.next(4)],
			reserve:  []float64{0, 1, 2.5, 10}[src.next(4)],
			bucketUS: 1000, buckets: 10, fratio: 0.5, minCalls: 20, ttlMS: 1, probeUS: 1000, rounds: 1,
		}
		m := newModel()
		type counts struct{ q, r int64 }
		ref := map[int64]*counts{}
		now := int64(1_000_000_000) + int64(src.next(1<<16))
		var hw int64
		var inc int64 // the key's incarnation, from its first call
		key := []string{"k"}
		for len(src.b) > 0 {
			switch src.next(6) {
			case 0:
				now -= int64(src.next(uint64(s.sliceUS)))
			case 1:
				now += int64(src.next(uint64(s.slices*s.sliceUS*2)) + 1)
			}
			hw = max(hw, now)
			if inc == 0 {
				inc = hw
			}
			cur := hw / s.sliceUS
			at := func(sl int64) *counts {
				if ref[sl] == nil {
					ref[sl] = &counts{}
				}
				return ref[sl]
			}
			window := func() (q, r int64) {
				for sl := cur - s.slices + 1; sl <= cur; sl++ {
					if c := ref[sl]; c != nil {
						q += c.q
						r += c.r
					}
				}
				return q, r
			}
			switch src.next(3) {
			case 0: // a sync with deposits and returns
				h := syncHost{requests: src.next(50)}
				for range src.next(3) {
					sl := cur - int64(src.next(uint64(s.slices)+2))
					// One return in four names another incarnation: it is
					// not taken off the count.
					h.returns = append(h.returns, returned{slot{sl, inc + int64(src.next(4)/3)}, int64(src.next(4))})
				}
				v, err := m.eval(key, appendSync(s.args("s", now), h))
				if err != nil {
					t.Fatal(err)
				}
				if h.requests > 0 {
					at(cur).q += int64(h.requests)
				}
				for _, r := range h.returns {
					if c := ref[r.slice]; c != nil && r.slice > cur-s.slices && r.inc == inc {
						c.r = max(0, c.r-r.n)
					}
				}
				q, r := window()
				if v[1] != q || v[2] != r {
					t.Fatalf("sync at %d: window %d requests, %d retries; reference %d, %d", hw, v[1], v[2], q, r)
				}
			case 1: // a lease request
				want := int64(src.next(8)) + 1
				v, err := m.eval(key, append(s.args("l", now), itoa(want)))
				if err != nil {
					t.Fatal(err)
				}
				lr, err := decodeLease(v, want)
				if err != nil {
					t.Fatalf("lease reply %v: %v", v, err)
				}
				q, r := window()
				limit := float64(s.ratio*float64(q)) + s.reserve
				if lr.slot != (slot{cur, inc}) || lr.left <= 0 || lr.left > s.sliceUS {
					t.Fatalf("lease at %d: slot %+v (want slice %d, incarnation %d), %dµs left of %d", hw, lr.slot, cur, inc, lr.left, s.sliceUS)
				}
				if lr.requests != q || lr.retries != r+lr.granted {
					t.Fatalf("lease: window %d/%d, reference %d/%d plus %d granted", lr.requests, lr.retries, q, r, lr.granted)
				}
				if lr.granted > 0 && float64(r+lr.granted) > limit {
					t.Fatalf("lease granted %d with %d retries of limit %v", lr.granted, r, limit)
				}
				if lr.granted < want && float64(r+lr.granted+1) <= limit {
					t.Fatalf("lease granted %d of %d with room: %d retries, limit %v", lr.granted, want, r, limit)
				}
				at(cur).r += lr.granted
			case 2: // the reply of a probe says nothing of the budget
				if _, err := m.eval(key, append(s.args("p", now), "0")); err != nil {
					t.Fatal(err)
				}
			}
		}
	})
}

// FuzzLease runs random installs, takes and expiries on a lease and checks
// its arithmetic: no retry is taken at or after the deadline, and every
// retry installed is taken, returned by an expiry, or still held.
func FuzzLease(f *testing.F) {
	f.Add([]byte{0, 5, 1, 1, 1, 2, 2})
	f.Add([]byte("install take take expire install"))
	f.Fuzz(func(t *testing.T, data []byte) {
		src := &byteSource{data}
		var l lease
		var now, installed, taken, returned, deadline int64
		for len(src.b) > 0 {
			now += int64(src.next(1000))
			switch src.next(4) {
			case 0: // what refill does: expire, then install
				if n, _ := l.expire(now, false); n > 0 {
					returned += n
				}
				if l.left(now) == 0 && uint32(l.word.Load()) == 0 {
					n := int64(src.next(20))
					deadline = leaseDeadline(now, int64(src.next(5000)))
					l.install(n, slot{int64(src.next(100)), 1}, deadline)
					installed += n
				}
			case 1:
				if l.take(now) {
					if now >= deadline {
						t.Fatalf("took a retry at %d, deadline %d", now, deadline)
					}
					taken++
				}
			case 2:
				n, _ := l.expire(now, src.next(2) == 0)
				returned += n
			case 3:
				if l.left(now) < 0 {
					t.Fatalf("left %d", l.left(now))
				}
			}
			held := int64(uint32(l.word.Load()))
			if installed != taken+returned+held {
				t.Fatalf("installed %d != taken %d + returned %d + held %d", installed, taken, returned, held)
			}
		}
	})
}

// TestLeaseDeadline checks the lease's end: now plus the microseconds left,
// saturating instead of overflowing.
func TestLeaseDeadline(t *testing.T) {
	tests := []struct {
		now, left, want int64
	}{
		{0, 1, 1000},
		{5, 1_000_000, 5 + int64(time.Second)},
		{math.MaxInt64 - 10, 1, math.MaxInt64},
		{0, math.MaxInt64, math.MaxInt64},
		{-1000, 2, 1000},
	}
	for _, tt := range tests {
		if got := leaseDeadline(tt.now, tt.left); got != tt.want {
			t.Errorf("leaseDeadline(%d, %d) = %d, want %d", tt.now, tt.left, got, tt.want)
		}
	}
}

// TestLeaseConcurrent takes and expires a lease from many goroutines
// while installs go on: every retry installed is taken or returned exactly
// once.
func TestLeaseConcurrent(t *testing.T) {
	var l lease
	var clock atomic.Int64
	var taken, returned atomic.Int64
	var installed int64
	var mu sync.Mutex // the refill lock
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 8 {
		until(&wg, stop, func() {
			if l.take(clock.Load()) {
				taken.Add(1)
			}
		})
	}
	until(&wg, stop, func() {
		n, _ := l.expire(clock.Add(7), false)
		returned.Add(n)
	})
	for i := range 2000 {
		mu.Lock()
		now := clock.Load()
		n, _ := l.expire(now, false)
		returned.Add(n)
		if !l.take(now) && uint32(l.word.Load()) == 0 {
			l.install(int64(i%13), slot{int64(i), 1}, now+50)
			installed += int64(i % 13)
		} else {
			taken.Add(1)
		}
		mu.Unlock()
	}
	close(stop)
	wg.Wait()
	n, _ := l.expire(0, true)
	returned.Add(n)
	if got := taken.Load() + returned.Load(); got != installed {
		t.Errorf("taken %d + returned %d = %d, installed %d", taken.Load(), returned.Load(), got, installed)
	}
}

// FuzzDecode feeds arbitrary replies to the decoders: they never panic,
// and what they accept is well formed.
func FuzzDecode(f *testing.F) {
	f.Add([]byte{}, uint8(1), int64(3))
	f.Add(make([]byte, 56), uint8(1), int64(8))
	f.Fuzz(func(t *testing.T, data []byte, n uint8, want int64) {
		v := make([]int64, len(data)/8)
		for i := range v {
			v[i] = int64(binary.LittleEndian.Uint64(data[8*i:]))
		}
		if r, err := decodeSync(v, int(n)); err == nil {
			for _, h := range r.hosts {
				if h.requests < 0 || h.retries < 0 || h.calls < h.failures || h.failures < 0 || h.state > 1 || h.state < 0 || h.epoch < 0 {
					t.Fatalf("decodeSync accepted %+v", h)
				}
			}
		}
		if r, err := decodeLease(v, want); err == nil && (r.granted < 0 || r.granted > want || r.left <= 0) {
			t.Fatalf("decodeLease accepted %+v for want %d", r, want)
		}
		if r, err := decodeProbe(v); err == nil && (r.state < 0 || r.state > 1) {
			t.Fatalf("decodeProbe accepted %+v", r)
		}
	})
}
