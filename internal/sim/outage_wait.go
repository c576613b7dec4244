package sim

import (
	"time"

	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/retry"
)

// Waiting behind a breaker in the outage experiment: the calls the
// breaker's probe rounds and release hand out, on the simulated clock.

// wait makes request id wait behind sb after the breaker rejected its
// attempt with err, if the policy waits and the breaker's rules allow it
// (see Breaker.Wait); it reports whether the request waits.
func (r *outRun) wait(id int32, sb *simBreaker, err error) bool {
	req := &r.reqs[id]
	left := r.left(req)
	waiting := sb.n
	if sb.perClient != nil {
		waiting = int(sb.perClient[req.client])
	}
	if !r.p.Wait || left <= 0 || sb.cfg.MaxWaiters <= 0 || waiting >= sb.cfg.MaxWaiters {
		return false
	}
	until, open, oerr := openWait(err)
	if oerr != nil || (open && until >= left) {
		return false
	}
	sb.compact()
	req.seq++
	req.state = reqWaiting
	sb.enqueue(waitEntry{id: id, seq: req.seq, deadline: req.deadline})
	sb.n++
	if sb.perClient != nil {
		sb.perClient[req.client]++
	}
	r.res.Waited++
	r.after(left, id, outWaitEnd)
	r.arm(sb)
	return true
}

// waiting reports whether entry e is a call still waiting.
func (r *outRun) waiting(e waitEntry) bool {
	req := &r.reqs[e.id]
	return req.seq == e.seq && (req.state == reqWaiting || req.state == reqReleasing)
}

// leave takes waiting request id off its breaker's list.
func (r *outRun) leave(id int32, sb *simBreaker) {
	req := &r.reqs[id]
	req.seq++ // its entry is stale from now on
	req.state = reqIdle
	sb.n--
	if sb.perClient != nil {
		sb.perClient[req.client]--
	}
}

// waitEnd ends request id's wait at its deadline, if it still waits.
func (r *outRun) waitEnd(id int32) {
	req := &r.reqs[id]
	if req.state != reqWaiting && req.state != reqReleasing {
		return
	}
	sb := r.unitOf(req.client).brk
	r.leave(id, sb)
	sb.compact()
	r.giveUp(id, retry.CircuitOpen)
}

// arm makes sure a probe round comes for sb's waiting calls when its open
// period ends, even if no new call arrives then.
func (r *outRun) arm(sb *simBreaker) {
	if sb.armed || sb.n == 0 {
		return
	}
	s := sb.b.Snapshot()
	if s.State != breaker.Open {
		return
	}
	sb.armed = true
	r.after(s.HalfOpenIn, sb.idx, outRound)
}

// grant hands the free probes of sb's round, if one is due or running, to
// its waiting calls, oldest first, and sends them.
func (r *outRun) grant(sb *simBreaker) {
	if sb.n == 0 || sb.b.State() == breaker.Closed { // State starts a due round
		return
	}
	for sb.head < len(sb.fifo) {
		e := sb.fifo[sb.head]
		if !r.waiting(e) {
			sb.head++
			continue
		}
		p, err := sb.b.Allow()
		if err != nil || !p.Probe() {
			break // probes taken, or closed meanwhile: a closed-state permit needs no giving back
		}
		sb.head++
		r.leave(e.id, sb)
		r.reqs[e.id].permit, r.reqs[e.id].gen = p, sb.epoch
		r.transmit(e.id)
	}
	sb.compact()
}

// release sends waiting request id in its turn after its breaker closed,
// unless the breaker has changed state since.
func (r *outRun) release(id int32) {
	req := &r.reqs[id]
	if req.state != reqReleasing {
		return
	}
	sb := r.unitOf(req.client).brk
	if req.release != sb.epoch {
		return // reopened: it waits again
	}
	p, err := sb.b.Allow()
	if err != nil {
		req.state = reqWaiting
		r.arm(sb)
		return
	}
	r.leave(id, sb)
	sb.compact()
	req.permit, req.gen = p, sb.epoch
	r.transmit(id)
}

// stateChanged follows a state change of sb's breaker. It runs inside the
// breaker's call that made the change (OnStateChange), so it only keeps
// books and schedules: what calls the breaker again runs as an event.
func (r *outRun) stateChanged(sb *simBreaker, from, to breaker.State) {
	sb.epoch++
	switch to {
	case breaker.Open:
		if from == breaker.Closed {
			sb.tripped(r.now)
		}
		sb.pace.on = false
		for i := sb.head; i < len(sb.fifo); i++ {
			if e := sb.fifo[i]; r.waiting(e) {
				r.reqs[e.id].state = reqWaiting // not released yet: wait again
			}
		}
		if sb.n > 0 {
			r.q.push(r.now, sb.idx, outArm)
		}
	case breaker.HalfOpen:
		if sb.n > 0 {
			r.q.push(r.now, sb.idx, outGrant)
		}
	case breaker.Closed:
		sb.closedAt = r.now
		// The pacer starts at the close, with a first tick at once.
		sb.pace.start(r.now, sb.built, sb.epoch, sb.releaseRate(), sb.cfg.Probes, sb.cfg.OpenFor)
		if r.releaseDue(sb) {
			sb.pace.on = true
			r.armPace(sb)
		}
	}
}

// releaseDue is a tick of sb's pacer: it releases the oldest waiting calls
// not yet released, as many as the pacer's credit allows, each at a
// uniformly random point of the coming tick, and reports whether some are
// left to release.
func (r *outRun) releaseDue(sb *simBreaker) bool {
	p := &sb.pace
	if p.epoch != sb.epoch {
		return false // the breaker opened since
	}
	span := p.advance(r.now)
	for sb.head < len(sb.fifo) && !r.waiting(sb.fifo[sb.head]) {
		sb.head++
	}
	left := false
	for i := sb.head; i < len(sb.fifo); i++ {
		e := sb.fifo[i]
		if !r.waiting(e) || r.reqs[e.id].state == reqReleasing {
			continue
		}
		if !p.take() {
			left = true
			break
		}
		req := &r.reqs[e.id]
		req.state, req.release = reqReleasing, sb.epoch
		r.after(time.Duration(r.bu()*span), e.id, outRelease)
	}
	p.settle(left)
	sb.compact()
	return left
}

// armPace schedules the next tick of sb's pacer.
func (r *outRun) armPace(sb *simBreaker) {
	d := sb.pace.tick()
	sb.pace.due = r.now + d
	r.after(d, sb.idx, outPace)
}

// paceTick runs the tick of sb's pacer that is due now, unless the pacer
// has stopped or restarted since it was scheduled.
func (r *outRun) paceTick(sb *simBreaker) {
	p := &sb.pace
	if !p.on || r.now != p.due {
		return
	}
	if r.releaseDue(sb) {
		r.armPace(sb)
		return
	}
	p.on = false
}
