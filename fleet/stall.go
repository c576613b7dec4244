package fleet

import (
	"time"

	"github.com/stormguard/stormguard/breaker"
)

// A hang is news (see the package documentation): with Config.Limit,
// each host watches for an attempt that gets no answer, while no other
// attempt to the host is answered either, for stallFactor times the
// fleet's baseline latency (at least minStall, at most half of
// Limit.Timeout when set), and reports it with a sync at once; the
// script opens the fleet's breaker when such reports come from enough
// of the fleet's attempts (see stalled in script.lua).
const (
	stallFactor = 6
	minStall    = 50 * time.Millisecond
)

// stallAfter returns the time without an answer that makes a stall, for
// a fleet's baseline latency of baselineUS microseconds (0: none known,
// no watch), in nanoseconds.
func (f *Fleet) stallAfter(baselineUS int64) int64 {
	if baselineUS <= 0 || f.cfg.Limit == nil {
		return 0
	}
	d := max(stallFactor*time.Duration(min(baselineUS, int64(time.Hour/time.Microsecond)))*time.Microsecond, minStall)
	if t := f.cfg.Limit.Timeout; t > 0 {
		d = min(d, t/2)
	}
	return int64(d)
}

// started is told of every attempt h's budget is deposited for (a
// call's first attempt, just before it runs), in fleet mode: the first
// since the last answer starts the watch.
func (h *host) started() {
	d := h.stallAfter.Load()
	if d <= 0 {
		return
	}
	h.unanswered.Add(1)
	if h.pend.Load() != 0 {
		return
	}
	if h.pend.CompareAndSwap(0, max(h.f.since(), 1)) && h.armed.CompareAndSwap(false, true) {
		h.watch.Reset(time.Duration(d))
	}
}

// answered is told of an answer (any outcome of the closed state) and of
// every change of h's breaker: nothing is unanswered.
func (h *host) answered() {
	h.pend.Store(0)
	if h.unanswered.Load() != 0 {
		h.unanswered.Store(0)
	}
	if h.stallSent.Load() {
		h.stallSent.Store(false)
	}
}

// checkStall runs when h's watch is due: a stall, if the oldest
// unanswered attempt is old enough, is reported by a sync started at
// once (once per stall: the next one after an answer), while the
// breaker is closed and the fleet is in fleet mode; otherwise the watch
// is set again for that attempt's turn.
func (h *host) checkStall() {
	h.armed.Store(false)
	p, d := h.pend.Load(), h.stallAfter.Load()
	if p == 0 || d <= 0 {
		return
	}
	if age := h.f.since() - p; age < d {
		if h.armed.CompareAndSwap(false, true) {
			h.watch.Reset(time.Duration(d - age))
		}
		return
	}
	if !h.f.fleetMode() || h.brk.State() != breaker.Closed || !h.stallSent.CompareAndSwap(false, true) {
		return
	}
	h.stalls.Add(1)
	h.stallN.Store(max(h.unanswered.Load(), 1))
	h.f.kickSync()
}
