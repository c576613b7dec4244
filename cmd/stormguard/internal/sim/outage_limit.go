package sim

import (
	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/cmd/stormguard/internal/limit"
	"github.com/stormguard/stormguard/cmd/stormguard/internal/waitq"
)

// The clients' concurrency limiters in the outage experiment (policies
// with Limit): package limit's limiter, modelled on the simulated clock by
// internal/limit (its learning core is the library's own code), one per
// client, between the breaker's admission and the provider, as in the
// retry loop: every attempt the breaker admitted takes a slot, at once or
// by waiting earliest deadline first within its request's deadline, and
// gives it back when it ends, as a drop when it failed (a 503, a timeout,
// the deadline) and as a latency sample when it succeeded. A refusal
// (no slot expected in time, too many waiting) sends nothing, gives the
// breaker's permit back with Cancel, and ends the request (Reason Limited
// of the retry loop).

// send sends request id's attempt, which its breaker (if any) admitted,
// once its limiter (if any) gives it a slot.
func (r *outRun) send(id int32) {
	req := &r.reqs[id]
	lim := r.unitOf(req.client).lim
	if lim == nil {
		r.transmit(id)
		return
	}
	if p, ok := lim.TryAcquire(r.now); ok {
		req.slot = p
		r.transmit(id)
		return
	}
	var w *waitq.Waiter[int32]
	if n := len(r.spare); n > 0 {
		w, r.spare = r.spare[n-1], r.spare[:n-1]
	} else {
		w = new(waitq.Waiter[int32])
	}
	w.Value = id
	req.lwait, req.state = w, reqLimWait
	var deadline = req.deadline
	if r.c.Deadline == 0 {
		deadline = 0 // none: it waits behind the calls with one, never giving up (at is math.MaxInt64, past the horizon)
	}
	at, err := lim.Wait(r.now, deadline, w, r.limGrant, r.limHopeless)
	if err != nil {
		r.spare = append(r.spare, w)
		req.lwait, req.state = nil, reqIdle
		r.limRefused(id)
		return
	}
	r.res.LimitWaited++
	if req.state == reqLimWait { // not granted at once
		req.limAt = at
		r.after(at-r.now, id, outLimGiveUp)
	}
}

// limGrant hands request id, waiting for its limiter, slot p: it is sent
// now, as an event (the grant may come from inside another request's
// release).
func (r *outRun) limGrant(id int32, p limit.Permit) {
	req := &r.reqs[id]
	r.spare = append(r.spare, req.lwait)
	req.lwait, req.slot, req.state = nil, p, reqLimGo
	r.q.push(r.now, id, outLimGo)
}

// limHopeless ends request id, which its limiter found cannot make its
// deadline.
func (r *outRun) limHopeless(id int32) {
	req := &r.reqs[id]
	r.spare = append(r.spare, req.lwait)
	req.lwait, req.state = nil, reqIdle
	r.limRefused(id)
}

// limGiveUp ends request id's wait for its limiter when its deadline is
// within the baseline latency (at the deadline with no baseline yet).
func (r *outRun) limGiveUp(id int32) {
	req := &r.reqs[id]
	if req.state != reqLimWait || r.now != req.limAt {
		return // granted, or a later wait
	}
	r.unitOf(req.client).lim.Leave(req.lwait)
	r.limHopeless(id)
}

// limRefused ends request id, which its limiter refused: the breaker's
// permit goes back unused.
func (r *outRun) limRefused(id int32) {
	req := &r.reqs[id]
	if sb := r.unitOf(req.client).brk; sb != nil && req.permit != (breaker.Permit{}) {
		sb.b.Cancel(req.permit)
		req.permit = breaker.Permit{}
		r.q.push(r.now, sb.idx, outGrant)
	}
	req.state = reqDone
	r.res.LimitRefused++
}

// limRelease gives back req's slot, if it holds one, dropped or not.
func (r *outRun) limRelease(req *outRequest, dropped bool) {
	if req.slot == (limit.Permit{}) {
		return
	}
	p := req.slot
	req.slot = limit.Permit{}
	r.unitOf(req.client).lim.Release(r.now, p, dropped, r.limGrant, r.limHopeless)
}
