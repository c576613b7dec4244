package retry

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"
)

// TestSystemClockSleep checks the clock WithClock(nil) stands for, on a
// synctest bubble's time: Sleep waits exactly d, ends at once on cancel,
// and a d of 0 returns the context's error without waiting.
func TestSystemClockSleep(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var c systemClock
		ctx, cancel := context.WithCancel(context.Background())
		start := c.Now()
		if err := c.Sleep(ctx, 0); err != nil {
			t.Errorf("Sleep(0) = %v", err)
		}
		if err := c.Sleep(ctx, 3*time.Second); err != nil || time.Since(start) != 3*time.Second {
			t.Errorf("Sleep(3s) = %v after %v, want nil after 3s", err, time.Since(start))
		}
		time.AfterFunc(time.Second, cancel)
		if err := c.Sleep(ctx, time.Hour); !errors.Is(err, context.Canceled) || time.Since(start) != 4*time.Second {
			t.Errorf("Sleep(1h) canceled at 1s = %v after %v, want context.Canceled after 4s", err, time.Since(start))
		}
		if err := c.Sleep(ctx, 0); !errors.Is(err, context.Canceled) {
			t.Errorf("Sleep(0) on a canceled context = %v, want context.Canceled", err)
		}
	})
}
