package httpretry_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stormguard/stormguard/budget"
	"github.com/stormguard/stormguard/httpretry"
	"github.com/stormguard/stormguard/limit"
	"github.com/stormguard/stormguard/retry"
	"github.com/stormguard/stormguard/wire"
)

// Black-box attacks on the capacity hint (docs/limit.md, "The provider's
// capacity hint"; httpretry.WithLimit; wire.CapacityHeader): a provider
// that lies, flaps or answers oddly, observed through the limiters
// Transport.Hosts returns. A cold limiter's limit is 10.

// answerFunc is a provider in memory: each request gets the status and
// the Stormguard-Capacity values the func returns for it (nil: none).
type answerFunc func(r *http.Request) (code int, hint []string)

func (f answerFunc) RoundTrip(r *http.Request) (*http.Response, error) {
	code, hint := f(r)
	resp := &http.Response{StatusCode: code, Header: http.Header{}, Body: http.NoBody, Request: r}
	if hint != nil {
		resp.Header[wire.CapacityHeader] = hint
	}
	return resp, nil
}

// hintTransport is a transport with a limiter it builds, one attempt per
// request (the answer the test scripts is the only one), no budget.
func hintTransport(t *testing.T, base http.RoundTripper, opts ...httpretry.Option) *httpretry.Transport {
	t.Helper()
	all := append([]httpretry.Option{httpretry.WithLimit(&limit.Config{}), httpretry.WithBudget(nil),
		httpretry.WithRetry(retry.WithMaxAttempts(1))}, opts...)
	tr, err := httpretry.NewTransport(base, all...)
	if err != nil {
		t.Fatalf("NewTransport: %v", err)
	}
	return tr
}

// send sends one GET to url through tr, with a 10 s deadline, and closes
// the answer's body.
func send(t *testing.T, tr http.RoundTripper, url string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", url, nil)
	resp, err := tr.RoundTrip(req)
	if err == nil {
		_ = resp.Body.Close()
	}
}

func hostLimit(t *testing.T, tr *httpretry.Transport, host string) int {
	t.Helper()
	g, ok := tr.Hosts()[host]
	if !ok || g.Limiter == nil {
		t.Fatalf("host %s: no limiter in %v", host, tr.Hosts())
	}
	return g.Limiter.Limit()
}

// TestCapacityHintAttackValues: a 503 or 429 with one field of decimal
// digits caps the limit (0 reads as 1, above 2^30 saturates: no cap below
// the cold 10); anything else (a sign, garbage, several fields, an empty
// one, a hint on any other status) leaves the limit alone.
func TestCapacityHintAttackValues(t *testing.T) {
	tests := []struct {
		code int
		hint []string
		want int
	}{
		{503, []string{"4"}, 4},
		{429, []string{"4"}, 4},
		{503, []string{"0"}, 1},
		{503, []string{" 3\t"}, 3},
		{503, []string{"0003"}, 3},
		{503, []string{"1073741824"}, 10},           // 2^30: no cap below the learned 10
		{503, []string{"9223372036854775808"}, 10},  // 2^63
		{503, []string{"18446744073709551617"}, 10}, // 2^64+1: no wrap to 1
		{503, []string{"99999999999999999999999999999999999999"}, 10},
		{503, []string{"-1"}, 10},
		{503, []string{"-9223372036854775808"}, 10},
		{503, []string{"+4"}, 10},
		{503, []string{"4e0"}, 10},
		{503, []string{"0x4"}, 10},
		{503, []string{"4,4"}, 10},
		{503, []string{"four"}, 10},
		{503, []string{""}, 10},
		{503, []string{"4", "4"}, 10}, // several fields
		{503, []string{"4", ""}, 10},
		{503, []string{}, 10},
		{200, []string{"1"}, 10}, // a hint on a success
		{404, []string{"1"}, 10},
		{500, []string{"1"}, 10},
		{502, []string{"1"}, 10},
		{504, []string{"1"}, 10},
		{408, []string{"1"}, 10},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("%d_%q", tt.code, tt.hint), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				tr := hintTransport(t, answerFunc(func(*http.Request) (int, []string) { return tt.code, tt.hint }))
				send(t, tr, "http://p.test/")
				if got := hostLimit(t, tr, "p.test"); got != tt.want {
					t.Errorf("after a %d with %s %q: limit %d, want %d", tt.code, wire.CapacityHeader, tt.hint, got, tt.want)
				}
			})
		})
	}
}

// TestCapacityHintAttackTiming: the cap holds until 1 s after the last
// hinted answer (a later hint holds it anew, an unhinted 503 does not),
// then doubles every 200 ms while it binds, and is removed at the first
// step that finds the learned limit (10, idle) below it; a hint during the
// doubling sets it back; a higher hint replaces a lower one. Then an hour passes at once: nothing is left
// capped.
func TestCapacityHintAttackTiming(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var hint atomic.Value // string; "" for none
		hint.Store("")
		tr := hintTransport(t, answerFunc(func(*http.Request) (int, []string) {
			if h := hint.Load().(string); h != "" {
				return 503, []string{h}
			}
			return 503, nil
		}))
		sendHint := func(h string) { hint.Store(h); send(t, tr, "http://p.test/") }
		check := func(when string, want int) {
			t.Helper()
			synctest.Wait()
			if got := hostLimit(t, tr, "p.test"); got != want {
				t.Errorf("%s: limit %d, want %d", when, got, want)
			}
		}
		sendHint("1")
		check("hint 1", 1)
		sendHint("2") // the latest hint replaces the cap, higher too
		check("hint 2", 2)
		time.Sleep(600 * time.Millisecond)
		sendHint("") // a 503 with no hint: does not hold the cap
		time.Sleep(399 * time.Millisecond)
		check("999 ms after the hint (an unhinted 503 between)", 2)
		time.Sleep(time.Millisecond)
		check("1 s after the hint", 4)
		time.Sleep(199 * time.Millisecond)
		check("1.199 s", 4)
		time.Sleep(time.Millisecond)
		check("1.2 s", 8)
		sendHint("3") // sheds again during the doubling
		check("hint 3 during the doubling", 3)
		time.Sleep(999 * time.Millisecond)
		check("999 ms after hint 3", 3)
		time.Sleep(time.Millisecond)
		check("1 s after hint 3", 6)
		time.Sleep(200 * time.Millisecond)
		check("1.2 s after hint 3", 10) // cap 12, learned 10
		time.Sleep(200 * time.Millisecond)
		check("1.4 s after hint 3: cap removed", 10)
		sendHint("5")
		check("hint 5", 5)
		time.Sleep(time.Hour) // a jump: the clock moves an hour at once
		check("an hour later", 10)
	})
}

// TestCapacityHintAttackFlapping: a provider whose every answer carries a
// different hint (up and down, hostile values among them): the limit is
// never above the latest valid hint (an earlier, higher one does not
// linger), and the latest replaces a lower earlier one: at the end, with
// the hint 6 after a 2, the limit is the lower of 6 and the learned limit
// (which the drops of the 429s lower; read by removing the cap).
func TestCapacityHintAttackFlapping(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		seq := []string{"7", "2", "9", "1", "garbage", "8", "0", "3", "1073741824", "4", "-4", "6", "1", "2", "6"}
		i := 0
		tr := hintTransport(t, answerFunc(func(*http.Request) (int, []string) { return 429, []string{seq[i]} }))
		hint := 1 << 30
		for ; i < len(seq); i++ {
			if n, err := strconv.Atoi(seq[i]); err == nil && n >= 0 {
				hint = max(n, 1)
			}
			send(t, tr, "http://p.test/")
			if got := hostLimit(t, tr, "p.test"); got > hint {
				t.Errorf("after hint %q: limit %d, above the latest hint %d", seq[i], got, hint)
			}
			time.Sleep(10 * time.Millisecond)
		}
		lim := tr.Hosts()["p.test"].Limiter
		got := lim.Limit()
		lim.SetCap(-1)
		learned := lim.Limit()
		t.Logf("final: limit %d, learned %d, latest hint %d", got, learned, hint)
		if got != min(hint, learned) {
			t.Errorf("final limit %d, want min(latest hint %d, learned %d)", got, hint, learned)
		}
	})
}

// TestCapacityHintAttackOtherHost: a hint from one host caps that host's
// limiter only; hosts that differ in case are one host.
func TestCapacityHintAttackOtherHost(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr := hintTransport(t, answerFunc(func(r *http.Request) (int, []string) {
			if r.URL.Host == "liar.test" || r.URL.Host == "LIAR.test" {
				return 503, []string{"1"}
			}
			return 200, []string{"1"}
		}))
		send(t, tr, "http://ok.test/")
		send(t, tr, "http://ok.test:8080/")
		send(t, tr, "http://LIAR.test/")
		for host, want := range map[string]int{"liar.test": 1, "ok.test": 10, "ok.test:8080": 10} {
			if got := hostLimit(t, tr, host); got != want {
				t.Errorf("host %s: limit %d, want %d", host, got, want)
			}
		}
	})
}

// TestCapacityHintAttackSuppliedLimiter: a limiter supplied by WithGuards
// is left alone by every hint (its owner's cap, 5, or none, stays), even
// after a hold would have relaxed; a host whose supplied guards bring no
// limiter gets a built one, which follows the hint.
func TestCapacityHintAttackSuppliedLimiter(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		owned, _ := limit.New(limit.Config{})
		owned.SetCap(5)
		bare, _ := limit.New(limit.Config{})
		tr := hintTransport(t, answerFunc(func(*http.Request) (int, []string) { return 503, []string{"1"} }),
			httpretry.WithGuards(func(host string) (retry.Guards, error) {
				switch host {
				case "owned.test":
					return retry.Guards{Limiter: owned}, nil
				case "bare.test":
					return retry.Guards{Limiter: bare}, nil
				}
				return retry.Guards{}, nil
			}))
		for range 3 {
			for _, h := range []string{"owned.test", "bare.test", "built.test"} {
				send(t, tr, "http://"+h+"/")
			}
			time.Sleep(700 * time.Millisecond)
		}
		if got := hostLimit(t, tr, "built.test"); got != 1 {
			t.Errorf("built limiter beside supplied guards: limit %d, want the hint 1", got)
		}
		time.Sleep(5 * time.Second)
		if owned.Limit() > 5 {
			t.Errorf("supplied limiter with its owner's cap 5: limit %d after the hints' hold, want the cap kept", owned.Limit())
		}
		if inFlight, _ := owned.SetCap(5); inFlight != 0 {
			t.Errorf("supplied limiter: %d in flight after every request ended", inFlight)
		}
		if got := bare.Limit(); got < 2 {
			t.Errorf("supplied limiter without a cap: limit %d, want no cap of 1 from the hints", got)
		}
	})
}

// TestCapacityHintAttackConcurrent: 64 callers through one transport to
// four hosts whose every shed answer carries a random hint (a third of
// them malformed), for 3 s, then successes for 1 s; run with -race. Every
// slot comes back (nothing in flight or waiting at the end), and 10 s
// after the last hint no cap is left.
func TestCapacityHintAttackConcurrent(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var mu sync.Mutex
		rng := rand.New(rand.NewPCG(1, 2))
		start := time.Now()
		tr := hintTransport(t, answerFunc(func(*http.Request) (int, []string) {
			time.Sleep(time.Millisecond)
			mu.Lock()
			defer mu.Unlock()
			if time.Since(start) > 3*time.Second || rng.IntN(3) == 0 {
				return 200, nil
			}
			switch rng.IntN(6) {
			case 0:
				return 503, []string{"x" + strconv.Itoa(rng.IntN(10))}
			case 1:
				return 429, []string{"1", "2"}
			}
			return 503 + rng.IntN(2)*(429-503), []string{strconv.Itoa(rng.IntN(20))}
		}))
		hosts := []string{"a.test", "b.test", "c.test", "d.test"}
		var wg sync.WaitGroup
		for i := range 64 {
			wg.Go(func() {
				for time.Since(start) < 4*time.Second {
					send(t, tr, "http://"+hosts[i%len(hosts)]+"/")
				}
			})
		}
		wg.Wait()
		time.Sleep(10 * time.Second)
		for _, h := range hosts {
			lim := tr.Hosts()[h].Limiter
			before := lim.Limit()
			in, waiting := lim.SetCap(-1) // removes a cap left in force, if any
			if in != 0 || waiting != 0 {
				t.Errorf("host %s: %d in flight, %d waiting after every request ended", h, in, waiting)
			}
			if after := lim.Limit(); after != before {
				t.Errorf("host %s: limit %d 10 s after the last hint, %d once its cap is removed: a cap was left", h, before, after)
			}
		}
	})
}

// TestCapacityHintAttackHedgeLoses: a hedge (WithHedging) answered with a
// hinted 503 while the first copy of the attempt wins with a 200: the
// provider shed a request and said how many it runs, so the docs' "a 503
// or 429 carrying the field caps the limiter's limit at n at once" asks
// for the cap, whichever copy of the race carried it (a losing answer's
// hint used to be lost: only the winner's answer reached capacityHint).
func TestCapacityHintAttackHedgeLoses(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var n atomic.Int64
		tr := hintTransport(t, answerFunc(func(*http.Request) (int, []string) {
			if n.Add(1) == 1 {
				time.Sleep(50 * time.Millisecond) // the first copy: slow, then good
				return 200, nil
			}
			return 503, []string{"2"} // the hedge: shed, with the hint
		}), httpretry.WithBudget(&budget.Config{}), httpretry.WithHedging(10*time.Millisecond, 0, 1))
		send(t, tr, "http://p.test/")
		if n.Load() != 2 {
			t.Fatalf("%d copies sent, want 2 (a hedge)", n.Load())
		}
		if got := hostLimit(t, tr, "p.test"); got != 2 {
			t.Errorf("after a hedge answered 503 with %s: 2: limit %d, want 2", wire.CapacityHeader, got)
		}
	})
}

// TestCapacityHintAttackRaiseGrants: a higher hint raises the cap at once
// for the requests waiting under a lower one: after a hint of 1, six
// requests at once go out one at a time; the one in flight is answered
// 429 with a hint of 4, and four of the five waiting go out at once.
func TestCapacityHintAttackRaiseGrants(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var n, inFlight, peak atomic.Int64
		gate := make(chan struct{})
		tr := hintTransport(t, answerFunc(func(*http.Request) (int, []string) {
			switch n.Add(1) {
			case 1:
				return 503, []string{"1"}
			case 2:
				<-gate
				return 429, []string{"4"}
			}
			in := inFlight.Add(1)
			defer inFlight.Add(-1)
			for v := peak.Load(); in > v && !peak.CompareAndSwap(v, in); v = peak.Load() {
			}
			time.Sleep(10 * time.Millisecond)
			return 200, nil
		}))
		send(t, tr, "http://p.test/")
		var wg sync.WaitGroup
		for range 6 {
			wg.Go(func() { send(t, tr, "http://p.test/") })
		}
		synctest.Wait()
		if got := n.Load(); got != 2 {
			t.Fatalf("%d requests reached the provider under the hint of 1, want 2 (the hinted one, then one)", got)
		}
		close(gate)
		wg.Wait()
		if got := peak.Load(); got != 4 {
			t.Errorf("after the hint of 4: %d requests in flight at once, want 4", got)
		}
	})
}
