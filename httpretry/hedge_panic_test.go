package httpretry_test

import (
	"context"
	"net/http"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stormguard/stormguard/httpretry"
	"github.com/stormguard/stormguard/limit"
)

// A hedge runs on the race's timer goroutine, where a panic of the base
// transport would end the program (it did). It ends the race as a panic
// of the first copy does: the panic (or the runtime.Goexit) goes on in the
// caller's goroutine, the first copy is canceled, and every limiter slot
// comes back.
func TestHedgeBasePanicReachesCaller(t *testing.T) {
	for _, goexit := range []bool{false, true} {
		name := "panic"
		if goexit {
			name = "Goexit"
		}
		t.Run(name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				b := &hlBase{start: time.Now(), plan: func(num, _ int) hlAnswer {
					if num == 1 {
						return hlAnswer{after: time.Second}
					}
					return hlAnswer{after: 10 * time.Millisecond, panic: !goexit, goexit: goexit}
				}}
				lim := hlLimiter(t, limit.Config{Max: 100})
				tr := hlTransport(t, b, lim, httpretry.WithHedging(50*time.Millisecond, 0.95, 1))
				var (
					got      any
					returned bool
					took     time.Duration
				)
				done := make(chan struct{})
				start := time.Now()
				go func() {
					defer close(done)
					defer func() { got, took = recover(), time.Since(start) }()
					_, _ = hlGet(t, tr, context.Background())
					returned = true
				}()
				<-done
				time.Sleep(5 * time.Second)
				synctest.Wait()
				switch {
				case returned:
					t.Errorf("the call returned after %v; want the hedge's %s in the caller's goroutine", took, name)
				case !goexit && got != http.ErrAbortHandler:
					t.Errorf("the caller recovered %v, want the hedge's panic (http.ErrAbortHandler)", got)
				case goexit && got != nil:
					t.Errorf("the caller recovered %v, want a runtime.Goexit (nothing to recover)", got)
				}
				if took != 60*time.Millisecond {
					t.Errorf("the %s reached the caller after %v, want 60 ms (the hedge's, the first copy canceled)", name, took)
				}
				if f, l := hlFree(lim), lim.Limit(); f != l {
					t.Errorf("%d of %d slots free, want all", f, l)
				}
			})
		})
	}
}
