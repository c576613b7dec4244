package retry

import (
	"context"
	"errors"
)

// DoValueIf is [DoValue] for an operation whose value may itself say "try
// again": an answer that is not an error but is not the one wanted yet (a
// job still pending, a replica that is behind, a result marked partial).
// After an attempt that returned a nil error, again is asked about its
// value; true makes the attempt a retryable failure, retried like any
// other (the same attempt limit, backoff, deadline, budget and breaker)
// and counted by the breaker as a failure of the dependency, as a
// retryable error is. false, or a non-nil error, is judged as DoValue
// judges it. again must be safe for concurrent use if the policy is shared;
// nil means DoValue.
//
// When the loop gives up after such an attempt, DoValueIf returns that
// attempt's value with the [*Error] (Reason [AttemptsExhausted],
// [Deadline], [BudgetExhausted], ...; its Err says "retry: the result asked
// for another attempt"), so the caller still has the last answer. Like
// DoValue's, its success path allocates nothing of its own.
func DoValueIf[T any](ctx context.Context, p *Policy, op func(ctx context.Context, attempt int) (T, error), again func(T) bool) (T, error) {
	if again == nil {
		return DoValue(ctx, p, op)
	}
	var v T
	if op == nil {
		return v, errNilOperation
	}
	err := p.run(ctx, func(ctx context.Context, attempt int) error {
		var err error
		v, err = op(ctx, attempt)
		if err == nil && again(v) {
			return errAgain
		}
		return err
	})
	return v, err
}

// errAgain is the error of an attempt whose value asked for another
// attempt (DoValueIf): retryable whatever the classifier, and a failure for
// the breaker.
var errAgain = errors.New("retry: the result asked for another attempt")
