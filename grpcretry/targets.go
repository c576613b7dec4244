package grpcretry

import (
	"github.com/stormguard/stormguard/grpcretry/internal/guards"
)

// target is what a client keeps per target: its guards and the retry
// policy that uses them. It is immutable once made.
type target = guards.Destination

// targets is the bounded table of targets.
type targets struct{ t *guards.Table[*target] }

func newTargets(max int, mk func(string) (*target, error)) *targets {
	t := guards.NewTable(max, mk)
	t.Forget = (*target).Forget // an evicted target's breaker leaves the observer's gauge
	t.Follow = (*target).Follow // a target back before that is told after it
	return &targets{t}
}

// get returns the state of target name, creating it if needed.
func (t *targets) get(name string) (*target, error) { return t.t.Get(name) }

// retryable is the policies' classifier: the attempts mark everything they
// may not retry, so an unmarked attempt error is retryable; inside a
// retry.Permanent mark, an attempt error is a failure of the target unless
// it is an answer.
func retryable(err error) bool {
	ae, ok := err.(*attemptError)
	return ok && !ae.answer
}
