package fleet

import (
	"fmt"
	"strings"
	"testing"
)

// lowVolumeRun is what lowVolume measured, window by window.
type lowVolumeRun struct {
	limit    []int64 // the fleet's limit read at each window's syncs
	served   []int   // attempts started in each window
	flushed  []int   // of them, started at a sync that granted a slot to a waiting call
	waits    []float64
	gaveUp   int // calls that waited out their deadline
	arrivals int
}

// lowVolume runs the script's fleet limit (on a real Redis, explicit
// clock) for n processes that each start a call every `every` sync
// intervals (phases spread evenly), with attempts much shorter than a
// sync interval and no failure: a process whose grant is at least 1
// starts its waiting calls at that sync and the new ones as they come,
// one whose grant is 0 keeps them waiting, for at most `deadline`
// intervals. Each process syncs once per interval, the n syncs spread
// over it. It models 1000 terminals each with a fleet of its own and one
// call in flight at most (bench's per terminal + fleet + limit row).
func lowVolume(t *testing.T, n, windows int, every, deadline float64, max int64) lowVolumeRun {
	s := newLimitScript(t, max)
	type proc struct {
		pid   string
		next  float64   // the next call's arrival, in intervals
		queue []float64 // arrivals waiting for a slot
		cap   int64
		done  int // attempts started at the last sync: outcomes of the next
	}
	ps := make([]*proc, n)
	for i := range ps {
		ps[i] = &proc{pid: fmt.Sprint("p", i), next: every * float64(i) / float64(n)}
	}
	r := lowVolumeRun{}
	for w := range windows {
		r.limit = append(r.limit, 0)
		r.served = append(r.served, 0)
		r.flushed = append(r.flushed, 0)
		for i, p := range ps {
			at := float64(w) + float64(i)/float64(n) // this sync, in intervals
			ok, now := p.done, 0                     // outcomes to report; calls started since the last sync
			p.done = 0
			// Since the last sync, under the last grant: arrivals start at
			// once with a slot, else wait.
			for ; p.next <= at; p.next += every {
				r.arrivals++
				if p.cap >= 1 {
					ok++
					now++
					r.waits = append(r.waits, 0)
				} else {
					p.queue = append(p.queue, p.next)
				}
			}
			kept := p.queue[:0]
			for _, a := range p.queue {
				if at-a >= deadline {
					r.gaveUp++
				} else {
					kept = append(kept, a)
				}
			}
			p.queue = kept
			g, l := s.report(int64(t0+w*1_000_000+i*(1_000_000/n)+1), p.pid, 0, int64(len(p.queue)), uint64(ok), 0)
			r.served[w] += now
			r.limit[w] = l
			p.cap = g
			if g >= 1 && len(p.queue) > 0 {
				// The waiting calls start now, one after the other on
				// one slot (each far shorter than an interval).
				for _, a := range p.queue {
					r.waits = append(r.waits, at-a)
				}
				p.done = len(p.queue)
				r.served[w] += len(p.queue)
				r.flushed[w] += len(p.queue)
				p.queue = p.queue[:0]
			}
		}
	}
	return r
}

// TestScriptFleetLimitLowVolume measures the fleet's limit for a fleet of
// many processes that each need far less than one slot per sync interval
// (bench's per terminal + fleet + limit row: 1000 terminals, a payment
// every 2.2 s each, attempts of 20 ms, a sync every second): a slot is
// handed over at syncs only and held for its grant and the next sync, so
// a slot serves one process for two intervals however short its attempts
// are, and a call waits for its process's turn, about 2n/L intervals;
// while the calls wait, the fleet's demand (the waiting calls) stays
// above L/2 and every clean window doubles L, up to Limit.Max: the limit
// grows until it no longer binds, and the backlog that built up while it
// did goes out at once (a burst of several times the offered rate).
func TestScriptFleetLimitLowVolume(t *testing.T) {
	const n, windows, every, deadline = 1000, 16, 2.2, 20
	r := lowVolume(t, n, windows, every, deadline, 1000)
	offered := float64(n) / every
	var line strings.Builder
	for w := range r.limit {
		fmt.Fprintf(&line, " %d:L%d/%d(%d)", w, r.limit[w], r.served[w], r.flushed[w])
	}
	t.Logf("window:Llimit/started(of which waiting calls released at a grant), offered %.0f per window:%s", offered, line.String())
	var sum float64
	for _, x := range r.waits {
		sum += x
	}
	t.Logf("%d calls, %d started (mean wait %.2f intervals), %d waited out their deadline",
		r.arrivals, len(r.waits), sum/float64(len(r.waits)), r.gaveUp)
	// The limit doubles in every window while the waiting calls keep the
	// demand above L/2, whatever the attempts in flight: Max in 8 windows.
	if got := r.limit[windows-1]; got != 1000 {
		t.Errorf("the fleet's limit after %d clean windows: %d, want Limit.Max (1000)", windows, got)
	}
	// While L is small the fleet starts about L calls per interval (a
	// slot serves one process per sync), far below the offered load.
	for w := 1; w < windows; w++ {
		if r.limit[w-1] <= 40 && float64(r.served[w]) > 3*float64(r.limit[w-1])+offered*0.2 {
			t.Errorf("window %d: %d calls started under a limit of %d", w, r.served[w], r.limit[w-1])
		}
	}
	peak := 0
	for _, x := range r.served {
		peak = max(peak, x)
	}
	if float64(peak) < 2*offered {
		t.Errorf("the backlog went out in at most %d calls per interval, offered %.0f: no burst", peak, offered)
	}
	t.Logf("peak %d calls started in one interval (%.1fx the offered rate)", peak, float64(peak)/offered)
}
