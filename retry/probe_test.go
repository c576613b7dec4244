package retry_test

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/retry"
)

// TestIsProbe: the loop marks the attempt contexts the breaker let through
// to test the dependency (a probe, or the send of a call released after
// waiting behind it), and no other.
func TestIsProbe(t *testing.T) {
	var nilCtx context.Context // IsProbe documents nil
	if retry.IsProbe(context.Background()) || retry.IsProbe(nilCtx) {
		t.Fatal("IsProbe of a plain context = true")
	}
	synctest.Test(t, func(t *testing.T) {
		brk, err := breaker.New(breaker.Config{MinCalls: 1, Probes: 1, OpenFor: time.Second, Rand: func() float64 { return 0.5 }})
		if err != nil {
			t.Fatal(err)
		}
		p := mustNew(t, retry.WithGuards(retry.Guards{Breaker: brk}), retry.WithMaxAttempts(3))
		start := time.Now()
		type seen struct {
			attempt int
			probe   bool
			at      time.Duration
		}
		var got []seen
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		err = p.Do(ctx, func(ctx context.Context, attempt int) error {
			at := time.Since(start)
			got = append(got, seen{attempt, retry.IsProbe(ctx), at})
			if at < 1500*time.Millisecond {
				return err503 // trips the breaker; the probe at 1 s fails too
			}
			return nil
		})
		if err != nil {
			t.Fatalf("Do = %v, want success at the second probe round", err)
		}
		want := []seen{{1, false, 0}, {2, true, time.Second}, {3, true, 2 * time.Second}}
		if len(got) != len(want) {
			t.Fatalf("attempts %v, want %v", got, want)
		}
		for i := range want {
			if got[i] != want[i] {
				t.Errorf("attempt %d = %+v, want %+v", i+1, got[i], want[i])
			}
		}

		// With the breaker closed again, attempts are not marked.
		var marked bool
		if err := p.Do(ctx, func(ctx context.Context, _ int) error { marked = retry.IsProbe(ctx); return nil }); err != nil || marked {
			t.Errorf("Do through a closed breaker = %v, marked %v; want nil, false", err, marked)
		}
	})
}
