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
	for _, tt := range []struct{ turn, want time.Duration }{
		{0, 10 * time.Millisecond},                      // no turn measured: the target
		{100 * time.Microsecond, 10 * time.Millisecond}, // 25 turns under the target
		{2 * time.Millisecond, 50 * time.Millisecond},   // 25 turns
		{time.Second, 200 * time.Millisecond},           // at most the interval
	} {
		c.turn = tt.turn
		if got := c.standingWait(); got != tt.want {
			t.Errorf("turn %v: standing wait %v, want %v", tt.turn, got, tt.want)
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
