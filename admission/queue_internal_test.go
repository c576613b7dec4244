package admission

import (
	"testing"
	"time"
)

// The wait under a standing queue is 25 turns, within [MaxQueueWait/100,
// MaxQueueWait/5], and the turn is measured from the slots handed over.
func TestStandingWaitTurns(t *testing.T) {
	c, err := New(Config{MaxInFlight: 1, MaxQueueWait: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	now := c.now()
	for _, tt := range []struct{ turn, since, want time.Duration }{
		{0, 0, 10 * time.Millisecond},                      // no turn measured: the target
		{100 * time.Microsecond, 0, 10 * time.Millisecond}, // 25 turns under the target
		{2 * time.Millisecond, 0, 50 * time.Millisecond},   // 25 turns
		{time.Second, 0, 200 * time.Millisecond},           // at most the interval
		// The turn in progress counts when it is longer than the mean: no
		// slot handed over for 4 ms is a turn of at least 4 ms, and for
		// 150 ms, with no turn measured before, one of 150 ms.
		{2 * time.Millisecond, 4 * time.Millisecond, 100 * time.Millisecond},
		{0, 150 * time.Millisecond, 200 * time.Millisecond},
		{2 * time.Millisecond, time.Millisecond, 50 * time.Millisecond},
	} {
		c.turn, c.lastTurn = tt.turn, now.Add(-tt.since)
		if got := c.standingWait(now); got != tt.want {
			t.Errorf("turn %v, %v since the last: standing wait %v, want %v", tt.turn, tt.since, got, tt.want)
		}
	}
	// Three waiters handed a slot 4 ms apart, having joined together: each
	// waited 4 ms per slot handed over since it joined.
	c.turn = 0
	start := c.now()
	var ws []*waiter
	c.mu.Lock()
	for range 3 {
		w := &waiter{ready: make(chan struct{}, 1), since: start, at: c.grants}
		w.elem = c.queues[classOriginal].PushBack(w)
		c.qlen.Add(1)
		c.nwait.Add(1)
		ws = append(ws, w)
	}
	c.mu.Unlock()
	for i := range ws {
		// Hand one slot over as if at start + 4 ms·(i+1).
		c.now = func() time.Time { return start.Add(time.Duration(i+1) * 4 * time.Millisecond) }
		c.handOff()
		<-ws[i].ready
		c.inFlight.Add(-1)
	}
	if want := 4 * time.Millisecond; c.turn <= 0 || c.turn > want {
		t.Errorf("turn after three samples of 4 ms: %v, want in (0, %v]", c.turn, want)
	}
}
