package httpretry

import (
	"context"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

// shiftBase answers in 8 to 12 ms (spread evenly over its requests) until
// shiftAt, then in 5 times that, for good.
type shiftBase struct {
	start   time.Time
	shiftAt time.Duration
	n       atomic.Int64
}

func (b *shiftBase) RoundTrip(r *http.Request) (*http.Response, error) {
	d := 8*time.Millisecond + time.Duration(b.n.Add(1)%41)*100*time.Microsecond
	if time.Since(b.start) >= b.shiftAt {
		d *= 5
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return &http.Response{StatusCode: 200, Header: http.Header{}, Body: http.NoBody, Request: r}, nil
	case <-r.Context().Done():
		return nil, r.Context().Err()
	}
}

// TestHedgeLearnsALastingShift: the races the due-share bound holds back
// do not count in the learned delay, but those it lets through do: when a
// host's latency goes from 8-12 ms to 40-60 ms for good at 500 requests a second
// (every race reaching the old delay), the learned p95 reaches the new
// latency's median within 8 s, and races stop reaching their delay.
func TestHedgeLearnsALastingShift(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const rate = 500
		base := &shiftBase{start: time.Now(), shiftAt: 10 * time.Second}
		tr, err := NewTransport(base, WithHedging(0, 0.95, 1))
		if err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		learned := time.Duration(-1)
		for i := range 20 * rate {
			wg.Go(func() {
				req, _ := http.NewRequestWithContext(context.Background(), http.MethodGet, "http://shift.test/", nil)
				resp, err := tr.RoundTrip(req)
				if err != nil {
					t.Errorf("GET: %v", err)
					return
				}
				resp.Body.Close()
			})
			time.Sleep(time.Second / rate)
			if i%(rate/10) == 0 && learned < 0 && time.Since(base.start) > base.shiftAt {
				hh, _ := tr.hedges.Get("shift.test")
				if hh.lat.Quantile() >= 50*time.Millisecond {
					learned = time.Since(base.start) - base.shiftAt
				}
			}
		}
		wg.Wait()
		hh, _ := tr.hedges.Get("shift.test")
		t.Logf("learned p95 at the end %v; the shift learned after %v", hh.lat.Quantile(), learned)
		if learned < 0 || learned > 8*time.Second {
			t.Errorf("the learned p95 reached 50 ms %v after the shift to 40-60 ms, want within 8 s", learned)
		}
		if hh.dues.Allows(0, 0) == false {
			t.Error("at the end races still reach their delay, want none")
		}
	})
}
