// Black-box attack on the most recent promises of hedging and the
// stale-if-error cache (AREA recent). Each test quotes the promise.
package httpretry_test

import (
	"context"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stormguard/stormguard/backoff"
	"github.com/stormguard/stormguard/httpretry"
	"github.com/stormguard/stormguard/observe"
	"github.com/stormguard/stormguard/retry"
	"github.com/stormguard/stormguard/wire"
)

// atkRecentBase is an in-memory base transport answering on the calling
// goroutine (usable in a synctest bubble).
type atkRecentBase func(r *http.Request) (*http.Response, error)

func (f atkRecentBase) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := f(r)
	if resp != nil {
		resp.Request = r
	}
	return resp, err
}

func atkRecentResp(code int, hdr http.Header, body string) *http.Response {
	if hdr == nil {
		hdr = http.Header{}
	}
	return &http.Response{
		Status: http.StatusText(code), StatusCode: code, Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header: hdr, Body: io.NopCloser(strings.NewReader(body)), ContentLength: int64(len(body)),
	}
}

func atkRecentBackoff(t *testing.T) *backoff.Backoff {
	t.Helper()
	b, err := backoff.New(backoff.Config{Strategy: backoff.FullJitter, Base: time.Millisecond, Cap: 10 * time.Millisecond, Rand: func() float64 { return 0 }})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// atkRecentObs records events; hold, if set, is called (outside the lock) for
// each event before it is recorded.
type atkRecentObs struct {
	mu   sync.Mutex
	ev   []observe.Event
	hold func(e observe.Event)
}

func (o *atkRecentObs) Observe(_ context.Context, e observe.Event) {
	if o.hold != nil {
		o.hold(e)
	}
	o.mu.Lock()
	o.ev = append(o.ev, e)
	o.mu.Unlock()
}

func (o *atkRecentObs) hedgeEnds() map[int]string {
	o.mu.Lock()
	defer o.mu.Unlock()
	m := map[int]string{}
	for _, e := range o.ev {
		if e.Kind == observe.AttemptEnd && e.Hedge {
			m[e.Attempt] = e.Outcome
		}
	}
	return m
}

// WithHedging: "the first good answer ... winning and the others canceled,
// their bodies closed"; "an observer hears its own AttemptStart and
// AttemptEnd (Event.Hedge set; a canceled loser ends with Outcome
// "canceled")". Two hedges answer good 10 ms apart while the first copy is
// still in flight; the observer is slow to hear the first hedge's end (an
// exporter taking its time). The answer the caller gets must be the one
// the observer heard as the success, and the one it heard as "canceled"
// must be a loser whose answer was closed.
func TestAttackRecentHedgeWinnerIsTheObservedSuccess(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var mu sync.Mutex
		closed := map[string]bool{}
		base := atkRecentBase(func(r *http.Request) (*http.Response, error) {
			a := r.Header.Get(wire.AttemptHeader)
			switch a {
			case "": // the first copy: slow, honours its cancel
				select {
				case <-time.After(10 * time.Second):
					return atkRecentResp(200, nil, "first"), nil
				case <-r.Context().Done():
					return nil, r.Context().Err()
				}
			case "2": // sent at 50 ms, answers at 120 ms
				time.Sleep(70 * time.Millisecond)
			case "3": // sent at 100 ms, answers at 130 ms
				time.Sleep(30 * time.Millisecond)
			}
			resp := atkRecentResp(200, nil, "hedge"+a)
			name := "hedge" + a
			resp.Body = &atkRecentCloser{Reader: strings.NewReader(name), onClose: func() {
				mu.Lock()
				closed[name] = true
				mu.Unlock()
			}}
			return resp, nil
		})
		heard3 := make(chan struct{})
		obs := &atkRecentObs{}
		obs.hold = func(e observe.Event) {
			if e.Kind != observe.AttemptEnd || !e.Hedge {
				return
			}
			switch e.Attempt {
			case 3:
				close(heard3)
			case 2: // slow to hear the first hedge's end: until the second's was heard, or 1 s
				select {
				case <-heard3:
				case <-time.After(time.Second):
				}
			}
		}
		tr, err := httpretry.NewTransport(base,
			httpretry.WithRetry(retry.WithBackoff(atkRecentBackoff(t)), retry.WithMaxAttempts(1)),
			httpretry.WithHedging(50*time.Millisecond, 0.95, 2),
			httpretry.WithBreaker(nil),
			httpretry.WithObserver(obs))
		if err != nil {
			t.Fatal(err)
		}
		req, _ := http.NewRequest("GET", "http://two.test/x", nil)
		resp, err := tr.RoundTrip(req)
		if err != nil {
			t.Fatalf("RoundTrip: %v", err)
		}
		b, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		time.Sleep(2 * time.Second)
		synctest.Wait()
		ends := obs.hedgeEnds()
		got := string(b)
		t.Logf("caller got %q; hedge ends %v; closed %v", got, ends, closed)
		var success []string
		for a, out := range ends {
			if out == "success" {
				success = append(success, "hedge"+string(rune('0'+a)))
			}
		}
		if len(success) != 1 || success[0] != got {
			t.Errorf("the caller got %q but the observer heard success for %v (ends %v): the answer handed back was reported as a canceled loser", got, success, ends)
		}
		mu.Lock()
		defer mu.Unlock()
		for _, n := range []string{"hedge2", "hedge3"} {
			if n != got && !closed[n] {
				t.Errorf("loser %s's body not closed", n)
			}
		}
	})
}

type atkRecentCloser struct {
	io.Reader
	once    sync.Once
	onClose func()
}

func (c *atkRecentCloser) Close() error { c.once.Do(c.onClose); return nil }
