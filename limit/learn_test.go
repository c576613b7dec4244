package limit

import (
	"fmt"
	"testing"
	"testing/synctest"
	"time"
)

// A cold limiter in front of a destination that serves 5000 attempts per
// second (50 servers, 10 ms each) reaches its capacity in a few round
// trips, and then serves near capacity without a standing queue of more
// than a round trip.
func TestColdStartFindsCapacity(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const rtt = 10 * time.Millisecond
		d := newDest(50, rtt)
		l := mustNew(t, Config{Timeout: time.Second})
		stop := make(chan struct{})
		tr := trace(l, time.Millisecond, stop)
		wg := load(l, d, 400, 2*time.Second, time.Second, stop)
		time.Sleep(2 * time.Second)
		served := d.served.Load()
		close(stop)
		wg.Wait()
		at := tr.first(50)
		t.Logf("limit reached 50 (capacity) after %v = %.1f round trips; served %d in 2 s (capacity 10000)", at, float64(at)/float64(rtt), served)
		if at < 0 || at > 6*rtt {
			t.Errorf("limit reached capacity after %v, want within 6 round trips (%v)", at, 6*rtt)
		}
		if served < 9000 {
			t.Errorf("served %d in 2 s, want at least 90%% of capacity (10000)", served)
		}
		lo, hi := tr.between(time.Second, 2*time.Second)
		t.Logf("limit in the second second: %d..%d", lo, hi)
		if lo < 40 || hi > 100 {
			t.Errorf("limit in the second second %d..%d, want within 40..100 (capacity 50)", lo, hi)
		}
	})
}

func TestSlowStartRounds(t *testing.T) {
	for _, capacity := range []int{50, 200, 1000} {
		t.Run(fmt.Sprint(capacity), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				const rtt = 10 * time.Millisecond
				d := newDest(capacity, rtt)
				l := mustNew(t, Config{Max: 5000, Timeout: time.Second})
				stop := make(chan struct{})
				tr := trace(l, time.Millisecond, stop)
				wg := load(l, d, 3*capacity, 2*time.Second, time.Second, stop)
				time.Sleep(150 * time.Millisecond)
				close(stop)
				wg.Wait()
				at := tr.first(capacity)
				t.Logf("capacity %d in flight: reached after %.1f round trips", capacity, float64(at)/float64(rtt))
				if at < 0 || at > 10*rtt {
					t.Errorf("limit reached capacity %d after %v, want within 10 round trips", capacity, at)
				}
			})
		})
	}
}
