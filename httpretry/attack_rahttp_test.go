// Black-box attack on the Retry-After of every retried failure (408, 429,
// 500, 502, 503, 504, in-progress 409) as a floor on the next sleep, and its
// interplay with the deadline, WithMaxRetryAfter, the breaker, hedging, the
// stale cache and the fallback.

package httpretry_test

import (
	"context"
	"io"
	"math"
	"net/http"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stormguard/stormguard/backoff"
	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/budget"
	"github.com/stormguard/stormguard/httpretry"
	"github.com/stormguard/stormguard/retry"
	"github.com/stormguard/stormguard/wire"
)

// rahBudget lets hedges and retries go ("no budget, no hedge").
var rahBudget = httpretry.WithBudget(&budget.Config{Ratio: 1, MinPerSecond: 1000})

type rahRT func(*http.Request) (*http.Response, error)

func (f rahRT) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

func rahResp(r *http.Request, code int, ra string) *http.Response {
	h := make(http.Header)
	if ra != "" {
		h.Set("Retry-After", ra)
	}
	return &http.Response{StatusCode: code, Status: http.StatusText(code), Header: h,
		Body: io.NopCloser(strings.NewReader("x")), ContentLength: 1, Request: r, ProtoMajor: 1, ProtoMinor: 1, Proto: "HTTP/1.1"}
}

func rahBackoff(t *testing.T, r float64) *backoff.Backoff {
	b, err := backoff.New(backoff.Config{Rand: func() float64 { return r }})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// rahScript is a base that answers the n-th send with answers[n] (the last
// one repeated) and records when each send came.
type rahScript struct {
	mu      sync.Mutex
	answers []func(*http.Request) *http.Response
	times   []time.Time
}

func (s *rahScript) RoundTrip(r *http.Request) (*http.Response, error) {
	s.mu.Lock()
	n := len(s.times)
	s.times = append(s.times, time.Now())
	a := s.answers[min(n, len(s.answers)-1)]
	s.mu.Unlock()
	return a(r), nil
}

func (s *rahScript) calls() []time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]time.Time(nil), s.times...)
}

func rahAns(code int, ra string) func(*http.Request) *http.Response {
	return func(r *http.Request) *http.Response { return rahResp(r, code, ra) }
}

func rahTransport(t *testing.T, base http.RoundTripper, rnd float64, opts ...httpretry.Option) *httpretry.Transport {
	all := []httpretry.Option{httpretry.WithBreaker(nil), httpretry.WithBudget(nil), httpretry.WithLimit(nil),
		httpretry.WithRetry(retry.WithBackoff(rahBackoff(t, rnd)))}
	tr, err := httpretry.NewTransport(base, append(all, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	return tr
}

func rahDo(t *testing.T, tr http.RoundTripper, req *http.Request) *http.Response {
	t.Helper()
	resp, err := tr.RoundTrip(req)
	if err != nil {
		t.Fatalf("RoundTrip: %v", err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp
}

// rahSync runs f in a bubble as a subtest of its own (a failed
// synctest.Test ends the loop that called it).
func rahSync(t *testing.T, f func(t *testing.T)) {
	t.Helper()
	t.Run("", func(t *testing.T) { synctest.Test(t, f) })
}

func rahGet() *http.Request {
	req, _ := http.NewRequest(http.MethodGet, "http://rah.example/a", nil)
	return req
}

// "a Retry-After on any failure the transport retries (408, 429, 500, 502,
// 503, 504 ...) (delay-seconds or any of the three HTTP-date forms) is a
// floor, spread by up to half of it again ... one that returns 0 ... sleeps
// the hint exactly".
func TestAttackRAHTTPFloorEveryStatusEveryForm(t *testing.T) {
	forms := map[string]func(time.Time) string{
		"seconds": func(time.Time) string { return "3" },
		"imf":     func(n time.Time) string { return n.Add(3 * time.Second).UTC().Format(http.TimeFormat) },
		"rfc850":  func(n time.Time) string { return n.Add(3 * time.Second).UTC().Format("Monday, 02-Jan-06 15:04:05 GMT") },
		"asctime": func(n time.Time) string { return n.Add(3 * time.Second).UTC().Format(time.ANSIC) },
	}
	for _, code := range []int{408, 429, 500, 502, 503, 504} {
		for name, form := range forms {
			for _, rnd := range []float64{0, 0.999} {
				rahSync(t, func(t *testing.T) {
					s := &rahScript{answers: []func(*http.Request) *http.Response{
						func(r *http.Request) *http.Response { return rahResp(r, code, form(time.Now())) },
						rahAns(200, ""),
					}}
					tr := rahTransport(t, s, rnd)
					resp := rahDo(t, tr, rahGet())
					c := s.calls()
					if resp.StatusCode != 200 || len(c) != 2 {
						t.Fatalf("%d %s: status %d after %d sends, want 200 after 2", code, name, resp.StatusCode, len(c))
					}
					gap := c[1].Sub(c[0])
					if rnd == 0 && gap != 3*time.Second {
						t.Errorf("%d %s rand 0: slept %v, want exactly 3s", code, name, gap)
					}
					if rnd > 0 && (gap < 3*time.Second || gap >= 4500*time.Millisecond) {
						t.Errorf("%d %s rand .999: slept %v, want in [3s, 4.5s)", code, name, gap)
					}
				})
			}
		}
	}
}

// A date at or before now gives 0, garbage is ignored as if absent: the
// backoff alone (0 with a random source of 0) sets the sleep.
func TestAttackRAHTTPPastAndMalformedHints(t *testing.T) {
	vals := map[string]func(time.Time) string{
		"past":     func(n time.Time) string { return n.Add(-time.Hour).UTC().Format(http.TimeFormat) },
		"zero":     func(time.Time) string { return "0" },
		"negative": func(time.Time) string { return "-5" },
		"fraction": func(time.Time) string { return "1.5" },
		"garbage":  func(time.Time) string { return "soon" },
	}
	for _, code := range []int{408, 500, 502, 504} {
		for name, v := range vals {
			rahSync(t, func(t *testing.T) {
				s := &rahScript{answers: []func(*http.Request) *http.Response{
					func(r *http.Request) *http.Response { return rahResp(r, code, v(time.Now())) },
					rahAns(200, ""),
				}}
				tr := rahTransport(t, s, 0)
				resp := rahDo(t, tr, rahGet())
				c := s.calls()
				if resp.StatusCode != 200 || len(c) != 2 || c[1].Sub(c[0]) != 0 {
					t.Errorf("%d %s: status %d, %d sends", code, name, resp.StatusCode, len(c))
				}
			})
		}
	}
}

// "If the wait would end past the deadline ... or exceeds the maximum
// (retry.WithMaxRetryAfter, 1 minute by default), the transport gives up at
// once and returns that response", marked with the give-up header (reason
// "deadline": "the wait the server asked for ends past the deadline or
// exceeds the client's maximum") and its retry-after.
func TestAttackRAHTTPGiveUpAtOnce(t *testing.T) {
	type tc struct {
		name   string
		ra     func(time.Time) string
		opts   []httpretry.Option
		ctxDL  time.Duration
		wantRA time.Duration
	}
	cases := []tc{
		{name: "above default max", ra: func(time.Time) string { return "61" }, wantRA: 61 * time.Second},
		{name: "date above default max", ra: func(n time.Time) string { return n.Add(2 * time.Minute).UTC().Format(http.TimeFormat) }, wantRA: 2 * time.Minute},
		{name: "huge", ra: func(time.Time) string { return "99999999999999999999" }, wantRA: math.MaxInt64},
		{name: "above set max", ra: func(time.Time) string { return "11" }, opts: []httpretry.Option{httpretry.WithRetry(retry.WithMaxRetryAfter(10 * time.Second))}, wantRA: 11 * time.Second},
		{name: "past WithTimeout", ra: func(time.Time) string { return "10" }, opts: []httpretry.Option{httpretry.WithTimeout(5 * time.Second)}, wantRA: 10 * time.Second},
		{name: "equal WithTimeout", ra: func(time.Time) string { return "5" }, opts: []httpretry.Option{httpretry.WithTimeout(5 * time.Second)}, wantRA: 5 * time.Second},
		{name: "past ctx deadline", ra: func(time.Time) string { return "10" }, ctxDL: 5 * time.Second, wantRA: 10 * time.Second},
		{name: "date past ctx deadline", ra: func(n time.Time) string { return n.Add(10 * time.Second).UTC().Format(http.TimeFormat) }, ctxDL: 5 * time.Second, wantRA: 10 * time.Second},
	}
	for _, code := range []int{408, 500, 502, 504} {
		for _, c := range cases {
			rahSync(t, func(t *testing.T) {
				s := &rahScript{answers: []func(*http.Request) *http.Response{
					func(r *http.Request) *http.Response { return rahResp(r, code, c.ra(time.Now())) },
					rahAns(200, ""),
				}}
				tr := rahTransport(t, s, 0, c.opts...)
				req := rahGet()
				if c.ctxDL > 0 {
					ctx, cancel := context.WithTimeout(context.Background(), c.ctxDL)
					defer cancel()
					req = req.WithContext(ctx)
				}
				start := time.Now()
				resp := rahDo(t, tr, req)
				if el := time.Since(start); el != 0 {
					t.Errorf("%d %s: gave up after %v, want at once", code, c.name, el)
				}
				if n := len(s.calls()); resp.StatusCode != code || n != 1 {
					t.Fatalf("%d %s: status %d after %d sends, want %d after 1", code, c.name, resp.StatusCode, n, code)
				}
				g, ok := wire.ParseGiveUp(resp.Header.Get(wire.GiveUpHeader))
				if !ok || g.Reason != "deadline" || g.Attempts != 1 {
					t.Errorf("%d %s: give-up %q, want deadline;attempts=1", code, c.name, resp.Header.Get(wire.GiveUpHeader))
				}
				want := c.wantRA
				if want != math.MaxInt64 {
					want = want.Round(time.Second)
				}
				if g.RetryAfter != want {
					t.Errorf("%d %s: give-up retry-after %v (%q), want %v", code, c.name, g.RetryAfter, resp.Header.Get(wire.GiveUpHeader), want)
				}
			})
		}
	}
}

// A hint within the deadline sleeps and retries; within a raised maximum too.
func TestAttackRAHTTPWithinDeadlineAndRaisedMax(t *testing.T) {
	for _, code := range []int{408, 502, 504} {
		rahSync(t, func(t *testing.T) {
			s := &rahScript{answers: []func(*http.Request) *http.Response{rahAns(code, "4"), rahAns(200, "")}}
			tr := rahTransport(t, s, 0.999, httpretry.WithTimeout(5*time.Second))
			resp := rahDo(t, tr, rahGet())
			c := s.calls()
			if resp.StatusCode != 200 || len(c) != 2 {
				t.Fatalf("%d: status %d after %d sends", code, resp.StatusCode, len(c))
			}
			if gap := c[1].Sub(c[0]); gap < 4*time.Second || gap >= 5*time.Second {
				t.Errorf("%d: slept %v, want in [4s, 5s)", code, gap)
			}
		})
		rahSync(t, func(t *testing.T) {
			s := &rahScript{answers: []func(*http.Request) *http.Response{rahAns(code, "120"), rahAns(200, "")}}
			tr := rahTransport(t, s, 0, httpretry.WithRetry(retry.WithMaxRetryAfter(5*time.Minute)))
			resp := rahDo(t, tr, rahGet())
			c := s.calls()
			if resp.StatusCode != 200 || len(c) != 2 || c[1].Sub(c[0]) != 120*time.Second {
				t.Errorf("%d: status %d after %d sends", code, resp.StatusCode, len(c))
			}
		})
	}
}

// The breaker is told the hint (breaker.Fail): a failure that opens it
// keeps it open at least that long.
func TestAttackRAHTTPBreakerToldHint(t *testing.T) {
	for _, tcase := range []struct {
		code   int
		method string
	}{{408, "GET"}, {500, "GET"}, {500, "POST"}, {502, "GET"}, {504, "GET"}, {502, "POST"}} {
		rahSync(t, func(t *testing.T) {
			s := &rahScript{answers: []func(*http.Request) *http.Response{rahAns(tcase.code, "30")}}
			tr := rahTransport(t, s, 0, httpretry.WithBreaker(&breaker.Config{ConsecutiveFailures: 1, OpenFor: time.Second}),
				httpretry.WithRetry(retry.WithMaxAttempts(1)))
			req, _ := http.NewRequest(tcase.method, "http://rah.example/a", strings.NewReader("b"))
			req.Header.Set("Idempotency-Key", "k1")
			rahDo(t, tr, req)
			snap := tr.Hosts()["rah.example"].Breaker.Snapshot()
			if snap.State != breaker.Open || snap.HalfOpenIn < 30*time.Second {
				t.Errorf("%d %s: breaker %v, next probe in %v, want open for >= 30s", tcase.code, tcase.method, snap.State, snap.HalfOpenIn)
			}
			// A request now fails fast; its give-up says when to come back.
			resp, err := tr.RoundTrip(rahGet())
			if err == nil {
				resp.Body.Close()
				t.Fatalf("%d: want an error, got %d", tcase.code, resp.StatusCode)
			}
			if ra := retry.RetryAfter(err); ra < 29*time.Second {
				t.Errorf("%d %s: circuit-open give-up retry-after %v, want >= ~30s", tcase.code, tcase.method, ra)
			}
		})
	}
}

// rahHedgeBase: each send (first copy or hedge) is answered by ans after
// lat, honouring the request's context.
func rahHedgeBase(lat func(*http.Request) time.Duration, ans func(*http.Request) *http.Response, sends *[]string, mu *sync.Mutex) http.RoundTripper {
	return rahRT(func(r *http.Request) (*http.Response, error) {
		mu.Lock()
		*sends = append(*sends, r.Header.Get(wire.AttemptHeader))
		mu.Unlock()
		select {
		case <-time.After(lat(r)):
			return ans(r), nil
		case <-r.Context().Done():
			return nil, r.Context().Err()
		}
	})
}

// "the host has not pushed back in the last 5 s (... any failed answer, a
// 408, 500, 502 or 504, with a Retry-After ...; a longer Retry-After holds
// for as long)".
func TestAttackRAHTTPHedgeHeldAfterHint(t *testing.T) {
	for _, code := range []int{408, 500, 502, 504} {
		for _, tc := range []struct {
			ra   string
			hold time.Duration
		}{{"1", 5 * time.Second}, {"10", 10 * time.Second}} {
			rahSync(t, func(t *testing.T) {
				var mu sync.Mutex
				var sends []string
				failing := true
				base := rahHedgeBase(func(*http.Request) time.Duration {
					mu.Lock()
					defer mu.Unlock()
					if failing {
						return 5 * time.Millisecond
					}
					return 12 * time.Millisecond
				}, func(r *http.Request) *http.Response {
					mu.Lock()
					defer mu.Unlock()
					if failing {
						return rahResp(r, code, tc.ra)
					}
					return rahResp(r, 200, "")
				}, &sends, &mu)
				tr := rahTransport(t, base, 0, rahBudget, httpretry.WithHedging(10*time.Millisecond, 0, 1), httpretry.WithRetry(retry.WithMaxAttempts(1)))
				rahDo(t, tr, rahGet())
				mu.Lock()
				failing = false
				sends = nil
				mu.Unlock()
				start := time.Now()
				time.Sleep(tc.hold - 500*time.Millisecond - time.Since(start))
				rahDo(t, tr, rahGet())
				mu.Lock()
				held := len(sends)
				sends = nil
				mu.Unlock()
				if held != 1 {
					t.Errorf("%d RA %s: %d sends %v before the hold ended, want 1 (no hedge)", code, tc.ra, held, tc.hold)
				}
				time.Sleep(time.Second)
				rahDo(t, tr, rahGet())
				mu.Lock()
				after := len(sends)
				mu.Unlock()
				if after != 2 {
					t.Errorf("%d RA %s: %d sends after the hold, want 2 (a hedge)", code, tc.ra, after)
				}
			})
		}
	}
}

// rahRace runs one hedged GET whose first copy (no attempt field) and hedge
// (attempt 2) answer after the given latencies with the given Retry-After
// (statuses code), then 200 on the retry; it returns the gap between the
// race's end and the retry.
func rahRace(t *testing.T, code int, firstLat time.Duration, firstRA string, hedgeLat time.Duration, hedgeRA string) (gap time.Duration, sends []string) {
	var mu sync.Mutex
	var raceEnd, retryAt time.Time
	base := rahHedgeBase(func(r *http.Request) time.Duration {
		switch r.Header.Get(wire.AttemptHeader) {
		case "":
			return firstLat
		case "2":
			return hedgeLat
		}
		return 5 * time.Millisecond
	}, func(r *http.Request) *http.Response {
		mu.Lock()
		defer mu.Unlock()
		switch r.Header.Get(wire.AttemptHeader) {
		case "":
			raceEnd = time.Now()
			return rahResp(r, code, firstRA)
		case "2":
			raceEnd = time.Now()
			return rahResp(r, code, hedgeRA)
		}
		if retryAt.IsZero() {
			retryAt = time.Now()
		}
		return rahResp(r, 200, "")
	}, &sends, &mu)
	tr := rahTransport(t, base, 0, rahBudget, httpretry.WithHedging(10*time.Millisecond, 0, 1))
	resp := rahDo(t, tr, rahGet())
	if resp.StatusCode != 200 {
		t.Fatalf("status %d, sends %q", resp.StatusCode, sends)
	}
	mu.Lock()
	defer mu.Unlock()
	return retryAt.Sub(raceEnd), sends
}

// A hedged race whose copies all fail: the server's Retry-After, given with
// one of them, is still the floor of the next sleep (the race keeps "a longer
// Retry-After" so that the loop heeds it). 503 is the control, as before today.
func TestAttackRAHTTPHedgedRaceKeepsHintOfFirstCopy(t *testing.T) {
	for _, code := range []int{503, 502, 504, 408, 500} {
		rahSync(t, func(t *testing.T) {
			// The first copy answers at 50 ms with Retry-After: 10, the
			// hedge (sent at 10 ms) after it at 80 ms with none.
			gap, sends := rahRace(t, code, 50*time.Millisecond, "10", 70*time.Millisecond, "")
			if len(sends) != 3 {
				t.Fatalf("%d: sends %q, want first copy, hedge, retry", code, sends)
			}
			if gap < 10*time.Second-80*time.Millisecond {
				t.Errorf("%d: the retry came %v after the race's last answer; the first copy's Retry-After: 10 (50 ms in) asked for >= 10s", code, gap)
			}
		})
	}
}

// Same, the hint on a hedge that failed before the first copy did.
func TestAttackRAHTTPHedgedRaceKeepsHintOfEarlierHedge(t *testing.T) {
	for _, code := range []int{503, 502} {
		rahSync(t, func(t *testing.T) {
			// The hedge (sent at 10 ms) answers at 20 ms with
			// Retry-After: 10; the first copy at 50 ms with none.
			gap, sends := rahRace(t, code, 50*time.Millisecond, "", 10*time.Millisecond, "10")
			if len(sends) != 3 {
				t.Fatalf("%d: sends %q, want first copy, hedge, retry", code, sends)
			}
			if gap < 10*time.Second-30*time.Millisecond {
				t.Errorf("%d: the retry came %v after the first copy's answer; the hedge's Retry-After: 10 (20 ms in) asked for >= 10s", code, gap)
			}
		})
	}
}

// rahCacheBase answers the first GET 200 (cacheable, stale at once), then
// code with Retry-After ra.
func rahStaleTransport(t *testing.T, code int, ra string, opts ...httpretry.Option) (*httpretry.Transport, *rahScript) {
	s := &rahScript{answers: []func(*http.Request) *http.Response{
		func(r *http.Request) *http.Response {
			resp := rahResp(r, 200, "")
			resp.Header.Set("Cache-Control", "max-age=0")
			resp.Header.Set("Date", time.Now().UTC().Format(http.TimeFormat))
			return resp
		},
		rahAns(code, ra),
	}}
	return rahTransport(t, s, 0, append([]httpretry.Option{httpretry.WithStaleCache(1<<20, time.Hour, false)}, opts...)...), s
}

// "The cached response is served ... when ... the deadline came (the
// give-ups WithFallback serves), and when it gives up on a 500, 502, 503 or
// 504 for any other reason".
func TestAttackRAHTTPStaleServedOnHintGiveUp(t *testing.T) {
	for _, code := range []int{408, 429, 500, 502, 503, 504} {
		for _, tc := range []struct {
			name string
			ra   string
			opts []httpretry.Option
			want string
		}{
			{"above max", "120", nil, "deadline;attempts=1;retry-after=120;stale="},
			{"past deadline", "10", []httpretry.Option{httpretry.WithTimeout(5 * time.Second)}, "deadline;attempts=1;retry-after=10;stale="},
		} {
			rahSync(t, func(t *testing.T) {
				tr, s := rahStaleTransport(t, code, tc.ra, tc.opts...)
				rahDo(t, tr, rahGet())
				time.Sleep(2 * time.Second)
				start := time.Now()
				resp := rahDo(t, tr, rahGet())
				if resp.StatusCode != 200 || time.Since(start) != 0 || len(s.calls()) != 2 {
					t.Fatalf("%d %s: status %d after %v, %d sends; want the kept 200 at once", code, tc.name, resp.StatusCode, time.Since(start), len(s.calls()))
				}
				if st := resp.Header.Get("Stormguard-Stale"); !strings.HasPrefix(st, tc.want) {
					t.Errorf("%d %s: Stormguard-Stale %q, want %q...", code, tc.name, st, tc.want)
				}
			})
		}
	}
}

// WithFallback: "err says why (retry.Error.Reason), after how many attempts,
// and carries the last failure (with the server's hint ...)".
func TestAttackRAHTTPFallbackOnHintGiveUp(t *testing.T) {
	for _, code := range []int{408, 500, 502, 504} {
		rahSync(t, func(t *testing.T) {
			s := &rahScript{answers: []func(*http.Request) *http.Response{rahAns(code, "120")}}
			var got *retry.Error
			tr := rahTransport(t, s, 0, httpretry.WithFallback(func(req *http.Request, err *retry.Error) (*http.Response, error) {
				got = err
				return rahResp(req, 299, ""), nil
			}))
			resp := rahDo(t, tr, rahGet())
			if resp.StatusCode != 299 || got == nil {
				t.Fatalf("%d: status %d, fallback err %v", code, resp.StatusCode, got)
			}
			if got.Reason != retry.Deadline || got.Attempts != 1 || retry.RetryAfter(got) != 120*time.Second {
				t.Errorf("%d: fallback err reason %v attempts %d retry-after %v, want deadline, 1, 120s", code, got.Reason, got.Attempts, retry.RetryAfter(got))
			}
		})
	}
}

// "500 | once, and only for an idempotent method": a keyed POST's 500 with
// a Retry-After is not retried; a keyed POST's 502 with one is, after it.
func TestAttackRAHTTPKeyedPost(t *testing.T) {
	rahSync(t, func(t *testing.T) {
		s := &rahScript{answers: []func(*http.Request) *http.Response{rahAns(500, "1"), rahAns(200, "")}}
		tr := rahTransport(t, s, 0)
		req, _ := http.NewRequest(http.MethodPost, "http://rah.example/a", strings.NewReader("b"))
		req.Header.Set("Idempotency-Key", "k1")
		resp := rahDo(t, tr, req)
		if resp.StatusCode != 500 || len(s.calls()) != 1 {
			t.Errorf("keyed POST 500: status %d after %d sends, want 500 after 1", resp.StatusCode, len(s.calls()))
		}
		if g, ok := wire.ParseGiveUp(resp.Header.Get(wire.GiveUpHeader)); !ok || g.Reason != "not-retryable" {
			t.Errorf("keyed POST 500: give-up %q", resp.Header.Get(wire.GiveUpHeader))
		}
	})
	rahSync(t, func(t *testing.T) {
		s := &rahScript{answers: []func(*http.Request) *http.Response{rahAns(502, "2"), rahAns(200, "")}}
		tr := rahTransport(t, s, 0, httpretry.WithAutoIdempotencyKey())
		req, _ := http.NewRequest(http.MethodPost, "http://rah.example/a", strings.NewReader("b"))
		resp := rahDo(t, tr, req)
		c := s.calls()
		if resp.StatusCode != 200 || len(c) != 2 || c[1].Sub(c[0]) != 2*time.Second {
			t.Errorf("auto-keyed POST 502: status %d after %d sends", resp.StatusCode, len(c))
		}
	})
	// A GET's 500 is retried once, after the hint; the second 500 is the end.
	rahSync(t, func(t *testing.T) {
		s := &rahScript{answers: []func(*http.Request) *http.Response{rahAns(500, "2")}}
		tr := rahTransport(t, s, 0)
		resp := rahDo(t, tr, rahGet())
		c := s.calls()
		if resp.StatusCode != 500 || len(c) != 2 || c[1].Sub(c[0]) != 2*time.Second {
			t.Errorf("GET 500s: status %d after %d sends", resp.StatusCode, len(c))
		}
	})
}

// "other 4xx ... no": a 400, 404, 409 without a key, 422 with a Retry-After
// is returned at once, unmarked, not a breaker failure, not a push-back.
func TestAttackRAHTTP4xxWithHintNotRetried(t *testing.T) {
	for _, code := range []int{400, 404, 409, 422} {
		rahSync(t, func(t *testing.T) {
			s := &rahScript{answers: []func(*http.Request) *http.Response{rahAns(code, "1"), rahAns(200, "")}}
			tr := rahTransport(t, s, 0, httpretry.WithBreaker(&breaker.Config{ConsecutiveFailures: 1}))
			resp := rahDo(t, tr, rahGet())
			if resp.StatusCode != code || len(s.calls()) != 1 {
				t.Errorf("%d: status %d after %d sends, want 1 send", code, resp.StatusCode, len(s.calls()))
			}
			if v := resp.Header.Get(wire.GiveUpHeader); v != "" {
				t.Errorf("%d: give-up header %q on an answer not retried", code, v)
			}
			if st := tr.Hosts()["rah.example"].Breaker.Snapshot(); st.State != breaker.Closed || st.Failures != 0 {
				t.Errorf("%d: breaker %v with %d failures", code, st.State, st.Failures)
			}
		})
		rahSync(t, func(t *testing.T) {
			var mu sync.Mutex
			var sends []string
			first := true
			base := rahHedgeBase(func(*http.Request) time.Duration {
				mu.Lock()
				defer mu.Unlock()
				if first {
					return 5 * time.Millisecond
				}
				return 12 * time.Millisecond
			}, func(r *http.Request) *http.Response {
				mu.Lock()
				defer mu.Unlock()
				if first {
					first = false
					return rahResp(r, code, "30")
				}
				return rahResp(r, 200, "")
			}, &sends, &mu)
			tr := rahTransport(t, base, 0, rahBudget, httpretry.WithHedging(10*time.Millisecond, 0, 1))
			rahDo(t, tr, rahGet())
			mu.Lock()
			sends = nil
			mu.Unlock()
			rahDo(t, tr, rahGet())
			mu.Lock()
			defer mu.Unlock()
			if len(sends) != 2 {
				t.Errorf("%d with Retry-After: %d sends of the next slow GET, want 2 (a %d is no push-back: the hedge goes)", code, len(sends), code)
			}
		})
	}
}

// "A response with the don't-retry signal ... is never retried": a hedge
// that failed with it before the first copy failed without it.
func TestAttackRAHTTPHedgedRaceKeepsDontRetryOfEarlierHedge(t *testing.T) {
	rahSync(t, func(t *testing.T) {
		var mu sync.Mutex
		var sends []string
		base := rahHedgeBase(func(r *http.Request) time.Duration {
			switch r.Header.Get(wire.AttemptHeader) {
			case "":
				return 50 * time.Millisecond
			case "2":
				return 10 * time.Millisecond
			}
			return 0
		}, func(r *http.Request) *http.Response {
			resp := rahResp(r, 503, "")
			if r.Header.Get(wire.AttemptHeader) == "2" {
				wire.SetDontRetry(resp.Header)
			}
			return resp
		}, &sends, &mu)
		tr := rahTransport(t, base, 0, rahBudget, httpretry.WithHedging(10*time.Millisecond, 0, 1))
		rahDo(t, tr, rahGet())
		mu.Lock()
		defer mu.Unlock()
		if len(sends) != 2 {
			t.Errorf("sends %q: the hedge's 503 said Stormguard-Retry: no (20 ms in), yet the call was retried", sends)
		}
	})
}
