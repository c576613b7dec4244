package limit

import (
	"math"
	"time"
)

// The learning core: a time-explicit state machine that turns the
// outcomes of one round trip (a window) into a new limit. It reads no
// clock; the Limiter feeds it under its mutex. doc.go explains the rules.

const (
	// initialLimit is the limit of a cold limiter (capped by Config.Max).
	initialLimit = 10
	// floorLimit is the lowest limit: one attempt in flight.
	floorLimit = 1
	// nearBaseline is how far above the baseline the mean latency of a
	// window may be for slow start to keep doubling: 1.5x.
	nearBaseline = 1.5
	// minWindow is the shortest window: at very short round trips the
	// limit moves at most once per millisecond.
	minWindow = time.Millisecond
	// outageShare is the share of drops in a window at or above which the
	// window counts as an outage (the limit halves, and slow start from
	// the last healthy limit follows the first clean window).
	outageShare = 0.5
	// lowLimit is the highest limit that counts as low for the reference
	// latency (see learner.ref) whatever the healthy limit. With g at its
	// floor of 0.5, limit·0.5 + allowance(limit) equals the limit for
	// every limit up to 4 (the allowance is then limit/2), so a limit the
	// gradient lowers without drops approaches 4 from above and never
	// gets below it: with a lower bound for "low", the limit would stay
	// near 4 with the reference at the baseline, below what a slowed
	// destination with more than 4 servers serves.
	lowLimit = 5
)

// learner is the limit's state. Not safe for concurrent use: the Limiter
// guards it with its mutex.
type learner struct {
	max     float64
	ceiling time.Duration // samples at or above it are drops; 0: none

	limit      float64
	slow       bool    // slow start: doubling per clean round trip
	healthy    float64 // the limit of the last clean, utilized window near the baseline
	healthyUp  bool    // healthy was set in slow start (a limit still climbing, not the destination's measure)
	recovering bool    // an outage window came after the last clean one
	restored   bool    // healthy was restored and no clean window confirmed it yet
	srtt       time.Duration
	recent     time.Duration // the mean latency of the last window with samples
	// capped is a cap from outside on the limit in force (Limiter.SetCap),
	// negative for none: a window run at a low cap runs at a low limit.
	capped float64
	base   baseline
	// ref is the latency the destination shows when this limiter barely
	// loads it: the minimum of the last window run at a low limit, lowered
	// by any lower window minimum since. The gradient compares with
	// max(baseline, ref): latency that stays high while the limiter sends
	// little is the destination's (slower service, or others' queue), not
	// the limiter's queue, and shrinking further would not bring it down.
	ref time.Duration
	// rate is the attempts acquired per second, smoothed over the windows
	// (weight 1/4), and last the rate of the last window alone: the rate
	// the destination was actually served at, for the hopeless checks.
	rate, last float64
	// The throughput probe (see probe): peak is the highest rate of a
	// period in which the limit bound, since the last drop or failed
	// step or fall; floor the lowest limit clean windows keep, the
	// in-flight that last raised the destination's throughput; stage 0
	// when no probe runs, 1 in the window after a probe's step (its
	// attempts count the step's burst), 2 in the period that measures
	// it; probeLimit, probeRate and probeRTT the limit, rate and
	// smoothed latency before the step.
	peak, floor           float64
	stage                 int8
	probeLimit, probeRate float64
	probeRTT              time.Duration
	pStart                time.Duration // the current period's start (0: none)
	pAttempts             int64         // attempts acquired in it
	pIn                   int64         // attempts in flight at its start
	pLimit                float64       // the limit at its start
	// prevDone and prevD: the attempts completed in the periods before
	// the current one at the same limit, and their lengths, newest first
	// (prevN of them), for the reading.
	prevDone [readPeriods - 1]int64
	prevD    [readPeriods - 1]time.Duration
	prevN    int

	// The current window.
	start     time.Duration // when it began
	end       time.Duration
	n         int64         // latency samples
	sum       time.Duration // their sum
	min       time.Duration // their minimum (0: none)
	ceilDrops int64         // sampled attempts at or above the ceiling
}

func newLearner(max int, timeout time.Duration) learner {
	c := learner{max: float64(max), slow: true, capped: -1}
	c.limit = math.Min(initialLimit, c.max)
	if timeout > 0 {
		c.ceiling = timeout / 2
		if c.ceiling == 0 {
			c.ceiling = 1 // a Timeout of 1 ns has a ceiling too
		}
	}
	return c
}

// sample records one latency sample (an attempt that was not dropped).
func (c *learner) sample(rtt time.Duration) {
	if rtt <= 0 {
		rtt = 1
	}
	if c.ceiling > 0 && rtt >= c.ceiling {
		c.ceilDrops++
		return
	}
	c.n++
	c.sum += rtt
	if c.min == 0 || rtt < c.min {
		c.min = rtt
	}
}

// due reports whether the window ends at now, with drops dropped attempts
// released in it so far: it lasts a smoothed round trip (at least
// minWindow) and holds at least min(4, limit/2) outcomes, so that one
// early answer does not decide for a whole round trip.
func (c *learner) due(now time.Duration, drops int64) bool {
	if now < c.end {
		return false // the common case, tested first: most samples come within a window
	}
	need := int64(math.Min(4, math.Ceil(c.limit/2)))
	return c.n+c.ceilDrops+drops >= need
}

// window ends the current window at now. attempts is the number of
// attempts the window saw (acquired in it), inflight the attempts in
// flight at its end, drops the attempts released as dropped in it,
// utilized whether the in-flight attempts reached half the limit. It
// returns the new limit.
func (c *learner) window(now time.Duration, attempts, inflight, drops int64, utilized bool) float64 {
	drops += c.ceilDrops
	acquired := attempts // the probe's count: not raised to the outcomes below
	if attempts < drops+c.n {
		attempts = drops + c.n
	}
	var mean time.Duration
	if c.n > 0 {
		mean = c.sum / time.Duration(c.n)
	}
	c.base.window(now, c.min, c.n, drops, attempts)
	c.measure(now, attempts)
	b := c.base.value
	was := c.limit
	if c.n > 0 && drops == 0 {
		run := was // the limit in force in the window
		if c.capped >= 0 && c.capped < run {
			run = c.capped
		}
		if run <= math.Max(lowLimit, c.healthy/8) || c.min < c.ref {
			c.ref = c.min
		}
	}
	ref := max(b, c.ref)
	if drops > 0 && c.restored {
		// The restored limit met drops at once: the destination takes
		// less than it did; remember half of it.
		c.healthy *= 0.5
		c.restored = false
	}
	switch share := float64(drops) / math.Max(1, float64(attempts)); {
	case share >= outageShare:
		c.forget()
		c.recovering, c.slow = true, false
		c.limit *= 0.5
	case drops > 0:
		c.forget()
		if c.slow {
			c.limit *= 0.5 // undo the last doubling
			c.slow = false
		} else {
			c.limit *= math.Max(0.5, 1-share)
		}
	case c.n == 0:
		// No news.
	default:
		c.clean(now, mean, b, ref, was, acquired, inflight, utilized)
	}
	c.limit = math.Max(floorLimit, math.Min(c.max, c.limit))
	if c.n > 0 {
		if c.srtt == 0 {
			c.srtt = mean
		} else {
			c.srtt += (mean - c.srtt) / 4
		}
		c.recent = mean
	}
	c.end = now + max(minWindow, c.srtt)
	c.n, c.sum, c.min, c.ceilDrops = 0, 0, 0, 0
	return c.limit
}

// clean moves the limit on a window without drops, with latency samples
// (mean, their mean; b, the baseline; ref, the reference latency; was,
// the limit in force): recovery, slow start, or the gradient and its
// probe; it remembers a healthy limit.
func (c *learner) clean(now, mean, b, ref time.Duration, was float64, acquired, inflight int64, utilized bool) {
	near := float64(mean) <= nearBaseline*float64(b)
	restoring, settled := c.recovering, false
	wasSlow := c.slow
	if c.recovering {
		// Slow start again, from the last healthy limit (from the
		// initial limit if there is none yet). A healthy limit the
		// gradient held (not one slow start was still doubling) is
		// the destination's measure: it is restored as it is, and
		// the gradient goes on from it (doubling it would send twice
		// what the destination took into its first round trip back).
		c.recovering, c.slow = false, true
		if near {
			restore := c.healthy
			if restore == 0 {
				restore = math.Min(initialLimit, c.max)
			}
			c.limit = math.Max(c.limit, restore)
			c.restored = true
			if c.healthy > 0 && !c.healthyUp && c.limit == c.healthy {
				c.slow, settled = false, true
			}
		}
	} else if near {
		c.restored = false
	}
	g := math.Max(0.5, math.Min(1, float64(ref)/float64(mean)))
	switch {
	case settled:
		// The restored limit stands for this window.
	case c.slow && near:
		if utilized {
			c.limit *= 2
		}
	case c.slow:
		// Latency left the baseline: the limit that would keep it
		// there is limit·b/mean (Little's law); keep a queue
		// allowance above it.
		c.slow = false
		c.limit = c.limit*g + allowance(c.limit*g)
	default:
		next := c.limit*g + allowance(c.limit)
		if next > c.limit && !utilized {
			next = c.limit
		}
		c.limit = c.probe(now, acquired, inflight, c.limit+(next-c.limit)/2, mean < 2*ref)
	}
	if near && utilized && !restoring {
		// was carried a round trip near the baseline (the window
		// that restores a limit ran at the outage's limit, not one
		// to remember).
		c.healthy, c.healthyUp = was, wasSlow
	}
}

// measure takes the rate of the window that ends at now, in which
// attempts were acquired.
func (c *learner) measure(now time.Duration, attempts int64) {
	if d := now - c.start; d > 0 && c.start > 0 {
		c.last = float64(attempts) / d.Seconds()
		if c.rate == 0 {
			c.rate = c.last
		} else {
			c.rate += (c.last - c.rate) / 4
		}
	}
	c.start = now
}

// Probe thresholds.
const (
	// probeBelow: a clean period whose reading (see probe) is below
	// this share of the peak, and in which the gradient would lower the
	// limit, starts a probe.
	probeBelow = 0.95
	// probeGain: a probe's step raised the throughput when the rate grew
	// by at least this share of the limit's growth.
	probeGain = 0.5
	// probeQueue: a probe's step counts only when the smoothed latency
	// grew by at most this share of the limit's growth: a step that
	// queues at the destination (or takes a share of it from other
	// clients) raises the latency with the rate.
	probeQueue = 0.25
	// probeFull: the limit binds when the attempts in flight (rate times
	// smoothed latency, Little's law) average at least this share of it;
	// only then does a probe start or a step count.
	probeFull = 0.8
	// floorLost: a period whose rate is below this share of the peak
	// forgets the floor and is the new peak (the destination serves
	// less: a capacity cut, a slower service).
	floorLost = 0.5
	// periodAttempts and periodWindows: a probe's period (over which
	// the rate is measured) holds at least this many attempts and lasts
	// at least this many smoothed round trips.
	periodAttempts = 64
	periodWindows  = 4
	// readPeriods: a reading spans at most this many periods at one
	// limit; only a reading over all of them raises the peak.
	readPeriods = 4
)

// probe returns the limit of a clean gradient window that ends at now,
// given next, the gradient's, attempts, the attempts acquired in the
// window, and inflight, the attempts in flight at its end. Latency above
// the baseline is not always a queue at the destination: a round trip
// may spend time outside it (the network, the client's own work on a
// loaded machine), and the gradient then settles below the in-flight the
// destination needs for its full throughput. So (calm: the window's mean
// latency is below twice the reference) the rate served is measured over
// periods (at least 64 attempts and 4 round trips), counting the
// attempts completed in the period (acquired, less the growth of the
// attempts in flight: a climbing limit acquires more than the
// destination answers, and would set the peak above its rate). The
// reading is the rate over the period and up to 3 before it while the
// limit stayed within half a step over each (a burst of answers split at
// a boundary between them then cancels); only a reading over 4 periods
// raises the peak (or the first reading sets it). When the reading is
// below 95% of the peak while the limit binds and the gradient would
// lower the limit, the limit grows by its allowance, and keeps growing
// period after period as long as each step raises the period's rate by
// at least half the step's share without raising the smoothed latency by
// more than a quarter of it (TCP Vegas and BBR probe alike); the last limit that
// raised it is a floor clean windows do not lower the limit below (the
// floor never raises it). A step that does not raise it ends the probe
// (the destination is at its capacity: the rate is the new peak). Drops
// forget the floor and the peak; a period whose rate is below half the
// peak forgets the floor and is the new peak.
func (c *learner) probe(now time.Duration, attempts, inflight int64, next float64, calm bool) float64 {
	c.pAttempts += attempts
	keep := math.Max(next, math.Min(c.floor, c.limit)) // never raised by the floor
	if c.stage == 1 {
		// The window after a step: its attempts count the step's burst.
		c.stage = 2
		c.newPeriod(now, inflight)
		return c.limit
	}
	d := now - c.pStart
	if c.pStart == 0 || c.pAttempts < periodAttempts || d < periodWindows*c.srtt {
		if c.pStart == 0 {
			c.newPeriod(now, inflight)
		}
		if c.stage == 2 {
			return c.limit // hold the step until measured
		}
		return keep
	}
	// The rate counts the attempts completed in the period: those
	// acquired less the growth of the attempts in flight (while the
	// limit climbs, more are acquired than the destination answers).
	done := max(0, c.pAttempts-(inflight-c.pIn))
	rate := float64(done) / d.Seconds()
	full := rate*c.srtt.Seconds() >= probeFull*c.limit
	// The reading that starts a step: the rate over this period and up
	// to 3 before it, as long as they ran at the same limit (it moved by
	// less than half a step over each), else this period's. Answers that
	// come in bursts fall on one side of a boundary or the other; over
	// consecutive periods the boundaries between them cancel. Only a
	// reading over 4 periods (settled) raises the peak (a lone period's
	// reading sets the first).
	same := math.Abs(c.limit-c.pLimit) < allowance(c.limit)/2
	sumDone, sumD, n := done, d, 0
	if same {
		n = c.prevN
	}
	for i := range n {
		sumDone += c.prevDone[i]
		sumD += c.prevD[i]
	}
	reading := float64(sumDone) / sumD.Seconds()
	settled := n == readPeriods-1
	c.newPeriod(now, inflight)
	if same {
		copy(c.prevDone[1:], c.prevDone[:])
		copy(c.prevD[1:], c.prevD[:])
		c.prevDone[0], c.prevD[0] = done, d
		c.prevN = min(n+1, readPeriods-1)
	}
	if rate < floorLost*c.peak {
		// The destination serves less (a capacity cut, a slower
		// service): this rate is its peak, and the floor is lost.
		c.floor, c.peak = 0, rate
	}
	if c.stage == 2 {
		c.stage = 0
		grew := c.limit/c.probeLimit - 1
		if calm && full && rate >= c.probeRate*(1+probeGain*grew) &&
			c.srtt <= time.Duration(float64(c.probeRTT)*(1+probeQueue*grew)) {
			c.floor = c.limit
			c.peak = math.Max(c.peak, rate)
			return c.step(rate)
		}
		// The destination is at its capacity: this rate is its peak.
		c.peak = rate
		return keep
	}
	if calm && full && next < c.limit && reading < probeBelow*c.peak && c.limit < c.max {
		return c.step(reading)
	}
	if full && (settled || c.peak == 0) {
		c.peak = math.Max(c.peak, reading)
	}
	return keep
}

// newPeriod starts a probe's period at now, with inflight attempts in
// flight, and forgets the previous one.
func (c *learner) newPeriod(now time.Duration, inflight int64) {
	c.pStart, c.pAttempts, c.pIn, c.pLimit = now, 0, inflight, c.limit
	c.prevN = 0
}

// step starts a probe's step from a limit that served rate: the limit
// grows by its allowance.
func (c *learner) step(rate float64) float64 {
	c.stage = 1
	c.probeLimit, c.probeRate, c.probeRTT = c.limit, rate, c.srtt
	return c.limit + allowance(c.limit)
}

// forget ends a probe and forgets the floor, the peak and the period (a
// window with drops, or one that is not a settled gradient window).
func (c *learner) forget() {
	c.stage, c.floor, c.peak, c.pStart, c.pAttempts, c.prevN = 0, 0, 0, 0, 0, 0
}

// served returns the rate the destination is served at, in attempts per
// second, for the hopeless checks: the highest of the smoothed measured
// rate, the last window's, and lim (the limit in force) per smoothed
// round trip, so that a call is refused as hopeless only when no estimate
// would serve it in time (0 while nothing is measured).
func (c *learner) served(lim float64) float64 {
	r := math.Max(c.rate, c.last)
	if c.srtt > 0 {
		r = math.Max(r, lim/c.srtt.Seconds())
	}
	return r
}

// allowance is the queue the limit allows above the capacity it measured
// (the gradient family's "queue size"): sqrt(limit), at most half of it,
// so that a window at twice the baseline latency never raises the limit.
func allowance(limit float64) float64 { return math.Min(math.Sqrt(limit), limit/2) }

// Baseline: the no-load latency, the minimum over recent healthy buckets.
const (
	baseBucket  = 10 * time.Second // one bucket of the baseline's history
	baseBuckets = 6                // healthy buckets kept: 60 s of healthy traffic
	// incidentRatio: a bucket whose best sample is above this multiple of
	// the baseline is an incident bucket.
	incidentRatio = 2
	// incidentDrops: a bucket with more than this share of drops is an
	// incident bucket.
	incidentDrops = 0.01
	// resetAfter: an incident that lasts this long is the new normal: the
	// baseline is relearned from its last bucket.
	resetAfter = 5 * time.Minute
)

// baseline is the minimum latency of the last baseBuckets healthy buckets
// and of the current one. Incident buckets (drops, or latency far above
// the baseline, or no sample) do not push healthy ones out, so the
// baseline holds through an incident instead of drifting up to its
// latency; it rises only as healthy buckets age out (at most once per
// bucket, to the minimum of the last minute of healthy traffic), or after
// resetAfter of continuous incident.
type baseline struct {
	value    time.Duration // 0: no sample yet
	ring     [baseBuckets]time.Duration
	next     int
	started  bool
	end      time.Duration // end of the current bucket
	cur      bucketStats
	incident bool
	since    time.Duration // start of the incident
}

type bucketStats struct {
	min                time.Duration
	n, drops, attempts int64
}

func (b *baseline) window(now, min time.Duration, n, drops, attempts int64) {
	if !b.started {
		b.started, b.end = true, now+baseBucket
	}
	if n > 0 && (b.cur.min == 0 || min < b.cur.min) {
		b.cur.min = min
	}
	b.cur.n += n
	b.cur.drops += drops
	b.cur.attempts += attempts
	if now >= b.end {
		b.rotate(now)
	}
	b.value = b.ringMin()
	if b.cur.min > 0 && (b.value == 0 || b.cur.min < b.value) {
		b.value = b.cur.min
	}
}

func (b *baseline) rotate(now time.Duration) {
	cur := b.cur
	healthy := cur.n > 0 && float64(cur.drops) <= incidentDrops*float64(cur.attempts) &&
		(b.value == 0 || float64(cur.min) <= incidentRatio*float64(b.value))
	if b.incident && now-b.end > baseBucket {
		// No window for over a bucket past the bucket's end: no traffic,
		// and an idle spell is not incident time (an incident the traffic
		// comes back to goes on counting from where it stopped). A shorter
		// gap is a busy destination's sparse samples (windows end on
		// sampled releases, seconds apart with one call in flight at 100
		// ms): counted as idle, it put a 5-minute reset at 6.5 minutes.
		b.since += now - b.end
	}
	switch {
	case healthy:
		b.push(cur.min)
		b.incident = false
	case !b.incident:
		b.incident, b.since = true, b.end-baseBucket
	case now-b.since >= resetAfter && cur.n > 0:
		b.ring = [baseBuckets]time.Duration{}
		b.next = 0
		b.push(cur.min)
		b.value = 0
		b.incident = false
	}
	b.cur = bucketStats{}
	b.end = now + baseBucket
}

func (b *baseline) push(min time.Duration) {
	b.ring[b.next] = min
	b.next = (b.next + 1) % baseBuckets
}

func (b *baseline) ringMin() time.Duration {
	var m time.Duration
	for _, v := range b.ring {
		if v > 0 && (m == 0 || v < m) {
			m = v
		}
	}
	return m
}
