package guards

import (
	"sync"
	"time"

	"github.com/stormguard/stormguard/limit"
)

// The capacity hint's timing: a cap holds for HintHold after the last
// hinted answer, then doubles every HintStep until it no longer binds (the
// limiter's own limit is below it), and is then removed.
const (
	HintHold = time.Second
	HintStep = 200 * time.Millisecond
)

// MaxHint bounds a capacity hint: larger values saturate here (it is also
// the largest limit a limit.Limiter can have).
const MaxHint = 1 << 30

// CapHint applies a server's capacity hint (wire.CapacityHeader, the
// requests it runs at once) to the limiter the layer built for the
// destination: the limiter's limit is capped at the hint while hinted
// answers keep coming, and the cap relaxes after them (see HintHold). Only
// a limiter the layer built itself is capped this way: a supplied one (a
// fleet's, capped at the process's share of a fleet-wide limit) is its
// owner's, and limit.Limiter.SetCap keeps one cap. It is safe for
// concurrent use; nothing runs while no hint was received.
type CapHint struct {
	lim *limit.Limiter

	mu    sync.Mutex
	cap   int         // the cap in force; 0: none
	last  time.Time   // when the last hint came
	timer *time.Timer // armed while a cap is in force
}

// newCapHint returns the hint state of a destination whose limiter, lim,
// the layer built (nil: no limiter, no hint state).
func newCapHint(lim *limit.Limiter) *CapHint {
	if lim == nil {
		return nil
	}
	return &CapHint{lim: lim}
}

// Apply caps the limiter at n attempts in flight (n in 1 to MaxHint: the
// caller parsed and clamped it), the latest hint replacing any earlier
// one, and holds the cap for HintHold from now. A nil CapHint does
// nothing.
func (h *CapHint) Apply(n int) {
	if h == nil {
		return
	}
	n = min(max(n, 1), MaxHint)
	now := time.Now()
	h.mu.Lock()
	defer h.mu.Unlock()
	h.last = now
	if h.cap != n {
		h.cap = n
		h.lim.SetCap(n)
	}
	if h.timer == nil {
		h.timer = time.AfterFunc(HintHold, h.tick)
	}
}

// Cap returns the cap in force, 0 if none.
func (h *CapHint) Cap() int {
	if h == nil {
		return 0
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.cap
}

// tick runs on the timer: while a hint came less than HintHold ago, it
// waits for the hold's end; then it doubles the cap if it still binds, or
// removes it.
func (h *CapHint) tick() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if left := HintHold - time.Since(h.last); left > 0 {
		h.timer.Reset(left)
		return
	}
	if h.lim.Limit() < h.cap || h.cap >= MaxHint {
		h.cap = 0
		h.lim.SetCap(-1)
		h.timer = nil
		return
	}
	h.cap = min(2*h.cap, MaxHint)
	h.lim.SetCap(h.cap)
	h.timer.Reset(HintStep)
}
