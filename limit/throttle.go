package limit

import (
	"math"
	"sync"
	"time"
)

// Client-side adaptive throttling (Google SRE book, "Handling Overload"):
// reject locally a share max(0, (requests − K·accepts)/(requests + 1)) of
// the calls, counted over a short history so that the throttle lets
// healthy traffic through within seconds of a recovery.
const (
	throttleBucket  = 50 * time.Millisecond
	throttleBuckets = 10 // 500 ms of history
	throttleHistory = throttleBucket * throttleBuckets
)

type throttle struct {
	k  float64
	mu sync.Mutex
	// Guarded by mu.
	rng      uint64 // splitmix64 state: seeded, never global
	epoch    int64  // bucket number of buckets[epoch%throttleBuckets]
	requests [throttleBuckets]int64
	accepts  [throttleBuckets]int64
}

func newThrottle(k float64, seed uint64) *throttle {
	return &throttle{k: k, rng: seed}
}

// advance moves the history to the bucket of now. Calls with mu held.
func (t *throttle) advance(now time.Duration) int {
	e := int64(now / throttleBucket)
	if d := e - t.epoch; d > 0 {
		for i := range min(d, throttleBuckets) {
			j := (t.epoch + 1 + i) % throttleBuckets
			t.requests[j], t.accepts[j] = 0, 0
		}
		t.epoch = e
	}
	return int(t.epoch % throttleBuckets)
}

// share returns the share of calls to reject now. Calls with mu held.
func (t *throttle) share() float64 {
	var r, a int64
	for i := range throttleBuckets {
		r += t.requests[i]
		a += t.accepts[i]
	}
	return math.Max(0, (float64(r)-t.k*float64(a))/float64(r+1))
}

// admit reports whether a call may go at now, by the share of the
// history; a rejected call counts as a request at once, an admitted one
// when its outcome is known (done): an attempt still in flight is neither
// a request nor an accept yet, so that a burst of calls to a destination
// that accepts them all (after an idle spell, at a cold start) is not
// rejected for the answers it has not had time to give.
func (t *throttle) admit(now time.Duration) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	i := t.advance(now)
	p := t.share()
	if p <= 0 || t.float() >= p {
		return true
	}
	t.requests[i]++
	return false
}

// rejecting reports whether the throttle rejects any share of the calls
// at now, without drawing a lot or counting a request: the test of a
// copy that only goes when the destination accepts all (a hedge).
func (t *throttle) rejecting(now time.Duration) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.advance(now)
	return t.share() > 0
}

// undo takes back an admitted call that the limiter refused: it never
// reached the destination, so it counts for nothing (an admitted call is
// counted by done only).
func (t *throttle) undo(time.Duration) {}

// done counts the outcome of an admitted call at now: a request, and an
// accept unless dropped.
func (t *throttle) done(now time.Duration, accepted bool) {
	t.mu.Lock()
	i := t.advance(now)
	t.requests[i]++
	if accepted {
		t.accepts[i]++
	}
	t.mu.Unlock()
}

// float returns a uniform number in [0, 1) (splitmix64). Calls with mu
// held.
func (t *throttle) float() float64 {
	t.rng += 0x9e3779b97f4a7c15
	z := t.rng
	z = (z ^ z>>30) * 0xbf58476d1ce4e5b9
	z = (z ^ z>>27) * 0x94d049bb133111eb
	z ^= z >> 31
	return float64(z>>11) / (1 << 53)
}
