// The models of this file drive the script from one goroutine: the race
// detector has nothing to watch in them and makes them several times
// slower (45 s of the package's 80 s under -race). make test runs them in
// its pass without -race (NORACE_PKGS in the Makefile).
//
// Each model waits on Redis for most of its time (a script call per
// process per second of model time, on its own keys, with an explicit
// clock), so the three run in parallel: their results do not depend on it.

//go:build !race

package fleet

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

// rateModel runs the script's fleet-wide rate (on a real Redis, explicit
// clock) for n processes that each start a call every `every` seconds
// (random phases, seeded; a sync interval, the rate's window, is 1 s),
// against a model host. It models bench's per terminal + fleet + limit
// row: 1000 terminals, each with a fleet and a limiter of its own, one
// call at a time.
//
// Time runs in ticks of 10 ms. Each process syncs once per second (the n
// syncs spread over it), reporting its successes, drops, latency samples
// (every success: the limiter samples fewer) and calls waiting, and sets
// its gate to its share as limit.Limiter.SetRate does: a token bucket of
// max(1, share·1 s) tokens keeping its debt when the rate changes; calls
// wait in deadline order and fail fast when their turn (the next token
// plus one per call ahead, plus the host's base latency) comes after
// their deadline, on arrival or when the rate falls.
//
// The host serves `capacity` attempts per second: each start adds one
// attempt's work to its backlog, which drains at the capacity in force,
// and an attempt's latency is base + the backlog's time to drain when it
// starts (a queue in front of busy workers); with queue > 0, an attempt
// that finds that many in the backlog is shed at once (a 503). An
// attempt at or above the 1 s timeout is a drop, known 1 s after its
// start, and its call waits again; the host still does its work later
// (wasted: its caller left). A success is known (reported at the next
// sync) when it ends, its latency after its start.
// With busy > 0, the first busy processes start a call every busyEvery
// seconds instead, and during an outage only their calls are held by the
// breakers: the others' calls that come while the breakers are open fail
// at once (callers that do not wait), so that those processes come out
// of the outage with no demand while the busy ones hold a backlog.
// A process reports the calls it failed fast since its last sync, as
// host.limitReport does (the limiter's "no token" refusals).
// During a slowdown [slowAt, +slowFor) every attempt takes slowBy times
// as long (the capacity divided by slowBy, the base latency multiplied). During an outage [outageAt, +outageFor)
// every attempt fails at once (a 503); from 1 s into it (the fleet's
// breaker open) until 0.3 s after it (a probe closes it), calls are held
// by the breakers (no attempt, no outcome), then join their limiters'
// queues all at once, each process's next token pushed out by its phase
// as host.spread does.
type rateModel struct {
	n                   int
	every, deadline     float64 // s
	capacity, base      float64 // attempts per s; s
	cutAt, cutTo        float64 // from cutAt s (0: never), the host serves cutTo per s
	outageAt, outageFor float64 // s (outageFor 0: none)
	slowAt, slowFor     float64 // s (slowFor 0: none)
	slowBy              float64 // the slowdown's factor on service time
	queue               float64 // the host's queue, attempts (0: unbounded)
	windows             int
	max                 int64   // Limit.Max
	busy                int     // the first busy processes...
	busyEvery           float64 // ... start a call every busyEvery s
}

const modelTick, modelTimeout = 0.01, 1.0

type modelCall struct {
	arrival, deadline float64
	quiet             bool // on a process that is not busy (rateModel.busy)
}

type modelProc struct {
	pid          string
	next         float64
	queue        []modelCall // waiting in the limiter, deadline order
	rate         float64     // share per s; 0: no gate
	iv, tau, tat float64
	ok, bad      uint64
	latSum       float64
	latN         int64
	syncTick     int
	phase        float64        // in (0, 1): Fleet.phase
	pending      []modelOutcome // attempts in flight, by when their outcome is known
	held         int            // calls held by the breaker (reported as waiting, as host.limitReport does)
	refused      int            // calls failed fast since the last sync (reported, as host.limitReport does)
	every        float64        // s between calls
	busy         bool           // one of rateModel.busy
}

// modelOutcome is an attempt in flight: its outcome is known at due (its
// latency after its start, or the timeout's), as a limiter's Release.
type modelOutcome struct {
	due, lat float64
	ok       bool
	c        modelCall
}

// rateRun is what a rateModel run measured, per window (second).
type rateRun struct {
	rate                        []float64 // the fleet's rate at the window's last sync
	starts, served, drops       []int
	hopeless, expired           []int     // failed fast (turn after deadline) / waited out their deadline
	latency                     []float64 // mean latency of the window's attempts, s
	waiting                     []int     // calls waiting in limiters at the window's end
	arrivals                    int
	fastLeft                    []float64 // time left to the deadline of each call failed fast, s
	outageCalls, outageServed   int       // calls that arrived during the outage, and of them served
	lateCalls, lateServed       int       // calls that arrived from 5 s after the outage's end, and of them served
	beforeCalls, beforeServed   int       // calls that arrived before the outage (or the whole run)
	servedArrival, servedStart  []float64 // of each served call
	totalHopeless, totalExpired int
	maxBacklog                  float64
	backlog                     []float64 // the host's largest backlog in each window, s
	wasted                      []int     // attempts started in the window that the host served after their caller left
	// Calls on the processes that are not busy, arrived 3 to 15 s after
	// the outage's end, and of them served and failed fast.
	quietCalls, quietServed, quietHopeless int
	quietDropped                           int // calls on the processes that are not busy that came while the breakers were open
}

func (m rateModel) run(t *testing.T) rateRun {
	s := newLimitScript(t, m.max)
	ticks := int(math.Round(1 / modelTick))
	ps := make([]*modelProc, m.n)
	rng := rand.New(rand.NewPCG(42, 1))
	for i := range ps {
		every := m.every
		if i < m.busy {
			every = m.busyEvery
		}
		ps[i] = &modelProc{pid: fmt.Sprint("p", i), next: every * rng.Float64(), syncTick: i * ticks / m.n, phase: rng.Float64(),
			every: every, busy: i < m.busy}
	}
	quietAfter := m.quietAfter
	r := rateRun{}
	var backlog float64 // attempts
	type held struct {
		p *modelProc
		c modelCall
	}
	var holding []held
	var retries []modelCall
	outageEnd := m.outageAt + m.outageFor
	trigEnd := outageEnd
	if m.slowFor > 0 {
		trigEnd = m.slowAt + m.slowFor
	}
	served := func(c modelCall, at float64) {
		r.servedArrival = append(r.servedArrival, c.arrival)
		r.servedStart = append(r.servedStart, at)
		if quietAfter(c) {
			r.quietServed++
		}
		switch {
		case m.outageFor > 0 && c.arrival >= m.outageAt && c.arrival < outageEnd:
			r.outageServed++
		case trigEnd > 0 && c.arrival >= trigEnd+5 && c.arrival < trigEnd+15:
			r.lateServed++
		case m.outageFor == 0 || c.arrival < m.outageAt:
			r.beforeServed++
		}
	}
	// enqueue puts c in p's queue in deadline order, or fails it fast.
	var w int
	enqueue := func(p *modelProc, c modelCall, now float64) {
		i, _ := slices.BinarySearchFunc(p.queue, c.deadline, func(a modelCall, d float64) int {
			if a.deadline <= d {
				return -1
			}
			return 1
		})
		if p.rate > 0 && math.Max(now, p.tat-p.tau)+float64(i)*p.iv+m.base >= c.deadline {
			r.hopeless[w]++
			r.fastLeft = append(r.fastLeft, c.deadline-now)
			p.refused++
			if quietAfter(c) {
				r.quietHopeless++
			}
			return
		}
		p.queue = slices.Insert(p.queue, i, c)
	}
	for w = range m.windows {
		r.rate = append(r.rate, 0)
		r.starts, r.served, r.drops = append(r.starts, 0), append(r.served, 0), append(r.drops, 0)
		r.hopeless, r.expired, r.waiting = append(r.hopeless, 0), append(r.expired, 0), append(r.waiting, 0)
		r.backlog, r.wasted = append(r.backlog, 0), append(r.wasted, 0)
		var latSum float64
		for j := range ticks {
			now := float64(w) + float64(j)*modelTick
			capacity, base := m.capacity, m.base
			if m.cutAt > 0 && now >= m.cutAt {
				capacity = m.cutTo
			}
			if m.slowFor > 0 && now >= m.slowAt && now < m.slowAt+m.slowFor {
				capacity, base = capacity/m.slowBy, base*m.slowBy
			}
			backlog = math.Max(0, backlog-capacity*modelTick)
			failing := m.outageFor > 0 && now >= m.outageAt && now < outageEnd
			open := m.outageFor > 0 && now >= m.outageAt+1 && now < outageEnd+0.3
			if !open && len(holding) > 0 {
				// The breakers close: each process's next token is pushed
				// out by its phase (host.spread), then the held calls
				// join their limiters' queues.
				for _, p := range ps {
					if p.rate > 0 {
						p.tat = math.Max(p.tat, now+p.phase*p.iv)
					}
				}
				for _, h := range holding {
					h.p.held = 0
					if h.c.deadline <= now {
						r.expired[w]++
						continue
					}
					enqueue(h.p, h.c, now)
				}
				holding = holding[:0]
			}
			for _, p := range ps {
				// The outcomes known by now: a success with its latency, a
				// timeout (its call tries again).
				inFlight := p.pending[:0]
				for _, o := range p.pending {
					switch {
					case o.due > now+modelTick/2:
						inFlight = append(inFlight, o)
					case o.ok:
						p.ok++
						p.latSum += o.lat
						p.latN++
					default:
						p.bad++
						retries = append(retries, o.c)
					}
				}
				p.pending = inFlight
				if p.syncTick == j {
					m.sync(s, p, int64(t0+now*1e6+1), now, &r, w)
				}
				for ; p.next < now+modelTick; p.next += p.every {
					c := modelCall{arrival: p.next, deadline: p.next + m.deadline, quiet: !p.busy}
					r.arrivals++
					if quietAfter(c) {
						r.quietCalls++
					}
					switch {
					case m.outageFor > 0 && c.arrival >= m.outageAt && c.arrival < outageEnd:
						r.outageCalls++
					case trigEnd > 0 && c.arrival >= trigEnd+5 && c.arrival < trigEnd+15:
						r.lateCalls++
					case m.outageFor == 0 || c.arrival < m.outageAt:
						r.beforeCalls++
					}
					switch {
					case open && m.busy > 0 && !p.busy:
						r.quietDropped++
					case open:
						holding = append(holding, held{p, c})
						p.held++
					default:
						enqueue(p, c, now)
					}
				}
				kept := p.queue[:0]
				for _, c := range p.queue {
					if c.deadline <= now {
						r.expired[w]++
					} else {
						kept = append(kept, c)
					}
				}
				p.queue = kept
				for len(p.queue) > 0 {
					if p.rate > 0 {
						if p.tat > now+p.tau {
							break
						}
						p.tat = math.Max(p.tat, now) + p.iv
					}
					c := p.queue[0]
					p.queue = p.queue[1:]
					r.starts[w]++
					if failing {
						p.bad++
						r.drops[w]++
						retries = append(retries, c)
						continue
					}
					if m.queue > 0 && backlog >= m.queue {
						p.bad++ // shed
						r.drops[w]++
						retries = append(retries, c)
						continue
					}
					lat := base + backlog/capacity
					backlog++
					r.maxBacklog = math.Max(r.maxBacklog, backlog/capacity)
					r.backlog[w] = math.Max(r.backlog[w], backlog/capacity)
					latSum += lat
					if lat >= modelTimeout {
						r.drops[w]++
						r.wasted[w]++
						p.pending = append(p.pending, modelOutcome{due: now + modelTimeout, c: c})
						continue
					}
					p.pending = append(p.pending, modelOutcome{due: now + lat, lat: lat, ok: true})
					r.served[w]++
					served(c, now)
				}
				// A failed attempt's call tries again from the next tick
				// (behind the breaker while it is open).
				for _, c := range retries {
					if open {
						holding = append(holding, held{p, c})
						p.held++
					} else {
						enqueue(p, c, now)
					}
				}
				retries = retries[:0]
			}
		}
		for _, p := range ps {
			r.waiting[w] += len(p.queue)
		}
		if r.starts[w] > 0 {
			r.latency = append(r.latency, latSum/float64(r.starts[w]))
		} else {
			r.latency = append(r.latency, 0)
		}
		r.totalHopeless += r.hopeless[w]
		r.totalExpired += r.expired[w]
	}
	return r
}

// quietAfter reports whether c is a call on a process that is not busy,
// arrived 3 to 15 s after the outage's end (with busy processes and an
// outage).
func (m rateModel) quietAfter(c modelCall) bool {
	end := m.outageAt + m.outageFor
	return m.busy > 0 && c.quiet && m.outageFor > 0 && c.arrival >= end+3 && c.arrival < end+15
}

// sync is p's sync at now: its report, and its gate set to its share.
func (m rateModel) sync(s *limitScript, p *modelProc, us int64, now float64, r *rateRun, w int) {
	rate, R := s.reportRefused(us, p.pid, int64(len(p.queue)+p.held), int64(p.refused), p.ok, p.bad, int64(p.latSum*1e6), p.latN)
	p.ok, p.bad, p.latSum, p.latN, p.refused = 0, 0, 0, 0, 0
	r.rate[w] = R
	if rate <= 0 {
		p.rate = 0
		return
	}
	iv := 1 / rate
	tau := (math.Max(1, rate*1) - 1) * iv
	switch {
	case p.rate > 0:
		if debt := (p.tat - now) / p.iv; debt > 0 {
			p.tat = now + math.Min(debt*iv, tau+iv)
		}
	default:
		p.tat = now - tau
	}
	p.rate, p.iv, p.tau = rate, iv, tau
	kept := p.queue[:0]
	for i, c := range p.queue {
		if math.Max(now, p.tat-p.tau)+float64(len(kept))*p.iv+m.base >= c.deadline {
			r.hopeless[w]++
			r.fastLeft = append(r.fastLeft, c.deadline-now)
			p.refused++ // read by the next report (host.synced keeps SetRate's refusals)
			if m.quietAfter(c) {
				r.quietHopeless++
			}
			continue
		}
		_ = i
		kept = append(kept, c)
	}
	p.queue = kept
}

func (r rateRun) table() string {
	var b strings.Builder
	for w := range r.rate {
		fmt.Fprintf(&b, "\n  %2d R %6.1f starts %4d served %4d drops %4d wasted %4d hopeless %4d expired %4d waiting %4d latency %6.1fms backlog %4.0fms",
			w, r.rate[w], r.starts[w], r.served[w], r.drops[w], r.wasted[w], r.hopeless[w], r.expired[w], r.waiting[w], 1000*r.latency[w], 1000*r.backlog[w])
	}
	return b.String()
}

func meanOf(xs []float64) float64 {
	var s float64
	for _, x := range xs {
		s += x
	}
	return s / float64(len(xs))
}

func ints(xs []int) []float64 {
	out := make([]float64, len(xs))
	for i, x := range xs {
		out[i] = float64(x)
	}
	return out
}

// TestScriptFleetLimitLowVolume: 1000 processes, a call every 2.2 s each
// (455 per second offered), 20 s deadlines, a host that serves 500 per
// second at 20 ms: once the fleet's rate is learned (a few windows) the
// fleet starts about the offered calls every second, nothing waits out
// its deadline, and the rate stays within twice the offered load (it
// grows only while the fleet's demand reaches 3/4 of it), far from what
// Limit.Max would allow (1000 in flight at 20 ms: 50,000/s).
func TestScriptFleetLimitLowVolume(t *testing.T) {
	t.Parallel()
	m := rateModel{n: 1000, every: 2.2, deadline: 20, capacity: 500, base: 0.02, windows: 30, max: 1000}
	r := m.run(t)
	offered := float64(m.n) / m.every
	t.Logf("offered %.0f per second, host capacity %.0f:%s", offered, m.capacity, r.table())
	t.Logf("%d calls: %d served, %d failed fast, %d waited out their deadline; largest host backlog %.0fms",
		r.arrivals, len(r.servedArrival), r.totalHopeless, r.totalExpired, 1000*r.maxBacklog)
	if r.totalExpired != 0 {
		t.Errorf("%d calls waited out their deadline", r.totalExpired)
	}
	if r.totalHopeless > r.arrivals/100 {
		t.Errorf("%d of %d calls failed fast", r.totalHopeless, r.arrivals)
	}
	const warm = 5
	for w := warm; w < m.windows; w++ {
		if float64(r.starts[w]) < 0.9*offered || r.hopeless[w] > 0 {
			t.Errorf("window %d (learned): %d calls started, %d failed fast, offered %.0f", w, r.starts[w], r.hopeless[w], offered)
		}
		if r.rate[w] > 1.1*m.capacity {
			t.Errorf("window %d: fleet rate %.0f, host capacity %.0f, offered %.0f", w, r.rate[w], m.capacity, offered)
		}
	}
	if g := meanOf(ints(r.starts[warm:])); g < 0.97*offered || g > 1.03*offered {
		t.Errorf("%.1f calls started per second once learned, offered %.0f", g, offered)
	}
}

// TestScriptFleetRateFullHost: the same fleet against a host that
// serves 600 per second, cut to 300 at 10 s (below the offered load):
// latency and drops say the host is full, and the fleet's rate comes down
// to about its new capacity instead of growing; the host's queue, 2.4 s
// while the rate reacts (two windows late: the outcomes of a window are
// reported in the next one), stays below the attempt timeout once it
// has; the calls beyond its capacity fail fast (their turn is after
// their deadline), none waits out its deadline. It under-uses the host
// (see the package documentation, The fleet's rate).
func TestScriptFleetRateFullHost(t *testing.T) {
	t.Parallel()
	m := rateModel{n: 1000, every: 2.2, deadline: 20, capacity: 600, base: 0.02, windows: 45, max: 1000,
		cutAt: 10, cutTo: 300}
	r := m.run(t)
	t.Logf("offered %.0f per second, host capacity %.0f, %.0f from %.0f s:%s", float64(m.n)/m.every, m.capacity, m.cutTo, m.cutAt, r.table())
	settled := r.rate[20:]
	t.Logf("%d calls: %d served, %d failed fast, %d waited out their deadline; largest host backlog %.0fms; "+
		"windows 20-44: fleet rate %.0f on average (%.2f of capacity), at most %.0f, host served %.0f per second (%.2f), largest backlog %.0fms",
		r.arrivals, len(r.servedArrival), r.totalHopeless, r.totalExpired, 1000*r.maxBacklog,
		meanOf(settled), meanOf(settled)/m.cutTo, slices.Max(settled), meanOf(ints(r.served[20:])), meanOf(ints(r.served[20:]))/m.cutTo,
		1000*slices.Max(r.backlog[27:]))
	if g := meanOf(settled); g < 0.5*m.cutTo || g > 1.25*m.cutTo {
		t.Errorf("the fleet's rate over windows 20-44 averages %.0f, host capacity %.0f", g, m.cutTo)
	}
	if g := slices.Max(r.rate[12:]); g > 1.6*m.cutTo {
		t.Errorf("the fleet's rate reached %.0f after the cut, host capacity %.0f", g, m.cutTo)
	}
	if g := meanOf(ints(r.served[20:])); g < 0.5*m.cutTo {
		t.Errorf("the host served %.0f per second, capacity %.0f", g, m.cutTo)
	}
	if b := slices.Max(r.backlog[27:]); b >= modelTimeout {
		t.Errorf("the host's backlog reached %.0fms after the rate reacted", 1000*b)
	}
	if r.totalExpired > r.totalHopeless/20 {
		t.Errorf("%d calls waited out their deadline, %d failed fast", r.totalExpired, r.totalHopeless)
	}
}

// TestScriptFleetRateOutage: the low-volume fleet of
// TestScriptFleetLimitLowVolume, with every attempt failing for 10 s from
// 15 s. The fleet's rate falls while attempts fail (then holds: the
// breakers hold the calls, nothing is reported), then restarts from the
// last healthy rate (the rate served before the outage): the backlog and
// the new calls go out at about the fleet's rate, never in one burst (each
// process's first token after the close pushed out by its phase); the
// backlog's calls that cannot make their deadline fail fast, none waits
// out its deadline, and the calls that come after the backlog are all
// served.
func TestScriptFleetRateOutage(t *testing.T) {
	t.Parallel()
	m := rateModel{n: 1000, every: 2.2, deadline: 20, capacity: 500, base: 0.02, windows: 62, max: 1000,
		outageAt: 15, outageFor: 10}
	r := m.run(t)
	offered := float64(m.n) / m.every
	t.Logf("offered %.0f per second, host capacity %.0f, outage 15-25 s:%s", offered, m.capacity, r.table())
	rho := offered / m.capacity
	bound := math.Min(1, (1-rho)*m.deadline/(rho*m.outageFor))
	fast := 0
	for _, left := range r.fastLeft {
		if left > 1 {
			fast++
		}
	}
	healthy := meanOf(ints(r.served[10:15]))
	first := slices.IndexFunc(r.rate[26:], func(x float64) bool { return x >= 0.8*healthy })
	t.Logf("%d calls: before the outage %d/%d served; during it %d/%d served (%.1f%%, physical bound %.1f%%); "+
		"5 to 15 s after it %d/%d; %d failed fast (%d with more than 1 s left), %d waited out their deadline; "+
		"largest host backlog %.0fms; the rate back to 80%% of the last healthy rate (%.0f) in window %d; windows 26-40: %.0f started per second",
		r.arrivals, r.beforeServed, r.beforeCalls, r.outageServed, r.outageCalls, 100*float64(r.outageServed)/float64(r.outageCalls), 100*bound,
		r.lateServed, r.lateCalls, r.totalHopeless, fast, r.totalExpired, 1000*r.maxBacklog, healthy, 26+first, meanOf(ints(r.starts[26:41])))
	if first < 0 || first > 5 {
		t.Errorf("the fleet's rate not back to 80%% of the last healthy rate %.0f within 5 windows of the close", healthy)
	}
	// The restart from the last healthy rate holds: the ceiling of the
	// clean windows after it (the evidence of what the host serves) does
	// not take it back to what the outage's first, partial window served.
	if g := slices.Min(r.rate[27:31]); g < 0.95*healthy {
		t.Errorf("windows 27-30: the fleet's rate fell to %.0f after its restart, last healthy rate %.0f", g, healthy)
	}
	for w := 25; w < m.windows; w++ {
		if float64(r.starts[w]) > 1.3*m.capacity {
			t.Errorf("window %d: %d attempts started, host capacity %.0f: a burst", w, r.starts[w], m.capacity)
		}
	}
	if g := meanOf(ints(r.starts[26:41])); g < 0.8*offered {
		t.Errorf("after the outage the fleet started %.0f per second, offered %.0f", g, offered)
	}
	if r.maxBacklog >= modelTimeout/2 {
		t.Errorf("the host's backlog reached %.0fms", 1000*r.maxBacklog)
	}
	if r.lateServed < r.lateCalls*99/100 {
		t.Errorf("5 to 15 s after the outage, %d of %d new calls served", r.lateServed, r.lateCalls)
	}
	if r.totalExpired > r.totalHopeless/20 || fast < len(r.fastLeft)*95/100 {
		t.Errorf("%d calls waited out their deadline, %d failed fast (%d with more than 1 s left)", r.totalExpired, r.totalHopeless, fast)
	}
	if float64(r.outageServed) < 0.9*bound*float64(r.outageCalls) {
		t.Errorf("%d of the %d calls of the outage served, below 90%% of the physical bound %.1f%%", r.outageServed, r.outageCalls, 100*bound)
	}
}

// TestScriptFleetRateSlowdown: the low-volume fleet of
// TestScriptFleetLimitLowVolume (0.91 of the host's capacity offered)
// against a host whose queue holds 2 s of work, slowed down 5x for 10 s
// from 15 s (bench's metastability scenario, x5 trigger, without the
// breakers: the rate alone). The fleet's rate must track what the host
// can serve: during the slowdown the fleet starts at most 1.1x the calls
// offered; from 5 s after it the rate stays within 1.25x the host's
// capacity (the margin of a rate restored after an outage, until a cut:
// the slowdown's drops were one), nothing is dropped and the host's queue
// stays short; the
// work the host does after the slowdown for callers who left (attempts
// that timed out in its queue) is at most 1% of what it serves then, and
// the calls made 5 to 15 s after it are all served.
func TestScriptFleetRateSlowdown(t *testing.T) {
	m := rateModel{n: 1000, every: 2.2, deadline: 20, capacity: 500, base: 0.02, windows: 60, max: 1000,
		slowAt: 15, slowFor: 10, slowBy: 5, queue: 1000}
	r := m.run(t)
	offered := float64(m.n) / m.every
	t.Logf("offered %.0f per second, host capacity %.0f, 5x slower 15-25 s:%s", offered, m.capacity, r.table())
	end := int(m.slowAt + m.slowFor)
	var wasted, served, startsDuring int
	for w := end; w < m.windows; w++ {
		wasted += r.wasted[w]
		served += r.served[w] + r.wasted[w]
	}
	for w := int(m.slowAt); w < end; w++ {
		startsDuring += r.starts[w]
	}
	t.Logf("%d calls: %d served, %d failed fast, %d waited out their deadline; during the slowdown %d attempts (%.2f per call offered); "+
		"after it %d of %d attempts the host served wasted (%.1f%%); 5 to 15 s after it %d/%d served; rate from %d s at most %.0f (%.2f of capacity)",
		r.arrivals, len(r.servedArrival), r.totalHopeless, r.totalExpired, startsDuring, float64(startsDuring)/(offered*m.slowFor),
		wasted, served, 100*float64(wasted)/float64(served), r.lateServed, r.lateCalls, end+5, slices.Max(r.rate[end+5:]), slices.Max(r.rate[end+5:])/m.capacity)
	if float64(startsDuring) > 1.1*offered*m.slowFor {
		t.Errorf("during the slowdown the fleet started %d attempts, %.0f calls offered", startsDuring, offered*m.slowFor)
	}
	for w := end + 5; w < m.windows; w++ {
		if r.rate[w] > 1.25*m.capacity {
			t.Errorf("window %d: fleet rate %.0f, host capacity %.0f", w, r.rate[w], m.capacity)
		}
		if r.drops[w] > 0 {
			t.Errorf("window %d: %d attempts dropped", w, r.drops[w])
		}
		if r.backlog[w] >= modelTimeout/2 {
			t.Errorf("window %d: the host's backlog reached %.0fms", w, 1000*r.backlog[w])
		}
	}
	if wasted*100 > served {
		t.Errorf("after the slowdown %d of the %d attempts the host served were for callers who left", wasted, served)
	}
	if r.lateServed < r.lateCalls*99/100 {
		t.Errorf("5 to 15 s after the slowdown, %d of %d new calls served", r.lateServed, r.lateCalls)
	}
}

// TestScriptFleetRateOutageBacklog: after an outage, some processes hold
// a backlog and the others none: 100 busy processes (a call every 0.5 s
// each, 200 per second) whose calls the breakers hold during a 10 s
// outage from 15 s, and 900 quiet ones (a call every 4 s each, 225 per
// second) whose calls that come while the breakers are open fail at once
// (no demand left from the outage); 20 s deadlines, a host that serves
// 500 per second. The quiet processes' new calls, 3 to 15 s after the
// outage (the run goes on 10 s after), must all be served and none
// refused as hopeless: each process
// with demand gets at least its demand or a fair fraction of the
// fleet's rate, whatever backlog the others hold, and a call it refused
// counts as demand.
func TestScriptFleetRateOutageBacklog(t *testing.T) {
	m := rateModel{n: 1000, every: 4, busy: 100, busyEvery: 0.5, deadline: 20, capacity: 500, base: 0.02, windows: 50, max: 1000,
		outageAt: 15, outageFor: 10}
	r := m.run(t)
	t.Logf("offered %.0f per second, host capacity %.0f, outage 15-25 s:%s", float64(m.busy)/m.busyEvery+float64(m.n-m.busy)/m.every, m.capacity, r.table())
	t.Logf("%d calls: %d served, %d failed fast, %d waited out their deadline; quiet processes: %d calls failed in the outage, "+
		"3 to 15 s after it %d calls, %d served, %d failed fast; largest host backlog %.0fms",
		r.arrivals, len(r.servedArrival), r.totalHopeless, r.totalExpired, r.quietDropped, r.quietCalls, r.quietServed, r.quietHopeless, 1000*r.maxBacklog)
	if r.quietHopeless > 0 || r.quietServed < r.quietCalls {
		t.Errorf("quiet processes, 3 to 15 s after the outage: %d calls, %d served, %d failed fast", r.quietCalls, r.quietServed, r.quietHopeless)
	}
}
