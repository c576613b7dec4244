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
	"github.com/stormguard/stormguard/httpretry"
	"github.com/stormguard/stormguard/retry"
	"github.com/stormguard/stormguard/wire"
)

const extYear = 365 * 24 * time.Hour

// extBase answers each request with the next of its statuses and
// Retry-After values (the last one repeating), recording when each came.
type extBase struct {
	mu     sync.Mutex
	codes  []int
	ras    []string
	at     []time.Time
	dlines []time.Time
}

func (b *extBase) RoundTrip(req *http.Request) (*http.Response, error) {
	b.mu.Lock()
	i := min(len(b.at), len(b.codes)-1)
	b.at = append(b.at, time.Now())
	dl, _ := req.Context().Deadline()
	b.dlines = append(b.dlines, dl)
	code, ra := b.codes[i], b.ras[min(i, len(b.ras)-1)]
	b.mu.Unlock()
	h := http.Header{}
	if ra != "" {
		h.Set("Retry-After", ra)
	}
	return &http.Response{StatusCode: code, Status: http.StatusText(code), Header: h, Body: io.NopCloser(strings.NewReader("x")),
		Request: req, ProtoMajor: 1, ProtoMinor: 1}, nil
}

func extTransport(t *testing.T, base http.RoundTripper, opts ...httpretry.Option) *httpretry.Transport {
	t.Helper()
	tr, err := httpretry.NewTransport(base, opts...)
	if err != nil {
		t.Fatalf("NewTransport: %v", err)
	}
	return tr
}

// NewTransport: "A bad option value makes NewTransport return an error that
// says which; it never panics."
func TestAttackExtremesNewTransportEdges(t *testing.T) {
	bad := map[string]httpretry.Option{
		"timeout -1":             httpretry.WithTimeout(-1),
		"timeout MinInt64":       httpretry.WithTimeout(math.MinInt64),
		"attempt timeout -1":     httpretry.WithAttemptTimeout(-1),
		"buffer 0":               httpretry.WithBufferBodies(0),
		"buffer -1":              httpretry.WithBufferBodies(-1),
		"hedging delay -1":       httpretry.WithHedging(-1, 0, 1),
		"hedging q 1":            httpretry.WithHedging(0, 1, 1),
		"hedging q NaN":          httpretry.WithHedging(0, math.NaN(), 1),
		"hedging q -0.1":         httpretry.WithHedging(0, -0.1, 1),
		"hedging q +Inf":         httpretry.WithHedging(0, math.Inf(1), 1),
		"hedging max 9":          httpretry.WithHedging(time.Second, 0, 9),
		"hedging max -1":         httpretry.WithHedging(time.Second, 0, -1),
		"hedging max MaxInt":     httpretry.WithHedging(time.Second, 0, math.MaxInt),
		"max hosts 0":            httpretry.WithMaxHosts(0),
		"max hosts -1":           httpretry.WithMaxHosts(-1),
		"stale bytes 0":          httpretry.WithStaleCache(0, 0, false),
		"stale maxStale -1":      httpretry.WithStaleCache(1, -1, false),
		"retry attempts 0":       httpretry.WithRetry(retry.WithMaxAttempts(0)),
		"retry maxRetryAfter -1": httpretry.WithRetry(retry.WithMaxRetryAfter(-1)),
	}
	for name, o := range bad {
		if tr, err := httpretry.NewTransport(nil, o); err == nil || tr != nil {
			t.Errorf("%s: NewTransport = %v, %v; want an error", name, tr, err)
		}
	}
	good := map[string]httpretry.Option{
		"timeout MaxInt64":         httpretry.WithTimeout(math.MaxInt64),
		"attempt timeout MaxInt64": httpretry.WithAttemptTimeout(math.MaxInt64),
		"buffer MaxInt64":          httpretry.WithBufferBodies(math.MaxInt64),
		"hedging MaxInt64":         httpretry.WithHedging(math.MaxInt64, 0.999999, 8),
		"hedging 1ns":              httpretry.WithHedging(1, 0, 0),
		"max hosts MaxInt":         httpretry.WithMaxHosts(math.MaxInt),
		"stale MaxInt64":           httpretry.WithStaleCache(math.MaxInt64, math.MaxInt64, true),
		"retry max":                httpretry.WithRetry(retry.WithMaxAttempts(math.MaxInt), retry.WithMaxRetryAfter(math.MaxInt64)),
	}
	for name, o := range good {
		if _, err := httpretry.NewTransport(nil, o); err != nil {
			t.Errorf("%s: NewTransport: %v; want success", name, err)
		}
	}
}

// ParseRetryAfter at the edges: a number of seconds beyond a Duration
// saturates, a date in year 9999 gives the time until it (saturated), a date
// in the past gives 0, signs/fractions/garbage are not ok.
func TestAttackExtremesParseRetryAfterEdges(t *testing.T) {
	now := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	cases := []struct {
		v    string
		d    time.Duration
		ok   bool
		desc string
	}{
		{"9223372036", 9223372036 * time.Second, true, "largest whole seconds"},
		{"9223372037", math.MaxInt64, true, "just over"},
		{"99999999999999999999999999999999999", math.MaxInt64, true, "huge"},
		{"00000000000000000000000000000000001", time.Second, true, "leading zeros"},
		{"Fri, 31 Dec 9999 23:59:59 GMT", math.MaxInt64, true, "year 9999"},
		{"Mon, 01 Jan 0001 00:00:00 GMT", 0, true, "year 1"},
		{"Thu, 01 Jan 1970 00:00:00 GMT", 0, true, "epoch"},
		{"-1", 0, false, "negative"},
		{"+1", 0, false, "plus"},
		{"1.5", 0, false, "fraction"},
		{"1e9", 0, false, "exponent"},
		{"\x00", 0, false, "NUL"},
		{"   ", 0, false, "spaces"},
		{" 5 ", 5 * time.Second, true, "trimmed"},
	}
	for _, c := range cases {
		d, ok := httpretry.ParseRetryAfter(c.v, now)
		if d != c.d || ok != c.ok {
			t.Errorf("%s: ParseRetryAfter(%q) = %v, %v; want %v, %v", c.desc, c.v, d, ok, c.d, c.ok)
		}
	}
	// now at the extremes of time.Time.
	for _, n := range []time.Time{{}, time.Unix(math.MaxInt64/2, 0), time.Unix(-math.MaxInt64/2, 0)} {
		if d, _ := httpretry.ParseRetryAfter("Fri, 31 Dec 9999 23:59:59 GMT", n); d < 0 {
			t.Errorf("now %v: negative %v", n, d)
		}
	}
}

// A 503 with a Retry-After of years (delay-seconds and a date in year 9999)
// and a request deadline an hour away: the transport gives up at once and
// returns that response marked "deadline", never sleeping.
func TestAttackExtremesRetryAfterYearsGivesUpAtOnce(t *testing.T) {
	for _, ra := range []string{"99999999999999999999", "315360000", "Fri, 31 Dec 9999 23:59:59 GMT"} {
		for _, maxRA := range []time.Duration{0, math.MaxInt64} {
			synctest.Test(t, func(t *testing.T) {
				base := &extBase{codes: []int{503, 200}, ras: []string{ra}}
				opts := []httpretry.Option{}
				if maxRA != 0 {
					opts = append(opts, httpretry.WithRetry(retry.WithMaxRetryAfter(maxRA)))
				}
				tr := extTransport(t, base, opts...)
				ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
				defer cancel()
				req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://ext.example/", nil)
				start := time.Now()
				resp, err := tr.RoundTrip(req)
				if err != nil {
					t.Fatalf("ra %q max %v: %v", ra, maxRA, err)
				}
				resp.Body.Close()
				if resp.StatusCode != 503 || time.Since(start) != 0 || len(base.at) != 1 {
					t.Errorf("ra %q max %v: %d after %v and %d sends; want the 503 at once, 1 send", ra, maxRA, resp.StatusCode, time.Since(start), len(base.at))
				}
				g, ok := wire.ParseGiveUp(resp.Header.Get(wire.GiveUpHeader))
				if !ok || g.Reason != "deadline" || g.RetryAfter < 365*24*time.Hour {
					t.Errorf("ra %q max %v: give-up %q = %+v; want deadline with the retry-after", ra, maxRA, resp.Header.Get(wire.GiveUpHeader), g)
				}
			})
		}
	}
}

// A Retry-After of 100 years honoured (WithMaxRetryAfter of the largest
// Duration) with a request deadline in year 9999: the retry comes no sooner
// than 100 years later, and before 150.
func TestAttackExtremesRetryAfterCenturyHonoured(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		base := &extBase{codes: []int{503, 200}, ras: []string{"3153600000"}} // 100 years
		tr := extTransport(t, base, httpretry.WithRetry(retry.WithMaxRetryAfter(math.MaxInt64)))
		ctx, cancel := context.WithDeadline(context.Background(), time.Date(9999, 1, 1, 0, 0, 0, 0, time.UTC))
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://ext.example/", nil)
		resp, err := tr.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 || len(base.at) != 2 {
			t.Fatalf("%d after %d sends", resp.StatusCode, len(base.at))
		}
		gap := base.at[1].Sub(base.at[0])
		if gap < 100*extYear || gap >= 150*extYear {
			t.Errorf("retried after %v, want in [100y, 150y)", gap)
		}
	})
}

// WithTimeout and WithAttemptTimeout of the largest Duration: requests go
// through, and the attempt's deadline is far away (not in the past through
// an overflow).
func TestAttackExtremesTimeoutsMaxDuration(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		base := &extBase{codes: []int{200}, ras: []string{""}}
		tr := extTransport(t, base, httpretry.WithTimeout(math.MaxInt64), httpretry.WithAttemptTimeout(math.MaxInt64))
		req, _ := http.NewRequest(http.MethodGet, "http://ext.example/", nil)
		resp, err := tr.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if dl := base.dlines[0]; !dl.IsZero() && dl.Before(time.Now().Add(100*extYear)) {
			t.Errorf("attempt deadline %v, want none or far away", dl)
		}
	})
}

// WithTimeout(1ns): the deadline has passed before the first attempt: no
// send, a *retry.Error with Reason Deadline.
func TestAttackExtremesTimeout1ns(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		base := &extBase{codes: []int{200}, ras: []string{""}}
		tr := extTransport(t, base, httpretry.WithTimeout(1))
		req, _ := http.NewRequest(http.MethodGet, "http://ext.example/", nil)
		time.Sleep(0)
		resp, err := tr.RoundTrip(req)
		if err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
		// Either the single attempt ran within the nanosecond (synctest's
		// clock does not move) or it was refused: no panic, no hang.
		if len(base.at) > 1 {
			t.Errorf("%d sends", len(base.at))
		}
	})
}

// Hedging with a fixed delay of the largest Duration never hedges; with
// 1 ns a hedge may go, and at most max copies run.
func TestAttackExtremesHedgingExtremes(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		base := &extBase{codes: []int{200}, ras: []string{""}}
		tr := extTransport(t, base, httpretry.WithHedging(math.MaxInt64, 0, 8))
		req, _ := http.NewRequest(http.MethodGet, "http://ext.example/", nil)
		resp, err := tr.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if len(base.at) != 1 {
			t.Errorf("hedge delay MaxInt64: %d sends, want 1", len(base.at))
		}
	})
}

// A backoff with Base of the largest Duration under a deadline an hour
// away: the 503 is returned at once marked "deadline".
func TestAttackExtremesBackoffMaxBase(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b, err := backoff.New(backoff.Config{Strategy: backoff.Constant, Base: math.MaxInt64})
		if err != nil {
			t.Fatal(err)
		}
		base := &extBase{codes: []int{503, 200}, ras: []string{""}}
		tr := extTransport(t, base, httpretry.WithRetry(retry.WithBackoff(b)))
		ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://ext.example/", nil)
		start := time.Now()
		resp, err := tr.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 503 || time.Since(start) != 0 {
			t.Errorf("%d after %v", resp.StatusCode, time.Since(start))
		}
	})
}
