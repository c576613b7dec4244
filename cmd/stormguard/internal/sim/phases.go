package sim

import (
	"math"
	"time"
)

// Phases are the figures of one policy's run by phase of the trigger, for
// the metastability matrix ([Meta]). Goodput here is what a dashboard
// shows: the original requests that succeeded in a phase (by the time of
// their success, whenever they started) per original request offered in
// it (by arrival); it exceeds 1 while a backlog drains.
type Phases struct {
	// Before, During, After10 and Rest are the goodput of [0,
	// TriggerStart), [TriggerStart, TriggerEnd), the first 10 s after
	// TriggerEnd and the rest of the horizon (0 for an empty phase).
	Before  float64 `json:"goodput_before"`
	During  float64 `json:"goodput_during"`
	After10 float64 `json:"goodput_after10"`
	Rest    float64 `json:"goodput_rest"`
	// AfterAttempts is the attempts that reached the provider from
	// TriggerEnd on per original request offered then.
	AfterAttempts float64 `json:"attempts_per_offered_after"`
	// Wasted is the share of the attempts the provider finished serving
	// from TriggerEnd on that it served after their client had stopped
	// waiting (the attempt timed out, or the request's deadline came):
	// work for callers who left.
	Wasted float64 `json:"wasted_after"`
	// Recovered reports whether the goodput of every span of
	// RecoveryWindow (window-aligned, to the horizon) from some time
	// after TriggerEnd on is at least RecoveryRatio (of the requests
	// offered in the span, the successes in it), and RecoverAfter how long
	// after TriggerEnd that time is (0 if not recovered: "stuck"). That
	// time must come at least 10 s (or half the time after the trigger, if
	// less) before the horizon: a good second or two at the end is not
	// told from an oscillation.
	Recovered    bool          `json:"recovered"`
	RecoverAfter time.Duration `json:"recover_after_ns"`
	// Served is the share of the original requests that arrived during
	// the trigger that succeeded (OutageGoodput), and Bound the most that
	// can be served without hurting new requests: min(1, (1-rho)·D /
	// (rho·O)) with rho the offered load over the capacity, D the
	// deadline and O the trigger's length (1 if there is no trigger or no
	// deadline, 0 if rho >= 1).
	Served float64 `json:"served_trigger"`
	Bound  float64 `json:"bound"`
}

// phases computes r.res.Phases from the run's windows.
func (r *outRun) phases() {
	c, res := r.c, &r.res
	win := func(t time.Duration) int { return min(int((t+c.Window-1)/c.Window), len(r.offeredW)) }
	sum := func(xs []int, from, to int) int {
		n := 0
		for _, x := range xs[from:to] {
			n += x
		}
		return n
	}
	ratio := func(a, b int) float64 {
		if b == 0 {
			return 0
		}
		return float64(a) / float64(b)
	}
	goodput := func(from, to int) float64 { return ratio(sum(r.doneW, from, to), sum(r.offeredW, from, to)) }
	ts, te, te10, end := win(c.TriggerStart), win(c.TriggerEnd), win(c.TriggerEnd+10*time.Second), len(r.offeredW)
	ph := &res.Phases
	ph.Before, ph.During, ph.After10, ph.Rest = goodput(0, ts), goodput(ts, te), goodput(te, te10), goodput(te10, end)
	ph.AfterAttempts = ratio(sum(res.Load, te, end), sum(r.offeredW, te, end))
	ph.Wasted = ratio(sum(r.wastedW, te, end), sum(r.servedW, te, end))
	span := int(c.RecoveryWindow / c.Window)
	rec := -1
	for w := end - span; w >= te; w-- {
		if float64(sum(r.doneW, w, w+span)) < c.RecoveryRatio*float64(sum(r.offeredW, w, w+span)) {
			break
		}
		rec = w
	}
	// A recovery must hold for minHeld before the horizon: one good span
	// at the end is not told from an oscillation.
	minHeld := min(10*time.Second, (c.Horizon-c.TriggerEnd)/2)
	if rec >= 0 && c.Horizon-time.Duration(rec)*c.Window >= minHeld {
		ph.Recovered = true
		ph.RecoverAfter = max(0, time.Duration(rec)*c.Window-c.TriggerEnd)
	}
	ph.Served = res.OutageGoodput
	ph.Bound = PhysicalBound(float64(c.Clients)*c.RatePerClient/c.Capacity, c.Deadline, c.TriggerEnd-c.TriggerStart)
}

// PhysicalBound returns min(1, (1-rho)·d/(rho·o)): the share of the
// requests made during a trigger of length o, at load rho of the
// provider's capacity and with deadline d, that can be served without
// hurting new ones (the backlog rho·o drains at 1-rho of the capacity). It
// is 1 when o or d is 0 and 0 when rho >= 1.
func PhysicalBound(rho float64, d, o time.Duration) float64 {
	switch {
	case o <= 0 || d <= 0 || rho <= 0:
		return 1
	case rho >= 1:
		return 0
	}
	return math.Min(1, (1-rho)*d.Seconds()/(rho*o.Seconds()))
}
