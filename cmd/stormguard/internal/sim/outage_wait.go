package sim

import (
	"time"

	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/cmd/stormguard/internal/waitq"
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
	waiting := sb.waiting.Len()
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
	var w *waitq.Waiter[int32]
	if n := len(r.spare); n > 0 {
		w, r.spare = r.spare[n-1], r.spare[:n-1]
	} else {
		w = new(waitq.Waiter[int32])
	}
	w.Value = id
	sb.waiting.Push(w, req.deadline)
	req.wait, req.state = w, reqWaiting
	if sb.perClient != nil {
		sb.perClient[req.client]++
	}
	r.res.Waited++
	r.after(left, id, outWaitEnd)
	r.arm(sb)
	return true
}

// leave takes waiting request id off its breaker's list.
func (r *outRun) leave(id int32, sb *simBreaker) {
	req := &r.reqs[id]
	sb.waiting.Remove(req.wait)
	r.spare = append(r.spare, req.wait)
	req.wait, req.state = nil, reqIdle
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
	r.leave(id, r.unitOf(req.client).brk)
	r.giveUp(id, retry.CircuitOpen)
}

// arm makes sure a probe round comes for sb's waiting calls when its open
// period ends, even if no new call arrives then.
func (r *outRun) arm(sb *simBreaker) {
	if sb.armed || sb.waiting.Len() == 0 {
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
// its waiting calls, those with the most time left first (the latest
// deadline, of equal ones the first to come: the breaker's rule), and sends
// them. A probe sent may fail at once and its call wait again, so the list
// is read from its back each time.
func (r *outRun) grant(sb *simBreaker) {
	if sb.waiting.Len() == 0 || sb.b.State() == breaker.Closed { // State starts a due round
		return
	}
	for w := waitq.LastFirst(sb.waiting.Back()); w != nil; w = waitq.LastFirst(sb.waiting.Back()) {
		p, err := sb.b.Allow()
		if err != nil || !p.Probe() {
			break // probes taken, or closed meanwhile: a closed-state permit needs no giving back
		}
		id := w.Value
		r.leave(id, sb)
		r.reqs[id].permit, r.reqs[id].gen = p, sb.epoch
		r.send(id)
	}
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
	req.permit, req.gen = p, sb.epoch
	r.send(id)
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
		sb.releasing = false
		for w := sb.waiting.Front(); w != nil; w = w.Next() {
			r.reqs[w.Value].state = reqWaiting // not released yet: wait again
		}
		if sb.waiting.Len() > 0 {
			r.q.push(r.now, sb.idx, outArm)
		}
	case breaker.HalfOpen:
		if sb.waiting.Len() > 0 {
			r.q.push(r.now, sb.idx, outGrant)
		}
	case breaker.Closed:
		sb.closedAt = r.now
		// The pacer starts at the close, with a first tick at once.
		sb.pace.Start(r.now, sb.releaseCeiling(), sb.releaseFloor())
		sb.paceEpoch = sb.epoch
		if r.releaseDue(sb) {
			sb.releasing = true
			r.armPace(sb)
		}
	}
}

// releaseDue is a tick of sb's pacer: it releases the waiting calls not yet
// released, earliest deadline first, as many as the pacer's credit allows,
// each at a uniformly random point of the coming tick, and reports whether
// some are left to release.
func (r *outRun) releaseDue(sb *simBreaker) bool {
	if sb.paceEpoch != sb.epoch {
		return false // the breaker opened since
	}
	p := &sb.pace
	spread := float64(p.Tick(r.now))
	left := false
	for w := sb.waiting.Front(); w != nil; w = w.Next() {
		req := &r.reqs[w.Value]
		if req.state == reqReleasing {
			continue
		}
		if !p.Take() {
			left = true
			break
		}
		req.state, req.release = reqReleasing, sb.epoch
		r.after(time.Duration(r.bu()*spread), w.Value, outRelease)
	}
	p.EndTick(left)
	return left
}

// armPace schedules the next tick of sb's pacer.
func (r *outRun) armPace(sb *simBreaker) {
	d := sb.pace.Interval()
	sb.paceDue = r.now + d
	r.after(d, sb.idx, outPace)
}

// paceTick runs the tick of sb's pacer that is due now, unless the pacer
// has stopped or restarted since it was scheduled.
func (r *outRun) paceTick(sb *simBreaker) {
	if !sb.releasing || r.now != sb.paceDue {
		return
	}
	if r.releaseDue(sb) {
		r.armPace(sb)
		return
	}
	sb.releasing = false
}
