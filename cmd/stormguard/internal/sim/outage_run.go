package sim

import (
	"fmt"
	"math"
	"math/rand/v2"
	"time"

	"github.com/stormguard/stormguard/backoff"
	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/cmd/stormguard/internal/limit"
	"github.com/stormguard/stormguard/cmd/stormguard/internal/sat"
	"github.com/stormguard/stormguard/cmd/stormguard/internal/waitq"
	"github.com/stormguard/stormguard/retry"
)

// The outage experiment's run: the event loop, the requests and their
// attempts, and the provider.

// Outage runs the outage experiment described at [OutageConfig], once per
// policy over the same arrivals. It is deterministic for a given config,
// and returns an error wrapping [ErrInvalidConfig] for settings it cannot
// run. It shares no state between calls, so it is safe for concurrent use;
// one call runs on one goroutine.
func Outage(c OutageConfig) (*OutageResult, error) {
	if len(c.Policies) == 0 {
		c.Policies = DefaultOutagePolicies()
	}
	if err := c.validate(); err != nil {
		return nil, err
	}
	res := &OutageResult{Config: c, Policies: make([]OutagePolicyResult, 0, len(c.Policies))}
	res.Config.Progress = nil // the result is plain data
	var buf outBuffers
	for i, p := range c.Policies {
		r, err := c.run(i, p, &buf)
		if err != nil {
			return nil, err
		}
		res.Policies = append(res.Policies, r)
		if c.Progress != nil {
			c.Progress(i+1, len(c.Policies))
		}
	}
	return res, nil
}

// Outage event kinds.
const (
	outArrive    = iota // a new original request
	outSend             // a request's next attempt is due (after its sleep)
	outSuccess          // an attempt's success reaches the client
	outFailure          // an attempt's failure (a 503, a timeout) reaches the client
	outDeadline         // the request's deadline cuts its attempt in flight
	outWaitEnd          // the request's deadline, if it is still waiting
	outRelease          // a waiting request's turn after the breaker closed
	outRound            // a breaker's open period ends: a probe round is due
	outGrant            // a breaker half-opened: its probes go to the waiting calls
	outArm              // a breaker opened: arm a probe round for its waiting calls
	outPace             // a tick of a breaker's release pacer
	outSync             // a fleet sync group syncs
	outLimGo            // a request's limiter granted it a slot: send
	outLimGiveUp        // a request waiting for its limiter gives up
)

// Request states.
const (
	reqIdle      = iota // between attempts (sleeping, or about to send)
	reqWaiting          // waiting behind its breaker
	reqReleasing        // waiting, with a release scheduled
	reqFlight           // an attempt in flight
	reqDone             // succeeded or gave up
	reqLimWait          // waiting for a slot of its limiter
	reqLimGo            // granted a slot, about to send
)

// What an attempt's failure was, for the error handed to the plan.
const (
	failTrigger = iota // the outage's 503
	failShed           // 503 from a full queue
	failTimeout        // no answer within Timeout
)

// outRequest is one original request and its retries.
type outRequest struct {
	plan     func(error, time.Duration) (time.Duration, retry.Reason) // the policy's decision step for this request
	permit   breaker.Permit                                           // of the attempt in flight (zero: none)
	arrived  time.Duration                                            // when the original request was made
	deadline time.Duration                                            // arrived + Deadline (if there is one)
	client   int32
	attempts int32                // attempts sent so far
	wait     *waitq.Waiter[int32] // its place in its breaker's wait list while it waits
	lwait    *waitq.Waiter[int32] // its place in its limiter's wait list while it waits
	slot     limit.Permit         // its limiter's slot for the attempt in flight
	limAt    time.Duration        // when it gives up waiting for its limiter
	release  uint32               // the breaker's epoch its release was scheduled in
	gen      uint32               // the breaker's epoch permit was issued in
	state    uint8
	fail     uint8 // failTrigger, failShed or failTimeout: the last failure
}

// provError is a failed attempt as the client sees it: a 503 (with the
// provider's Retry-After if the policy reads it) or a timeout. Both are
// retryable for retry.IsRetryable.
type provError struct {
	msg     string
	hint    time.Duration
	timeout bool
}

func (e *provError) Error() string             { return e.msg }
func (e *provError) RetryAfter() time.Duration { return e.hint }
func (e *provError) Timeout() bool             { return e.timeout }
func (e *provError) Temporary() bool           { return true }

// outRun is one policy's run: the state of the fleet and the provider.
type outRun struct {
	c    *OutageConfig
	p    OutagePolicy
	now  time.Duration
	q    eventQueue
	reqs []outRequest

	bo     *backoff.Backoff
	bu     func() float64 // the breakers' random source
	units  []*outUnit     // per client, per sync group, or one
	brks   []*simBreaker
	fleet  *outFleet
	groups int
	errs   [3]*provError // per fail kind, as the policy sees it

	prov provider

	spare []*waitq.Waiter[int32] // wait-list places no request holds, for reuse

	offeredW []int           // original requests per window of arrival
	okW      []int           // ... of which succeeded
	doneW    []int           // original requests that succeeded, per window of success
	servedW  []int           // attempts the provider finished serving, per window
	wastedW  []int           // ... after their client had stopped waiting
	latency  []time.Duration // of each success
	res      OutagePolicyResult
}

// outBuffers is the storage one policy's run leaves to the next.
type outBuffers struct {
	q       eventQueue
	reqs    []outRequest
	latency []time.Duration
}

func (c *OutageConfig) run(i int, p OutagePolicy, buf *outBuffers) (OutagePolicyResult, error) {
	if p.Attempts < 1 {
		p.Attempts = 1
	}
	bo, err := p.backoff(c, rand.New(rand.NewPCG(c.Seed, 2+uint64(i))).Float64)
	if err != nil {
		return OutagePolicyResult{}, fmt.Errorf("%w: policy %s: %w", ErrInvalidConfig, p.Name, err)
	}
	windows := int((c.Horizon + c.Window - 1) / c.Window)
	if buf.reqs == nil {
		expected := float64(c.Clients) * c.RatePerClient * c.Horizon.Seconds()
		buf.reqs = make([]outRequest, 0, int(expected+4*math.Sqrt(expected)+16))
	}
	buf.q.reset()
	r := &outRun{
		c:        c,
		p:        p,
		q:        buf.q,
		reqs:     buf.reqs[:0],
		bo:       bo,
		bu:       rand.New(rand.NewPCG(c.Seed, 1<<32+uint64(i))).Float64,
		prov:     newProvider(c),
		offeredW: make([]int, windows),
		okW:      make([]int, windows),
		doneW:    make([]int, windows),
		servedW:  make([]int, windows),
		wastedW:  make([]int, windows),
		latency:  buf.latency[:0],
		res: OutagePolicyResult{
			Policy:    p,
			Load:      make([]int, windows),
			Successes: make([]int, windows),
		},
	}
	r.errs = [3]*provError{
		failTrigger: {msg: "503 (outage)"},
		failShed:    {msg: "503 (queue full)"},
		failTimeout: {msg: "attempt timed out", timeout: true},
	}
	if p.RetryAfter {
		r.errs[failTrigger].hint, r.errs[failShed].hint = c.RetryAfter, c.ShedRetryAfter
	}
	if err := r.setup(); err != nil {
		return OutagePolicyResult{}, err
	}
	arrivals := rand.New(rand.NewPCG(c.Seed, 1))
	mean := float64(time.Second) / (float64(c.Clients) * c.RatePerClient)
	// nextArrival schedules the next original request, in float64 so that
	// a very long gap cannot overflow.
	nextArrival := func() {
		if gap := arrivals.ExpFloat64() * mean; gap < float64(c.Horizon-r.now) {
			r.q.push(r.now+time.Duration(gap), -1, outArrive)
		}
	}
	nextArrival()
	for r.q.len() > 0 {
		e := r.q.pop()
		r.now = e.at
		switch e.kind {
		case outArrive:
			r.arrive(int32(arrivals.IntN(c.Clients)))
			nextArrival()
		case outSend:
			r.attempt(e.who)
		case outSuccess:
			r.succeeded(e.who)
		case outFailure:
			r.failed(e.who)
		case outDeadline:
			r.cut(e.who)
		case outWaitEnd:
			r.waitEnd(e.who)
		case outRelease:
			r.release(e.who)
		case outRound:
			sb := r.brks[e.who]
			sb.armed = false
			r.grant(sb)
			r.arm(sb)
		case outGrant:
			r.grant(r.brks[e.who])
		case outArm:
			r.arm(r.brks[e.who])
		case outPace:
			r.paceTick(r.brks[e.who])
		case outSync:
			r.sync(e.who)
		case outLimGo:
			if r.reqs[e.who].state == reqLimGo {
				r.transmit(e.who)
			}
		case outLimGiveUp:
			r.limGiveUp(e.who)
		}
	}
	r.finish()
	buf.q, buf.reqs, buf.latency = r.q, r.reqs, r.latency
	return r.res, nil
}

// clock is the simulated clock, for the budgets and the breakers.
func (r *outRun) clock() time.Time { return epoch.Add(r.now) }

// window returns the index of the window holding t < Horizon.
func (r *outRun) window(t time.Duration) int { return int(t / r.c.Window) }

func (r *outRun) inTrigger(t time.Duration) bool {
	return t >= r.c.TriggerStart && t < r.c.TriggerEnd
}

// after schedules an event d from now, unless it falls at or after the
// horizon (so no sum can overflow).
func (r *outRun) after(d time.Duration, id int32, kind uint8) {
	if d < r.c.Horizon-r.now {
		r.q.push(r.now+max(d, 0), id, kind)
	}
}

// left returns the time left before request id's deadline, or 0 if it has
// none (as the decision step of retry.Policy.Plan takes it).
func (r *outRun) left(req *outRequest) time.Duration {
	if r.c.Deadline == 0 {
		return 0
	}
	return req.deadline - r.now
}

// expired reports whether req's deadline has passed.
func (r *outRun) expired(req *outRequest) bool {
	return r.c.Deadline > 0 && r.now >= req.deadline
}

// arrive makes a new original request of client k and sends its first
// attempt.
func (r *outRun) arrive(k int32) {
	id := int32(len(r.reqs))
	u := r.unitOf(k)
	r.reqs = append(r.reqs, outRequest{plan: u.pol.Plan(), client: k, arrived: r.now, deadline: sat.Add(r.now, r.c.Deadline)})
	r.res.Offered++
	r.offeredW[r.window(r.now)]++
	if r.inTrigger(r.now) {
		r.res.OutageOffered++
	}
	r.attempt(id)
}

// attempt makes request id's next attempt now, as the retry loop does
// before each attempt: stop at the deadline, ask the breaker (and wait for
// it, if the policy does), then send.
func (r *outRun) attempt(id int32) {
	req := &r.reqs[id]
	req.state = reqIdle
	if r.expired(req) {
		r.giveUp(id, retry.Deadline)
		return
	}
	if sb := r.unitOf(req.client).brk; sb != nil {
		r.grant(sb) // the waiting calls get a due round's probes first
		p, err := sb.b.Allow()
		if err != nil {
			if !r.wait(id, sb, err) {
				r.giveUp(id, retry.CircuitOpen)
			}
			return
		}
		req.permit, req.gen = p, sb.epoch
	}
	r.send(id)
}

// transmit sends request id's attempt to the provider now, the breaker
// having admitted it.
func (r *outRun) transmit(id int32) {
	req := &r.reqs[id]
	u := r.unitOf(req.client)
	if req.attempts == 0 && u.dep != nil {
		u.dep.Deposit() // the first attempt that is sent deposits
	}
	req.attempts++
	req.state = reqFlight
	if req.attempts > 1 {
		r.res.Retries++
	}
	now := r.now
	w := r.window(now)
	r.res.Attempts++
	r.res.Load[w]++
	c := r.c
	if r.inTrigger(now) {
		r.res.OutageAttempts++
		if c.Trigger == TriggerError {
			req.fail = failTrigger
			r.failed(id) // a fast 503: the client hears of it at once
			return
		}
	}
	finish, ok := r.prov.admit(now)
	if !ok {
		r.res.Shed++
		req.fail = failShed
		r.failed(id) // a fast 503: the client hears of it at once
		return
	}
	failing := c.Trigger == TriggerError && r.inTrigger(finish)
	inTime := finish-now <= c.Timeout && (c.Deadline == 0 || finish < req.deadline)
	if !failing && finish < c.Horizon {
		fw := r.window(finish)
		r.servedW[fw]++
		if !inTime {
			r.wastedW[fw]++ // served after its client stopped waiting
		}
	}
	switch {
	case inTime:
		if failing {
			req.fail = failTrigger
			r.after(finish-now, id, outFailure)
		} else {
			r.res.Successes[w]++
			r.after(finish-now, id, outSuccess)
		}
	case c.Deadline > 0 && req.deadline-now < c.Timeout:
		// The call's deadline ends the attempt; the provider still does
		// the work later.
		r.after(req.deadline-now, id, outDeadline)
	default:
		// The client gives up on the attempt; the provider still does the
		// work later.
		r.res.TimedOut++
		req.fail = failTimeout
		r.after(c.Timeout, id, outFailure)
	}
}

// succeeded handles the success of request id's attempt.
func (r *outRun) succeeded(id int32) {
	req := &r.reqs[id]
	r.report(req, true, 0)
	r.limRelease(req, false)
	req.state = reqDone
	r.res.Succeeded++
	r.okW[r.window(req.arrived)]++
	r.doneW[r.window(r.now)]++
	if r.inTrigger(req.arrived) {
		r.res.OutageSucceeded++
	}
	r.latency = append(r.latency, r.now-req.arrived)
}

// failed handles the failure of request id's latest attempt: retry or give
// up, as the policy's plan says.
func (r *outRun) failed(id int32) {
	req := &r.reqs[id]
	err := r.errs[req.fail]
	probe := req.permit.Probe()
	r.report(req, false, err.hint)
	r.limRelease(req, true)
	if r.expired(req) {
		r.giveUp(id, retry.Deadline)
		return
	}
	if probe && r.c.Deadline > 0 {
		// A probe the breaker handed to this request failed: the
		// request goes back to waiting, spending no attempt of its plan
		// and no budget (as the retry loop does).
		r.attempt(id)
		return
	}
	sleep, stop := req.plan(err, r.left(req))
	if stop != 0 {
		r.giveUp(id, stop)
		return
	}
	req.state = reqIdle
	r.after(sleep, id, outSend)
}

// cut ends request id's attempt at its deadline: the breaker gets the
// permit back without an outcome, and the request gives up.
func (r *outRun) cut(id int32) {
	req := &r.reqs[id]
	r.limRelease(req, true)
	if sb := r.unitOf(req.client).brk; sb != nil && req.permit != (breaker.Permit{}) {
		sb.b.Cancel(req.permit) // a probe's slot goes to a waiting call
		req.permit = breaker.Permit{}
		r.q.push(r.now, sb.idx, outGrant)
	}
	r.giveUp(id, retry.Deadline)
}

// giveUp ends request id without success, for reason.
func (r *outRun) giveUp(id int32, reason retry.Reason) {
	r.reqs[id].state = reqDone
	switch reason {
	case retry.BudgetExhausted:
		r.res.BudgetDenied++
	case retry.CircuitOpen:
		r.res.BreakerRejected++
	case retry.Deadline:
		r.res.DeadlineExceeded++
	}
}
