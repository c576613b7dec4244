package fleet

import (
	"math"
	"math/rand/v2"
	"time"
)

// The process's side of the stall rule (see the package documentation, A
// stalled host; the fleet's side is stalled in script.lua): a watch per
// host, armed by a deposit, and the reports of successes while a
// suspicion is in force.

// watch arms the stall watch, if the fleet gave a threshold and it is not
// armed: a deposit's attempt is about to go. It is on the hot path: one
// atomic load when armed (under load, the watch is armed once per
// threshold), a clock reading and a timer's reset when it arms.
func (h *host) watch() {
	us := h.stallUS.Load()
	if us <= 0 || h.watchAt.Load() != 0 {
		return
	}
	if !h.watchAt.CompareAndSwap(0, max(h.f.since(), 1)) {
		return
	}
	h.watchN.Store(h.counted())
	h.watchT.Reset(time.Duration(us) * time.Microsecond)
}

// counted returns the outcomes h's breaker reported so far (successes and
// failures). A sync that takes them between the two loads reads as a
// change: at worst a stalled watch is taken for one that saw an outcome.
func (h *host) counted() uint64 {
	o := h.outcomes.Load()
	return h.flushed.Load() + o&math.MaxUint32 + o>>32
}

// fire ends a watch: no outcome since it was armed (no answer, not even a
// failure, and no timeout) is a stall, which the next sync reports, at
// once; the fleet decides whether the host is hung (a slow answer is no
// sign of one, nor a fast failure).
func (h *host) fire() {
	at := h.watchAt.Load()
	if at != 0 && h.counted() == h.watchN.Load() && h.f.fleetMode() {
		for {
			cur := h.stallSince.Load()
			if (cur != 0 && cur <= at) || h.stallSince.CompareAndSwap(cur, at) {
				break
			}
		}
		h.f.kickSync()
	}
	h.watchAt.Store(0)
}

// heardSuspect takes news of the fleet's stall suspicion (the server's
// time of it, µs, 0: none in force) from a reply or the channel at the
// server's time srv: the newest news wins.
func (h *host) heardSuspect(at, srv int64) {
	h.suspectMu.Lock()
	if srv >= h.suspectSrv {
		h.suspectSrv = srv
		h.suspect.Store(at)
	}
	h.suspectMu.Unlock()
}

// alive reports a success while a stall suspicion this process heard is
// in force: the next sync, at once, tells the fleet the host answers. A
// sample of the successes, about aliveRate a second fleet-wide (all of
// them below that rate): the fleet's rate R is what the processes send.
func (h *host) alive() {
	at := h.suspect.Load()
	if at == 0 {
		return
	}
	if r := h.fleetRate.Load(); r > aliveRate*1000 && rand.Int64N(r) >= aliveRate*1000 {
		return
	}
	h.aliveAt.Store(at)
	h.f.kickSync()
}

// aliveRate is the successes a second the fleet reports while a stall
// suspicion is in force: one at least every few ms, far more often than
// the rule's wait before it opens (150 ms at least).
const aliveRate = 100
