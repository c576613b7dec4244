package retry

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"
)

// fakeGate stands in for the budget and breaker that will plug into the
// loop: it refuses the attempt numbered refuseAttempt and the retry after
// attempt refuseRetry, and records every outcome.
type fakeGate struct {
	refuseAttempt int
	refuseRetry   int
	outcomes      []string
}

func (g *fakeGate) beforeAttempt(ctx context.Context, attempt int) (Reason, bool) {
	return CircuitOpen, attempt != g.refuseAttempt
}

func (g *fakeGate) afterAttempt(ctx context.Context, attempt int, err error, retryable bool) {
	switch {
	case err == nil:
		g.outcomes = append(g.outcomes, "ok")
	case retryable:
		g.outcomes = append(g.outcomes, "retryable")
	default:
		g.outcomes = append(g.outcomes, "permanent")
	}
}

func (g *fakeGate) beforeRetry(ctx context.Context, attempt int) (Reason, bool) {
	return BudgetExhausted, attempt != g.refuseRetry
}

// nopClock never sleeps.
type nopClock struct{}

func (nopClock) Now() time.Time                                   { return time.Time{} }
func (nopClock) Sleep(ctx context.Context, d time.Duration) error { return ctx.Err() }

// TestGateHookPoint shows the budget/breaker hook point is wired: refusals
// stop the loop with their reason, outcomes are recorded in order.
func TestGateHookPoint(t *testing.T) {
	err503 := &StatusError{Code: 503}
	tests := []struct {
		name         string
		gate         fakeGate
		okOn         int // attempt that succeeds; 0: none
		wantErr      Reason
		wantAttempts int
		wantOutcomes []string
	}{
		{"circuit open before the first attempt", fakeGate{refuseAttempt: 1}, 0, CircuitOpen, 0, nil},
		{"circuit opens before attempt 2", fakeGate{refuseAttempt: 2}, 0, CircuitOpen, 1, []string{"retryable"}},
		{"budget refuses the first retry", fakeGate{refuseRetry: 1}, 0, BudgetExhausted, 1, []string{"retryable"}},
		{"admitted: success recorded", fakeGate{}, 2, 0, 2, []string{"retryable", "ok"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := New(WithClock(nopClock{}))
			if err != nil {
				t.Fatal(err)
			}
			g := tt.gate
			p.gate = &g
			calls := 0
			err = p.Do(context.Background(), func(ctx context.Context, attempt int) error {
				calls++
				if attempt == tt.okOn {
					return nil
				}
				return err503
			})
			if calls != tt.wantAttempts {
				t.Errorf("calls = %d, want %d", calls, tt.wantAttempts)
			}
			if !slices.Equal(g.outcomes, tt.wantOutcomes) {
				t.Errorf("outcomes = %v, want %v", g.outcomes, tt.wantOutcomes)
			}
			if tt.wantErr == 0 {
				if err != nil {
					t.Errorf("Do = %v, want nil", err)
				}
				return
			}
			var re *Error
			if !errors.As(err, &re) || re.Reason != tt.wantErr || re.Attempts != tt.wantAttempts || !errors.Is(err, tt.wantErr.Err()) {
				t.Errorf("Do = %v, want reason %v after %d attempts", err, tt.wantErr, tt.wantAttempts)
			}
		})
	}
}
