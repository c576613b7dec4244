package live

import (
	"math"
	"time"
)

// Meta condenses a run of the metastability scenario: a provider near its
// capacity, a trigger (ProviderConfig.Trigger) from FailAt for FailFor, and
// whether the fleet's goodput comes back once the trigger has ended.
//
// Goodput here is per payment: of the calls started in a span (by when the
// fleet made them), the share that succeeded, whenever they ended. The
// spans are before the trigger, during it, the first 10 s after it, and
// the rest of the run (until the fleet stopped starting calls).
type Meta struct {
	GoodBefore, GoodDuring, GoodAfter, GoodRest float64
	// AttemptsDuring is the attempts that reached the provider during the
	// trigger per call started during it; AttemptsAfter the attempts from
	// the trigger's end to the end of the run (its tail included) per
	// call started from the trigger's end on.
	AttemptsDuring, AttemptsAfter float64
	// Wasted is the share of the work the provider finished from the
	// trigger's end on (Window.Served) that was for a caller whose attempt
	// had already ended (Window.Wasted); Served is that work.
	Wasted float64
	Served int64
	// Recovered reports whether the goodput of the calls started in each
	// second got to at least 95% and stayed there until the fleet stopped;
	// RecoverAfter is when that began, from the trigger's end (0 if it
	// never dropped).
	// NoData reports that no call started from the trigger's end on (a
	// trigger that ends with the run): Recovered is then false, and tells
	// nothing.
	Recovered    bool
	RecoverAfter time.Duration
	NoData       bool
	// ShedLate counts the attempts failed, shed or refused from 5 s after
	// the trigger's end on.
	ShedLate int64
	// Bound is the physical bound of the share of the trigger's calls that
	// can be served without hurting new ones, min(1, (1-rho)·D / (rho·O)),
	// with rho the offered load over the capacity (Capacity/Work), D the
	// fleet's deadline and O the trigger's length; 0 when rho is unknown
	// or at least 1.
	Bound float64
	// PerSecond is the goodput of the calls started in each second of the
	// run (-1 for a second in which none started).
	PerSecond []float64
}

// MetaOf computes the [Meta] of r.
func MetaOf(r *Result) Meta {
	var m Meta
	pc, fc := r.Provider, r.Fleet
	end := pc.FailAt + pc.FailFor
	span := func(t time.Duration) int {
		switch {
		case t < pc.FailAt:
			return 0
		case t < end:
			return 1
		case t < end+10*time.Second:
			return 2
		}
		return 3
	}
	var started, ok [4]int64
	secs := int((fc.Duration + time.Second - 1) / time.Second)
	perStart, perOK := make([]int64, secs), make([]int64, secs)
	for _, c := range r.Stats.Calls {
		i := span(c.Start)
		started[i]++
		s := min(max(int(c.Start/time.Second), 0), secs-1)
		perStart[s]++
		if c.OK && (fc.Deadline <= 0 || c.Took <= fc.Deadline) { // succeeded within its deadline
			ok[i]++
			perOK[s]++
		}
	}
	share := func(a, b int64) float64 {
		if b == 0 {
			return math.NaN()
		}
		return float64(a) / float64(b)
	}
	m.GoodBefore, m.GoodDuring, m.GoodAfter, m.GoodRest =
		share(ok[0], started[0]), share(ok[1], started[1]), share(ok[2], started[2]), share(ok[3], started[3])
	var during, after, wasted int64
	for _, w := range r.Windows {
		switch {
		case w.Start >= pc.FailAt && w.Start < end:
			during += w.Attempts
		case w.Start >= end:
			after += w.Attempts
			m.Served += w.Served
			wasted += w.Wasted
			if w.Start >= end+5*time.Second {
				m.ShedLate += w.Failed + w.Shed + w.Refused
			}
		}
	}
	m.AttemptsDuring = share(during, started[1])
	m.AttemptsAfter = share(after, started[2]+started[3])
	m.Wasted = share(wasted, m.Served)
	m.PerSecond = make([]float64, secs)
	for i := range m.PerSecond {
		m.PerSecond[i] = -1
		if perStart[i] > 0 {
			m.PerSecond[i] = share(perOK[i], perStart[i])
		}
	}
	var seen bool
	m.RecoverAfter, m.Recovered, seen = recovery(m.PerSecond, end)
	m.NoData = !seen
	if pc.Capacity > 0 && pc.Work > 0 && fc.Every > 0 && pc.FailFor > 0 {
		mu := float64(pc.Capacity) / pc.Work.Seconds()
		rho := float64(fc.Clients) / fc.Every.Seconds() / mu
		if rho > 0 && rho < 1 {
			m.Bound = min(1, (1-rho)*fc.Deadline.Seconds()/(rho*pc.FailFor.Seconds()))
		}
	}
	return m
}

// recovery returns how long after end the per-second goodput got to 95%
// for good (to the last second), whether it did, and whether any second
// from end on had calls (seen; without one there is nothing to tell). The
// seconds counted are the whole ones from the first at or after end; one
// without calls tells nothing and starts nothing: recovery begins at the
// first second with calls after the last one below 95%, and is 0 when
// none from end on is below.
func recovery(perSecond []float64, end time.Duration) (after time.Duration, ok, seen bool) {
	first := int((end + time.Second - 1) / time.Second)
	at, dropped := -1, false
	for i := len(perSecond) - 1; i >= first; i-- {
		g := perSecond[i]
		if g < 0 {
			continue
		}
		seen = true
		if g < 0.95 {
			dropped = true
			break
		}
		at = i
	}
	switch {
	case at < 0:
		return 0, false, seen
	case !dropped:
		return 0, true, true
	}
	return max(time.Duration(at)*time.Second-end, 0), true, true
}
