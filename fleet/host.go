package fleet

import (
	"context"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/budget"
	"github.com/stormguard/stormguard/limit"
	"github.com/stormguard/stormguard/observe"
)

// host is what a Fleet keeps per destination host.
type host struct {
	f      *Fleet
	name   string
	key    string
	local  *budget.Budget
	brk    *breaker.Breaker
	budget Budget
	lim    *limit.Limiter // nil without Config.Limit

	// Counted on the success path, flushed by each sync: one atomic add
	// per call, each counter on a cache line of its own.
	_        [64]byte
	requests atomic.Uint64
	_        [56]byte
	outcomes atomic.Uint64 // successes in the low 32 bits, failures in the high 32
	_        [56]byte

	lease   lease
	leaseMu sync.Mutex   // guards leasing, and the lease's install
	leasing *leaseCall   // guarded by leaseMu: the lease request in flight, if any
	want    atomic.Int64 // retries the next lease request asks for
	waiting atomic.Int64 // callers waiting for a lease (refill), each wanting one retry

	ready     chan struct{} // closed once a sync that carried the host has ended (its reply, or its failure)
	made      time.Time     // when the host was made: its callers wait for ready at most Timeout from then
	readyOnce sync.Once
	denied    atomic.Bool // the fleet's budget is spent: refuse without asking until a sync says otherwise

	retMu   sync.Mutex
	returns []returned // guarded by retMu: unused leased retries to give back

	seen     atomic.Int64 // the fleet breaker's epoch this process last acted on (unseen: none yet)
	sentAt   atomic.Int64 // when the last sync collected h's counts, on f's clock (ns)
	closes   atomic.Int64 // closes of the breaker by its own probes
	probeAt  atomic.Int64 // when the probe of the round the fleet granted started, on f's clock (ns; 0: none; probeNext: at the next deposit)
	probeUS  atomic.Int64 // the time of the probe that closed the breaker, for the report that goes with the close (µs; 0: none)
	closesOK atomic.Int64 // closes the fleet has been told of

	// The fleet's windows at the last reply, for Budget.Stats and the tests.
	fleetRequests, fleetRetries atomic.Int64
	fleetState, fleetEpoch      atomic.Int64
	fleetCalls, fleetFailures   atomic.Int64
	granted, used, returnedN    atomic.Int64
	probeRounds                 atomic.Int64
	rate                        atomic.Uint64 // lim's rate gate, float64 bits: this process's share (0: off)
	latUS, latN                 atomic.Int64  // latency samples read from lim outside a sync, for the next report
	latMin                      atomic.Int64  // the fastest of them, µs (0: none)
	refused                     atomic.Int64  // lim's calls refused for want of a token, read outside a sync, for the next report
	fleetRate                   atomic.Int64  // the fleet-wide rate at the last reply, thousandths per second

	// The fleet's rate learns in windows of at least a second, however
	// often the process syncs: h reports to it once per window (see
	// rateReport), with the outcomes of the syncs in between.
	rateOK, rateBad atomic.Uint64 // outcomes since the last rate report
	rateAt          atomic.Int64  // when the last rate report was collected (or the first sync, see rateReport), on f's clock (ns; 0: no sync yet)
	rateNow         atomic.Bool   // the next sync reports to the rate, due or not (after a failed round trip)

	// The fleet's attempts in flight (see flight.go).
	answers    atomic.Int64 // successes since the last count sent (the script's "answered")
	flightSent atomic.Int64 // the last count sent (-1: resend)
	holding    atomic.Bool  // the fleet's hold is on: lim capped at 0
	holdMu     sync.Mutex   // guards holdInc, holdSeq and lim's cap
	holdInc    int64        // the key's incarnation and the hold's sequence of the news applied
	holdSeq    int64

	steerMu sync.Mutex // held by steer
	steerAt int64      // guarded by steerMu: the server's time of the newest state steer acted on (µs)
}

// unseen is host.seen before the first news of the fleet's breaker: a
// new host's breaker is closed and knows of no epoch, so its outcomes are
// of the fleet's current closed epoch, whichever it is (a new process's
// first failures once counted only if the fleet had never opened).
const unseen = -1

func newHost(f *Fleet, name string) (*host, error) {
	h := &host{f: f, name: name, key: f.keyPrefix + name, ready: make(chan struct{}), made: time.Now()}
	h.budget.h = h
	h.seen.Store(unseen)
	h.want.Store(1)
	var err error
	if h.local, err = budget.New(f.cfg.LocalBudget); err != nil {
		return nil, err
	}
	bc := f.cfg.Breaker
	bc.Shared = h
	if h.brk, err = breaker.New(bc); err != nil {
		return nil, err
	}
	if f.cfg.Limit != nil {
		// No gate until the first sync's share (the caller of host kicks
		// it, and waits for it at most Timeout in fleet mode).
		if h.lim, err = limit.New(*f.cfg.Limit); err != nil {
			return nil, err
		}
	}
	return h, nil
}

// markSynced records that a sync carrying h has ended.
func (h *host) markSynced() { h.readyOnce.Do(func() { close(h.ready) }) }

// maxBurst bounds the span of tokens a gate may hold (see setRate).
const maxBurst = 100 * time.Millisecond

// setRate gates h's limiter at perSecond (0: off), with a burst of one
// sync interval's tokens, at most 100 ms worth, at least one, and returns
// what the limiter reports (see limit.Limiter.SetRate): a process with a
// large share and a long interval must not send a second of its share at
// once into a host that may be full.
func (h *host) setRate(perSecond float64) (inFlight, waiting, refused int, latency, fastest time.Duration, samples int) {
	h.rate.Store(math.Float64bits(perSecond))
	return h.lim.SetRate(perSecond, max(1, perSecond*min(h.f.cfg.SyncEvery, maxBurst).Seconds()))
}

// limitReport returns h's report to the fleet's rate (nil without a
// limiter): its calls waiting now (in its limiter, and behind its breaker:
// calls an outage holds are demand too, or the process's share would fall
// to the floor during the outage and refuse them as hopeless when it
// closes) and the calls its limiter refused for want of a token since the
// last report (demand its share did not serve: without them, a process
// whose share is too small for its calls' deadlines refuses them all and
// reports no demand, and its share never grows), and its latency samples
// since the last report, or, final, that the process leaves.
func (h *host) limitReport(final bool) *limitReport {
	if h.lim == nil {
		return nil
	}
	s := &h.f.set
	r := &limitReport{pid: h.f.pid, windowUS: s.limitWindowUS, max: s.limitMax, initRate: s.limitInit}
	if final {
		r.waiting = -1
		return r
	}
	_, w, refused, lat, fastest, n := h.setRate(math.Float64frombits(h.rate.Load()))
	r.waiting = int64(w + h.brk.Snapshot().Waiters)
	r.refused = int64(refused) + h.refused.Swap(0)
	r.latUS = lat.Microseconds() + h.latUS.Swap(0)
	r.latN = int64(n) + h.latN.Swap(0)
	r.latMinUS = h.latMin.Swap(0)
	if n > 0 {
		r.latMinUS = fastestUS(r.latMinUS, fastest)
	}
	r.probeUS = h.probeUS.Swap(0)
	return r
}

// rateReport adds a sync's outcomes (ok, bad) to those the fleet's rate
// has not been told of, and returns h's report to the rate (nil without a
// limiter, or when none is due): one per rate window (a sync due within
// half a sync interval of the window's end counts), the last (final)
// always, and the first after a failed round trip (it gates the limiter again).
// The first report comes at the first sync when the sync interval is the
// window, as it always did; with shorter syncs, one window after the first
// sync, so that it carries a window's demand, not a sync's (a cold fleet's
// rate starts from a window's demand). Between two reports the
// rate's gate stays as the last reply set it: the rate's rules (package
// documentation, The fleet's rate) count a window's reports and demand
// once per process, as at a sync every window; syncs more frequent than
// that serve the breaker and the budget alone.
func (h *host) rateReport(now int64, ok, bad uint64, final bool) *limitReport {
	if h.lim == nil {
		return nil
	}
	h.rateOK.Add(ok)
	h.rateBad.Add(bad)
	now = max(now, 1)
	last := h.rateAt.Load()
	switch {
	case final || h.rateNow.Swap(false):
	case last == 0 && h.f.set.rateFirstLater:
		h.rateAt.Store(now) // the first window starts
		return nil
	case last != 0 && now-last < h.f.set.rateDue:
		return nil
	}
	h.rateAt.Store(now)
	r := h.limitReport(final)
	r.ok, r.bad = h.rateOK.Swap(0), h.rateBad.Swap(0)
	return r
}

// spread pushes the next token of h's gate out by this process's phase
// (a fraction of a token's time, fixed per process at New), when the
// breaker closes after an outage: every process of the fleet has a call
// waiting and a token then, and without it the fleet would start one
// call per process at once, whatever its rate; with it, their first
// calls are spread over a token's time (see the package documentation).
func (h *host) spread() {
	if h.lim == nil {
		return
	}
	if r := math.Float64frombits(h.rate.Load()); r > 0 {
		_, _, refused, lat, fastest, n := h.lim.SetRate(r, 1-h.f.phase)
		h.addSamples(refused, lat, fastest, n)
	}
}

// addSamples keeps what lim reported outside a sync (see setRate) for the
// next report: its refusals and its latency samples (sum, fastest, number).
func (h *host) addSamples(refused int, lat, fastest time.Duration, n int) {
	h.refused.Add(int64(refused))
	if n <= 0 {
		return
	}
	h.latUS.Add(lat.Microseconds())
	h.latN.Add(int64(n))
	for {
		m := h.latMin.Load()
		v := fastestUS(m, fastest)
		if v == m || h.latMin.CompareAndSwap(m, v) {
			return
		}
	}
}

// fastestUS is the faster of m (µs, 0: none) and d, in µs, at least 1
// (0 means none).
func fastestUS(m int64, d time.Duration) int64 {
	v := max(d.Microseconds(), 1)
	if m > 0 && m < v {
		return m
	}
	return v
}

// collect takes what the next sync sends for h: the counts since the last
// one, the leftovers of an expired lease (of any lease, if all), and news of
// a close.
func (h *host) collect(now int64, all bool) syncHost {
	o := h.outcomes.Swap(0)
	// News of a close goes with a report to the rate, with the probe's
	// time (see StateChanged: a slow probe's close may be refused).
	closed := h.closes.Load() > h.closesOK.Load() && h.brk.State() == breaker.Closed
	if closed {
		h.rateNow.Store(true)
	}
	s := syncHost{
		requests:  h.takeRequests(),
		successes: o & math.MaxUint32,
		failures:  o >> 32,
		seen:      h.seen.Load(),
		limit:     h.rateReport(now, o&math.MaxUint32, o>>32, all),
		close:     closed,
	}
	h.sentAt.Store(now)
	h.expire(now, all)
	h.retMu.Lock()
	s.returns, h.returns = h.returns, nil
	h.retMu.Unlock()
	return s
}

// takeRequests takes the requests deposited since the last sync, and
// deposits them in the local budget (in this sync's slice of its window).
func (h *host) takeRequests() uint64 {
	n := h.requests.Swap(0)
	h.local.DepositN(int(min(n, math.MaxInt32))) // at its clock's reading; the count saturates
	return n
}

// synced takes in the reply w to a sync that sent s.
func (h *host) synced(s syncHost, w hostWindow) {
	for _, r := range s.returns {
		h.returnedN.Add(r.n)
	}
	if s.close {
		h.closesOK.Store(h.closes.Load())
	}
	h.window(w.requests, w.retries, w.state, w.epoch)
	h.fleetCalls.Store(w.calls)
	h.fleetFailures.Store(w.failures)
	h.denied.Store(h.f.set.available(w.requests, w.retries) <= 0)
	if s.limit != nil && !h.f.closing.Load() {
		h.fleetRate.Store(w.fleetRate)
		// A lowered share may refuse waiters at once: they, and the
		// samples taken since the report, go in the next report.
		_, _, refused, lat, fastest, n := h.setRate(float64(w.rate) / 1000)
		h.addSamples(refused, lat, fastest, n)
	} else if h.lim != nil && w.fleetRate > 0 && !h.f.closing.Load() {
		// A sync without a report: the share keeps its part of the rate.
		old := h.fleetRate.Swap(w.fleetRate)
		if share := math.Float64frombits(h.rate.Load()); share > 0 && old > 0 && old != w.fleetRate {
			_, _, refused, lat, fastest, n := h.setRate(share * float64(w.fleetRate) / float64(old))
			h.addSamples(refused, lat, fastest, n)
		}
	}
	h.steer(w.state, w.epoch, w.at)
}

// window records the fleet's windows from a reply.
func (h *host) window(requests, retries, state, epoch int64) {
	h.fleetRequests.Store(requests)
	h.fleetRetries.Store(retries)
	h.fleetState.Store(state)
	h.fleetEpoch.Store(epoch)
}

// available returns how many more retries the fleet's window would admit:
// ⌊Ratio·requests + floor⌋ − retries, computed as the script does (with
// its allowance for the product's rounding: 0.29·100 is
// 28.999999999999996 in floating point, and 29 retries are within it).
func (s *settings) available(requests, retries int64) int64 {
	limit := math.Floor((float64(s.ratio*float64(requests)) + s.reserve) * (1 + 1e-12))
	if !(limit < math.MaxInt64) { // a floor beyond int64 (an infinite one): no limit (float64→int64 would be MinInt64)
		return math.MaxInt64
	}
	return int64(limit) - retries
}

// steer brings h's breaker in line with the fleet's breaker, the first time
// this process sees epoch: the fleet opened (trip a closed breaker) or
// closed (reset one that is not closed). at is the server's time of the
// news (a reply's, or an opening's on the channel): news older than what
// steer last acted on is ignored. It reports whether it tripped the
// breaker.
func (h *host) steer(state, epoch, at int64) bool {
	h.f.replied(at)
	return h.steerWithin(state, epoch, at, math.MaxInt64)
}

// maxAhead bounds how far past the newest reply an opening heard on the
// channel may claim to be (µs): a message from the future would make
// steer ignore every reply until then.
const maxAhead = 60_000_000

// steerWithin is steer for news at most ahead µs past the newest news
// acted on (when there is one).
func (h *host) steerWithin(state, epoch, at, ahead int64) bool {
	// One at a time, newest news only: a sync's reply that left Redis
	// before an opening the channel brought first must not close the
	// breaker the opening tripped.
	h.steerMu.Lock()
	defer h.steerMu.Unlock()
	if at < h.steerAt || (h.steerAt > 0 && at-h.steerAt > ahead) {
		return false
	}
	h.steerAt = at
	prev := h.seen.Load()
	if prev == epoch {
		return false
	}
	h.seen.Store(epoch)
	switch local := h.brk.State(); {
	case state == fleetOpen && local != breaker.Open:
		// A half-open breaker reopens too: a probe it handed out in an
		// older epoch of the fleet must not close the fleet's new opening.
		h.brk.Trip(0)
		return true
	case state == fleetClosed && local != breaker.Closed && prev != unseen:
		// A closing the process saw happen (its first news is no
		// closing: a breaker that opened on its own calls before it
		// probes on its own schedule).
		h.spread() // before the breaker releases its waiting calls
		h.brk.Reset()
	}
	return false
}

// addReturn queues n leased retries of slot s for the next sync to give back.
func (h *host) addReturn(s slot, n int64) {
	if n <= 0 {
		return
	}
	h.retMu.Lock()
	h.returns = append(h.returns, returned{s, n})
	h.retMu.Unlock()
}

// expire queues the retries left in h's lease for return if it has expired
// at now (or whatever its state, if all), and halves the next ask.
func (h *host) expire(now int64, all bool) {
	if n, s := h.lease.expire(now, all); n > 0 {
		h.addReturn(s, n)
		h.want.Store(max(h.want.Load()/2, 1))
	}
}

// Outcome counts a closed-state outcome of h's breaker for the next sync
// (part of breaker.Shared). A success is one atomic add: no lock, no
// allocation, no clock. A failure may ask for a sync (without waiting for
// it): a dependency that starts failing is news the fleet needs before the
// next interval, so that it trips while the calls that failed can still
// wait for its breaker. The first failure after a sync that carried no
// failure of any host asks for one at once; a failure that finds this
// host's unsent outcomes mostly failures asks for one a tenth of
// SyncEvery after the last sync (at once if that has passed), which goes
// only if some host's unsent outcomes are still mostly failures then (a
// failure or a burst of them, then quiet, is sent then, not at the next
// interval; a failure among successes waits for it): about ten syncs per
// interval at most, whatever the number of hosts, only while closed
// breakers see failures (once the breakers open, there are no closed-state
// outcomes), and none in local mode (a failed sync waits for the next
// interval).
func (h *host) Outcome(success bool) {
	f := h.f
	if f.flightKick != nil && h.lim != nil {
		if success {
			h.answers.Add(1)
		}
		f.kickFlight()
	}
	if success {
		h.outcomes.Add(1)
		return
	}
	o := h.outcomes.Add(1 << 32)
	if !f.fleetMode() {
		return
	}
	failures, successes := o>>32, o&math.MaxUint32
	switch {
	case failures == 1 && f.clean.Load():
		f.kickSync()
	case failures >= successes:
		f.kickLater() // the loop times it and checks again
	}
}

// failing reports whether h's unsent outcomes are mostly failures (at least
// one).
func (h *host) failing() bool {
	o := h.outcomes.Load()
	failures, successes := o>>32, o&math.MaxUint32
	return failures > 0 && failures >= successes
}

// ProbeRound asks the fleet whether this process may start a probe round
// (part of breaker.Shared). While the fleet's breaker is open, the fleet
// grants ProbeRounds rounds per probe interval, one per slot of
// OpenFor/ProbeRounds, to whichever processes ask first. While it is
// closed, a process whose breaker opened on its own calls probes on its
// own schedule (the fleet's limit would make every such process wait for
// its turn, though the fleet and the dependency are fine); one whose
// breaker the fleet opened and that missed the close is closed at once.
// In local mode, or if Redis does not answer within Timeout, the local
// breaker decides alone: yes.
func (h *host) ProbeRound() bool {
	f := h.f
	if !f.fleetMode() {
		return true
	}
	f.probeCalls.Add(1)
	tr := f.start([]string{h.key}, append(f.set.args("p", 0), itoa(h.seen.Load())), nil)
	v, err := tr.wait(f.cfg.Timeout)
	var r probeReply
	if err == nil {
		r, err = decodeProbe(v)
	}
	if err != nil {
		f.failed(tr, fmt.Errorf("fleet: probe round for %q: %w", h.name, err))
		return true
	}
	h.fleetState.Store(r.state)
	h.fleetEpoch.Store(r.epoch)
	fresh := r.epoch != h.seen.Load()
	// A closed fleet the process has not heard of: the fleet recovered
	// meanwhile, and steer closes the breaker. An open epoch it has not
	// heard of (the fleet closed and opened again since this breaker
	// opened): steer records it, so that this process's probes, if they
	// close its breaker, close the fleet's.
	h.steer(r.state, r.epoch, r.now)
	if r.state == fleetClosed && fresh {
		return true
	}
	h.probeAt.Store(0)
	if r.granted {
		h.probeRounds.Add(1)
		// With calls waiting, a waiting call takes the probe at once: the
		// time to the close is the probe's (see StateChanged).
		// With none waiting, the round's probe is the next call: its time
		// starts at its first attempt's deposit (see Budget.Deposit), not
		// now (the call may come much later), nor never (a close without
		// a probe's time is taken for a fast one: live, at a x5 slowdown
		// with few calls waiting, such closes released the backlog into
		// the slow host, and 2.7% of its work after it was for callers
		// who had left).
		if h.lim != nil {
			if h.brk.Snapshot().Waiters > 0 {
				h.probeAt.Store(max(f.since(), 1))
			} else {
				h.probeAt.Store(probeNext)
			}
		}
	}
	return r.granted
}

// probeNext in host.probeAt: the round's probe starts at the next deposit.
const probeNext = -1

// StateChanged is told every state change of h's breaker (part of
// breaker.Shared): a close by its own probes is news for the fleet, sent at
// once, with the probe's time in the report that goes with it (from the
// fleet's grant of the round, taken by a waiting call, to the close; not
// the limiter's samples, which may be the calls' before the breaker
// opened: the fleet refuses a slow probe's close for a while, see the
// package documentation, The fleet's rate).
func (h *host) StateChanged(from, to breaker.State) {
	if from == breaker.HalfOpen { // the round ends: its probe's time, if it closed the breaker
		var us int64
		if at := h.probeAt.Swap(0); at > 0 && to == breaker.Closed {
			us = max(time.Duration(h.f.since()-at).Microseconds(), 1)
		}
		h.probeUS.Store(us)
	}
	if from == breaker.HalfOpen && to == breaker.Closed {
		h.spread()
		h.closes.Add(1)
		h.f.kickSync()
	}
	if obs := h.f.obs; obs != nil {
		obs.Observe(context.Background(), observe.Event{Kind: observe.BreakerState, Name: h.name,
			From: from.String(), To: to.String()})
	}
}

var _ breaker.Shared = (*host)(nil)
