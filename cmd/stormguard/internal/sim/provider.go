package sim

import (
	"container/heap"
	"fmt"
	"math"
	"time"
)

// The provider of the outage experiment: Workers servers in front of one
// FIFO queue, and the trigger that hits them.

// Trigger is what goes wrong at the provider during [TriggerStart,
// TriggerEnd) in [Outage]. The zero value is TriggerError.
type Trigger uint8

const (
	// TriggerError: the provider answers every attempt at once with a 503
	// (with OutageConfig.RetryAfter), and queued work that would finish
	// then fails too.
	TriggerError Trigger = iota
	// TriggerHang: every worker stalls; nothing is answered, the queue
	// fills, and attempts beyond it are shed. The work in progress
	// resumes at the trigger's end.
	TriggerHang
	// TriggerSlow: the service time of every worker is 5 times longer (a
	// slow dependency of the provider, a garbage-collection storm): the
	// provider serves a fifth of its capacity, each answer 5 times later.
	TriggerSlow
	// TriggerCut: four workers in five stall (a lost zone, a bad deploy):
	// the provider serves a fifth of its capacity at the usual service
	// time. It needs at least 5 workers.
	TriggerCut
)

// slowFactor is TriggerSlow's service-time factor and TriggerCut's
// capacity divisor.
const slowFactor = 5

// MaxOutageWorkers bounds OutageConfig.Workers.
const MaxOutageWorkers = 1000

// Triggers returns every trigger, in order.
func Triggers() []Trigger { return []Trigger{TriggerError, TriggerHang, TriggerSlow, TriggerCut} }

var triggerNames = [...]string{"503", "hang", "slow5x", "cut80"}

// String returns the trigger's name: 503, hang, slow5x or cut80.
func (t Trigger) String() string {
	if int(t) < len(triggerNames) {
		return triggerNames[t]
	}
	return fmt.Sprintf("Trigger(%d)", uint8(t))
}

// MarshalText encodes t as its name.
func (t Trigger) MarshalText() ([]byte, error) {
	if int(t) >= len(triggerNames) {
		return nil, fmt.Errorf("%w: unknown trigger %d", ErrInvalidConfig, t)
	}
	return []byte(t.String()), nil
}

// UnmarshalText decodes a trigger's name.
func (t *Trigger) UnmarshalText(b []byte) error {
	for i, n := range triggerNames {
		if n == string(b) {
			*t = Trigger(i)
			return nil
		}
	}
	return fmt.Errorf("%w: unknown trigger %.40q (want 503, hang, slow5x or cut80)", ErrInvalidConfig, b)
}

// provider is the queue and the workers. Each admitted attempt is given,
// at once, the worker that finishes it first (FIFO order of admission) and
// the time it starts and finishes; nothing cancels it later.
type provider struct {
	kind    Trigger
	a, b    time.Duration // the trigger
	service time.Duration // one attempt's work, at the normal rate
	queue   int           // attempts that may wait (admitted, not started)
	free    []time.Duration
	active  int     // workers that keep working through TriggerCut
	starts  durHeap // start times of the admitted attempts not started yet
}

func newProvider(c *OutageConfig) provider {
	w := max(c.Workers, 1)
	p := provider{
		kind:    c.Trigger,
		a:       c.TriggerStart,
		b:       c.TriggerEnd,
		service: time.Duration(float64(w) * float64(time.Second) / c.Capacity),
		queue:   c.Queue,
		free:    make([]time.Duration, w),
		active:  w,
	}
	if c.Trigger == TriggerCut {
		p.active = max(1, int(math.Round(float64(w)/slowFactor)))
	}
	return p
}

// admit queues an attempt that arrives at now and returns when it finishes;
// ok is false if the queue is full (the attempt is shed).
func (p *provider) admit(now time.Duration) (finish time.Duration, ok bool) {
	for p.starts.Len() > 0 && p.starts[0] <= now {
		heap.Pop(&p.starts)
	}
	if p.starts.Len() >= p.queue {
		return 0, false
	}
	best, bestStart := -1, time.Duration(0)
	for w, f := range p.free {
		start := max(now, f)
		end := p.advance(w, start)
		if best < 0 || end < finish {
			best, bestStart, finish = w, start, end
		}
	}
	p.free[best] = finish
	if bestStart > now {
		heap.Push(&p.starts, bestStart)
	}
	return finish, true
}

// advance returns when worker w, starting an attempt at s, finishes it:
// its work is service at rate 1, at rate 0 while the trigger stalls it,
// and 1/slowFactor while the trigger slows it.
func (p *provider) advance(w int, s time.Duration) time.Duration {
	var rate float64
	switch {
	case p.kind == TriggerHang, p.kind == TriggerCut && w >= p.active:
		rate = 0
	case p.kind == TriggerSlow:
		rate = 1.0 / slowFactor
	default:
		return s + p.service
	}
	work := p.service
	if s >= p.b || s+work <= p.a {
		return s + work
	}
	if s < p.a {
		work -= p.a - s
		s = p.a
	}
	if rate > 0 {
		if room := time.Duration(float64(p.b-s) * rate); work <= room {
			return s + time.Duration(float64(work)/rate)
		}
		work -= time.Duration(float64(p.b-s) * rate)
	}
	return p.b + work
}

// durHeap is a min-heap of durations.
type durHeap []time.Duration

func (h durHeap) Len() int           { return len(h) }
func (h durHeap) Less(i, j int) bool { return h[i] < h[j] }
func (h durHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *durHeap) Push(x any)        { *h = append(*h, x.(time.Duration)) }
func (h *durHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}
