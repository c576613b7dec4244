package httpretry

import (
	"time"

	"github.com/stormguard/stormguard/internal/lathist"
)

// The bound on the share of races that reach their hedge delay
// (docs/hedging.md): if the delay is the q quantile of the answers'
// latency, about 1-q of the races reach it. When, over the last second,
// those that did (counted as the delay passes, answered or not) are more
// than dueFactor times 1-q of the races started, and more than dueFloor,
// the slow answers are not a tail but a stall or an overload, which more
// copies only feed: no hedge goes until the share falls back. The same
// share and floor bound the races in flight past their delay at any
// instant, which a burst queued behind a short stall fills at once while
// it is still a small part of the second's races (lathist.Dues).
const (
	dueWindow = time.Second
	dueFactor = 3
	dueFloor  = 5
)

// dueShare returns the largest share of races that may reach their delay
// within dueWindow with hedges still going, for the quantile q: dueFactor
// times 1-q, at most halfway between 1-q and every race.
func dueShare(q float64) float64 {
	return min(dueFactor*(1-q), (1+(1-q))/2)
}

// newDues returns a host's count of races and of those that reached their
// delay.
func newDues() *lathist.Dues { return lathist.NewDues(dueWindow) }

// dueAllows reports, with rs.mu held, whether a hedge of rs that is due
// may go as far as the share of hh's races that reached their delay in the
// last second allows. The first hedge counts the race among those; a later
// one, or a held race looking again a delay later, only reads the share.
// A race whose first hedge is refused is marked
// held: its answer's time is a stall's or an overload's, not the host's
// tail, and does not count in the learned delay (so a stall of a second
// does not hold the delay up for the 10 to 20 s the histogram remembers).
// The races the bound lets through still count, so a lasting change of
// the host's latency is learned.
func (rs *raceState) dueAllows(hh *hedgeHost, share float64) bool {
	if rs.due { // a later hedge, or a held race looking again
		return hh.dues.Allows(share, dueFloor)
	}
	rs.due = true // counted in flight past its delay until the race ends
	if hh.dues.Due(share, dueFloor) {
		return true
	}
	rs.held = true
	return false
}
