package live

import (
	"math"
	"slices"
	"time"
)

// summarize computes the [Summary] of r from its provider's windows and its
// fleet's stats and call records.
func summarize(r *Result) Summary {
	var s Summary
	pc, fc := r.Provider, r.Fleet
	end := pc.FailAt + pc.FailFor
	for _, w := range r.Windows {
		s.Attempts += w.Attempts
		if w.Start >= pc.FailAt && w.Start < end {
			s.OutageAttempts += w.Attempts
		}
		if w.Start >= end {
			s.ShedAfter += w.Shed + w.Refused
		}
		if w.Attempts > s.Peak {
			s.Peak, s.PeakAt = w.Attempts, w.Start
		}
	}
	if r.Stats.Offered > 0 {
		s.Amplification = float64(s.Attempts) / float64(r.Stats.Offered)
		s.Goodput = float64(r.Stats.Succeeded) / float64(r.Stats.Offered)
	}
	var took []time.Duration
	late := make([]time.Duration, 0, len(r.Stats.Calls))
	for _, c := range r.Stats.Calls {
		late = append(late, c.Late)
		during := c.Start >= pc.FailAt && c.Start < end
		if during {
			s.OutageStarted++
		}
		if c.OK {
			took = append(took, c.Took)
			if during && (fc.Deadline <= 0 || c.Took <= fc.Deadline) { // within its deadline
				s.OutageSucceeded++
			}
		}
	}
	if s.OutageStarted > 0 {
		s.OutageGoodput = float64(s.OutageSucceeded) / float64(s.OutageStarted)
		// Per request the fleet started in the outage, not per request
		// its nominal rate would have: a fleet that sends rarely (or a
		// loaded machine) offers fewer.
		s.OutageOffered = float64(s.OutageStarted)
		s.OutageAmplification = float64(s.OutageAttempts) / s.OutageOffered
	}
	s.P50, s.P99 = Percentile(took, 0.5), Percentile(took, 0.99)
	s.LateP99, s.LateMax = Percentile(late, 0.99), Percentile(late, 1)
	offered := make([]int64, len(r.Windows))
	for _, c := range r.Stats.Calls {
		if i := int((c.Start - c.Late) / pc.Window); i >= 0 && i < len(offered) {
			offered[i]++
		}
	}
	s.NormalAfter, s.Normal = backToNormal(r.Windows, offered, pc.Window, end, fc.Duration)
	return s
}

// backToNormal returns how long after end the provider got back to normal
// for good, and whether it did before stop: the first window start t >= end
// such that every span of one second starting at a window start in [t,
// stop-1s] holds no failed, shed or refused attempt, and at most 10% (and
// one) more attempts than the fleet's calls scheduled in it (offered[i]:
// the calls scheduled in window i).
func backToNormal(ws []Window, offered []int64, window, end, stop time.Duration) (time.Duration, bool) {
	span := int(max(time.Second/window, 1))
	first := int((end + window - 1) / window)
	last := min(int(stop/window), len(ws), len(offered)) - span // the last span's first window
	normal := -1
	for i := last; i >= first; i-- {
		var n, bad, calls int64
		for k := i; k < i+span; k++ {
			n += ws[k].Attempts
			bad += ws[k].Failed + ws[k].Shed + ws[k].Refused
			calls += offered[k]
		}
		if bad > 0 || float64(n) > 1.1*float64(calls)+1 {
			break
		}
		normal = i
	}
	if normal < 0 {
		return 0, false
	}
	return time.Duration(normal)*window - end, true
}

// Percentile returns the q-quantile (0 < q <= 1, nearest rank) of xs, which
// it sorts; 0 if xs is empty.
func Percentile(xs []time.Duration, q float64) time.Duration {
	if len(xs) == 0 {
		return 0
	}
	slices.Sort(xs)
	i := int(math.Ceil(q*float64(len(xs)))) - 1
	return xs[min(max(i, 0), len(xs)-1)]
}
