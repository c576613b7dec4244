package httpretry_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stormguard/stormguard/admission"
	"github.com/stormguard/stormguard/httpretry"
	"github.com/stormguard/stormguard/wire"
)

// callerKey carries the client's attempt context to the in-memory server,
// so that the handler can tell whether its caller already left.
type callerKey struct{}

// network serves requests with a handler on a goroutine of its own, on a
// context that, like a real server's, does not carry the client's deadline;
// the client stops waiting when its attempt context ends, the server goes
// on. strip removes the timeout field first, as a client that does not
// send it would.
type network struct {
	h     http.Handler
	strip bool
}

func (n network) RoundTrip(r *http.Request) (*http.Response, error) {
	sr := r.Clone(context.WithValue(context.Background(), callerKey{}, r.Context()))
	if n.strip {
		delete(sr.Header, wire.TimeoutHeader)
	}
	done := make(chan *http.Response, 1)
	go func() {
		rec := httptest.NewRecorder()
		n.h.ServeHTTP(rec, sr)
		done <- rec.Result()
	}()
	select {
	case resp := <-done:
		resp.Request = r
		return resp, nil
	case <-r.Context().Done():
		return nil, r.Context().Err()
	}
}

// wastedWork runs 40 calls at once (1 s attempt timeout, 3 s deadline, up
// to 3 attempts) against a provider that serves 2 at a time, 300 ms each,
// behind admission with a deep queue; it returns how many handler runs
// started for a caller that had already left, and how many calls succeeded.
func wastedWork(t *testing.T, strip bool) (wasted, started, ok int64) {
	ctl, err := admission.New(admission.Config{MaxInFlight: 2, MaxQueue: 1000, MaxQueueWait: time.Minute, MinRetriesPerSecond: 1000})
	if err != nil {
		t.Fatal(err)
	}
	var nWasted, nStarted atomic.Int64
	provider := ctl.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		nStarted.Add(1)
		if caller := r.Context().Value(callerKey{}).(context.Context); caller.Err() != nil {
			nWasted.Add(1)
		}
		time.Sleep(300 * time.Millisecond)
		_, _ = io.WriteString(w, "ok")
	}))
	// No client limiter (WithLimit(nil)): the subject is the provider's
	// admission and the timeout field. With the default limiter the calls
	// wait for client slots and reach the queue later; then one attempt
	// in 20 gets its admission slot at the very instant its caller's
	// deadline comes (admission takes a slot that comes at the same
	// moment as the deadline, queue.go), a tie synctest's clock makes
	// exact.
	tr, err := httpretry.NewTransport(network{h: provider, strip: strip}, httpretry.WithBudget(nil), httpretry.WithBreaker(nil),
		httpretry.WithLimit(nil), httpretry.WithAttemptTimeout(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	var succeeded atomic.Int64
	var wg sync.WaitGroup
	for range 40 {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
			defer cancel()
			req, _ := http.NewRequestWithContext(ctx, "GET", "http://provider.test/", nil)
			resp, err := tr.RoundTrip(req)
			if err == nil {
				_ = resp.Body.Close()
				if resp.StatusCode == 200 {
					succeeded.Add(1)
				}
			}
		})
	}
	wg.Wait()
	time.Sleep(time.Minute) // let the provider finish what it queued
	return nWasted.Load(), nStarted.Load(), succeeded.Load()
}

// TestNoWorkForCallersWhoLeft: with the timeout field, admission drops the
// queued attempts whose callers' attempt timeout passed, so the provider
// starts no work for a caller who left; without it (a client that does
// not send it, and a queue deeper than the callers wait), most of what it
// serves is for nobody.
func TestNoWorkForCallersWhoLeft(t *testing.T) {
	var with, without [3]int64
	synctest.Test(t, func(t *testing.T) {
		with[0], with[1], with[2] = wastedWork(t, false)
	})
	synctest.Test(t, func(t *testing.T) {
		without[0], without[1], without[2] = wastedWork(t, true)
	})
	t.Logf("with the timeout field: %d of %d handler runs for callers who left, %d of 40 calls served; without: %d of %d, %d served",
		with[0], with[1], with[2], without[0], without[1], without[2])
	if with[0] != 0 {
		t.Errorf("with the timeout field, %d handler runs started for callers who had left, want 0", with[0])
	}
	if with[2] < without[2] {
		t.Errorf("with the timeout field %d calls served, without %d: want no fewer", with[2], without[2])
	}
	if without[0] == 0 {
		t.Errorf("without the timeout field no work was wasted: the scenario does not show the defect")
	}
}
