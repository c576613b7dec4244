package fleet

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// The fleet's attempts in flight (with Config.Limit; see the package
// documentation, The fleet's attempts in flight): each process sends its
// count of a host's attempts in flight when it changes (a call starts, an
// outcome comes), from one goroutine, one round trip at a time; the
// script sums the counts and holds the fleet (no new attempt starts
// anywhere) when the sum is at its bound and no success has come for a
// while, until the next success or the sum's fall.

// kickFlight asks the flight loop to send the counts (nil channel: no
// limiter, nothing to send). It does not block or allocate.
func (f *Fleet) kickFlight() {
	select {
	case f.flightKick <- struct{}{}:
	default:
	}
}

// flightGap is the least time between two sends of the counts: a busy
// process sends at most about a hundred a second, and its counts are that
// much late at most.
const flightGap = 10 * time.Millisecond

// flightLoop sends the counts when kicked, until Close: at most one send
// per flightGap, and, while some host has attempts in flight, a look every
// flightGap (an attempt's slot may go back after its outcome, which
// kicked: an HTTP response's, when its body is closed), so that a count
// sent is never left above the process's for longer.
func (f *Fleet) flightLoop() {
	defer close(f.flightDone)
	gap := time.NewTimer(flightGap)
	defer gap.Stop()
	for {
		select {
		case <-f.stop:
			return
		case <-f.flightKick:
		}
		for {
			busy := f.fleetMode() && f.flushFlight()
			gap.Reset(flightGap)
			select {
			case <-f.stop:
				return
			case <-gap.C:
			}
			if !busy {
				break
			}
		}
	}
}

// flushFlight sends the count of every host whose count changed or that
// had successes since its last count (and of every held host when a sync
// asked: news of the hold's end may be lost), applies the holds of the
// reply, and reports whether some host has attempts in flight.
func (f *Fleet) flushFlight() (busy bool) {
	var keys []string
	var hs []*host
	poll := f.flightPoll.Swap(false)
	args := f.set.args("f", 0)
	for _, h := range *f.list.Load() {
		if h.lim == nil {
			continue
		}
		n := int64(h.inFlight())
		busy = busy || n > 0
		a := h.answers.Swap(0)
		if n == h.flightSent.Load() && a == 0 && !(poll && h.holding.Load()) {
			continue
		}
		h.flightSent.Store(n)
		keys = append(keys, h.key)
		hs = append(hs, h)
		args = append(args, f.pid, itoa(n), itoa(a))
	}
	if len(keys) == 0 {
		return busy
	}
	tr := f.start(keys, args, nil)
	v, err := tr.wait(f.cfg.Timeout)
	if err == nil && len(v) != 1+3*len(hs) {
		err = badReply("flight of %d hosts: %d values, want %d", len(hs), len(v), 1+3*len(hs))
	}
	if err != nil {
		for _, h := range hs {
			h.flightSent.Store(-1) // sent again at the next kick
		}
		f.failed(tr, fmt.Errorf("fleet: flight: %w", err))
		return false
	}
	f.replied(v[0])
	for i, h := range hs {
		x := v[1+3*i : 4+3*i]
		h.setHold(x[0] == 1, x[2], x[1])
	}
	return busy
}

// inFlight returns h's attempts in flight (its limiter's).
func (h *host) inFlight() int {
	h.holdMu.Lock()
	defer h.holdMu.Unlock()
	c := -1
	if h.holding.Load() {
		c = 0
	}
	n, _ := h.lim.SetCap(c)
	return n
}

// setHold applies the fleet's hold of h (on: no new attempt starts; the
// limiter's cap at 0) as of (inc, seq), the incarnation of the host's key
// and the hold's sequence: news older than what h applied is ignored.
func (h *host) setHold(on bool, inc, seq int64) {
	h.holdMu.Lock()
	defer h.holdMu.Unlock()
	if inc < h.holdInc || (inc == h.holdInc && seq <= h.holdSeq) {
		return // older news (an incarnation is the key's creation time on the server)
	}
	h.holdInc, h.holdSeq = inc, seq
	if h.holding.Load() == on {
		return
	}
	h.holding.Store(on)
	if on {
		h.lim.SetCap(0)
	} else {
		h.lim.SetCap(-1)
	}
}

// unhold lifts h's hold (local mode: each limiter decides alone).
func (h *host) unhold() {
	h.holdMu.Lock()
	defer h.holdMu.Unlock()
	if h.holding.Load() {
		h.holding.Store(false)
		h.lim.SetCap(-1)
	}
}

// heardHold acts on a hold's news, "<incarnation> <sequence> <hold> <key>"
// (after the "h "), in fleet mode only; a message that does not parse or
// names a host this process does not track is ignored.
func (f *Fleet) heardHold(payload string) {
	parts := strings.SplitN(payload, " ", 4)
	if len(parts) != 4 || !strings.HasPrefix(parts[3], f.keyPrefix) || !f.fleetMode() {
		return
	}
	inc, err1 := strconv.ParseInt(parts[0], 10, 64)
	seq, err2 := strconv.ParseInt(parts[1], 10, 64)
	if err1 != nil || err2 != nil || (parts[2] != "0" && parts[2] != "1") {
		return
	}
	f.mu.Lock()
	h := f.hosts[parts[3][len(f.keyPrefix):]]
	f.mu.Unlock()
	if h != nil && h.lim != nil {
		h.setHold(parts[2] == "1", inc, seq)
	}
}
