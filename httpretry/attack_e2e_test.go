package httpretry_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stormguard/stormguard/admission"
	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/httpretry"
	"github.com/stormguard/stormguard/limit"
	"github.com/stormguard/stormguard/retry"
	"github.com/stormguard/stormguard/wire"
)

// e2eSent is one request as it reached the in-memory wire.
type e2eSent struct {
	at       time.Duration // since the bubble's start
	method   string
	attempt  string
	probe    string
	timeout  string
	left     time.Duration // the attempt context's time left when sent (-1: none)
	key      string
	tag      string
	status   int
	retryAft string
	capHint  string
	ansAt    time.Duration
	inBefore int64
}

// e2eNet is an in-memory network: it serves each request with h on a
// goroutine (server context without the client's deadline) and records it.
type e2eNet struct {
	h     http.Handler
	start time.Time
	mu    sync.Mutex
	sent  []*e2eSent
	inFl  atomic.Int64
	maxIn atomic.Int64
	wg    sync.WaitGroup // the server's goroutines: a test waits for them (synctest's bubble must end empty)
}

func (n *e2eNet) RoundTrip(r *http.Request) (*http.Response, error) {
	s := &e2eSent{at: time.Since(n.start), method: r.Method, attempt: r.Header.Get(wire.AttemptHeader),
		probe: r.Header.Get(wire.ProbeHeader), timeout: r.Header.Get(wire.TimeoutHeader), left: -1,
		key: r.Header.Get("Idempotency-Key"), tag: r.Header.Get("X-Tag")}
	if dl, ok := r.Context().Deadline(); ok {
		s.left = time.Until(dl)
	}
	n.mu.Lock()
	n.sent = append(n.sent, s)
	n.mu.Unlock()
	cur := n.inFl.Add(1)
	s.inBefore = cur - 1
	for {
		m := n.maxIn.Load()
		if cur <= m || n.maxIn.CompareAndSwap(m, cur) {
			break
		}
	}
	defer n.inFl.Add(-1)
	sr := r.Clone(context.Background())
	if r.Body != nil {
		b, _ := io.ReadAll(r.Body)
		r.Body.Close()
		sr.Body = io.NopCloser(strings.NewReader(string(b)))
	}
	done := make(chan *http.Response, 1)
	n.wg.Go(func() {
		rec := httptest.NewRecorder()
		n.h.ServeHTTP(rec, sr)
		done <- rec.Result()
	})
	select {
	case resp := <-done:
		resp.Request = r
		n.mu.Lock()
		s.status = resp.StatusCode
		s.retryAft = resp.Header.Get("Retry-After")
		s.capHint = resp.Header.Get(wire.CapacityHeader)
		s.ansAt = time.Since(n.start)
		n.mu.Unlock()
		return resp, nil
	case <-r.Context().Done():
		return nil, r.Context().Err()
	}
}

func (n *e2eNet) log() []e2eSent {
	n.mu.Lock()
	defer n.mu.Unlock()
	out := make([]e2eSent, len(n.sent))
	for i, s := range n.sent {
		out[i] = *s
	}
	return out
}

func e2eDo(t *testing.T, tr http.RoundTripper, ctx context.Context, method, tag string, body string) (*http.Response, error) {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, "http://provider.test/", rd)
	if err != nil {
		t.Fatal(err)
	}
	if tag != "" {
		req.Header.Set("X-Tag", tag)
	}
	return tr.RoundTrip(req)
}

// TestAttackE2ETimeoutHeaderMatchesTimeLeft: every attempt that carries
// Stormguard-Timeout-Ms must say the time left until the earlier of the
// attempt's timeout and the call's deadline, rounded down: never more than
// what the attempt context has left when the attempt is sent. Here the
// client's limiter (Max 1) makes the second call wait 2 s for a slot.
func TestAttackE2ETimeoutHeaderMatchesTimeLeft(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctl, err := admission.New(admission.Config{})
		if err != nil {
			t.Fatal(err)
		}
		n := &e2eNet{start: time.Now(), h: ctl.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			time.Sleep(2 * time.Second)
			w.WriteHeader(200)
		}))}
		defer n.wg.Wait() // its server goroutines end inside the bubble
		tr, err := httpretry.NewTransport(n, httpretry.WithAttemptTimeout(3*time.Second), httpretry.WithTimeout(4*time.Second),
			httpretry.WithLimit(&limit.Config{Max: 1}))
		if err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		for i := range 2 {
			wg.Go(func() {
				resp, err := e2eDo(t, tr, context.Background(), "GET", strconv.Itoa(i), "")
				if err == nil {
					resp.Body.Close()
				}
			})
			time.Sleep(time.Millisecond)
		}
		wg.Wait()
		for _, s := range n.log() {
			t.Logf("sent at %v attempt=%q timeout=%q ctx-left=%v status=%d", s.at, s.attempt, s.timeout, s.left, s.status)
			if s.left < 0 {
				continue
			}
			ms, err := strconv.ParseInt(s.timeout, 10, 64)
			if err != nil {
				t.Errorf("attempt at %v: no/invalid timeout field %q (its context has %v left)", s.at, s.timeout, s.left)
				continue
			}
			if time.Duration(ms)*time.Millisecond > s.left {
				t.Errorf("attempt at %v says %d ms left, its context has %v", s.at, ms, s.left)
			}
		}
	})
}

// TestAttackE2EGiveUpOnAdmissionRetryRefused: a GET retried into admission's
// retry-ratio refusal (503 + don't-retry) is handed back marked
// not-retryable with the attempts it made.
func TestAttackE2EGiveUpOnAdmissionRetryRefused(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		// Retries refused outright: ratio 0, floor 0.
		ctl, err := admission.New(admission.Config{MaxInFlight: 1, MaxQueue: -1, RetryRatio: -1, MinRetriesPerSecond: -1,
			RetryAfterSpread: -1})
		if err != nil {
			t.Fatal(err)
		}
		release := make(chan struct{})
		n := &e2eNet{start: time.Now(), h: ctl.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Header.Get("X-Tag") == "hold" {
				<-release
			}
			w.WriteHeader(200)
		}))}
		defer n.wg.Wait() // its server goroutines end inside the bubble
		tr, err := httpretry.NewTransport(n, httpretry.WithTimeout(30*time.Second), httpretry.WithLimit(nil))
		if err != nil {
			t.Fatal(err)
		}
		go func() {
			resp, err := e2eDo(t, tr, context.Background(), "GET", "hold", "")
			if err == nil {
				resp.Body.Close()
			}
		}()
		synctest.Wait()
		// First attempt: shed (queue full, original: no don't-retry), Retry-After 1.
		// Retry after >= 1 s: refused by the ratio (don't-retry).
		var resp *http.Response
		done := make(chan struct{})
		go func() {
			defer close(done)
			resp, err = e2eDo(t, tr, context.Background(), "GET", "x", "")
		}()
		<-done
		close(release)
		for _, s := range n.log() {
			t.Logf("sent at %v tag=%s attempt=%q status=%d retry-after=%q cap=%q", s.at, s.tag, s.attempt, s.status, s.retryAft, s.capHint)
		}
		if err != nil {
			t.Fatalf("err %v", err)
		}
		defer resp.Body.Close()
		gu := resp.Header.Get(wire.GiveUpHeader)
		g, ok := wire.ParseGiveUp(gu)
		t.Logf("status %d give-up %q", resp.StatusCode, gu)
		if !ok || g.Reason != "not-retryable" || g.Attempts != 2 {
			t.Errorf("give-up %q (%+v), want not-retryable;attempts=2", gu, g)
		}
	})
}

var _ = errors.Is
var _ = fmt.Sprint
var _ = retry.Limited

// e2eCapacityCase runs one request against an admission of 3 slots, all
// held, no queue, and returns the host limiter's limit after the answer.
func e2eCapacityCase(t *testing.T, method, key string, preSeen bool, opts ...httpretry.Option) (limitAfter int, log []e2eSent, resp *http.Response, err error) {
	ctl, err := admission.New(admission.Config{MaxInFlight: 3, MaxQueue: -1, RetryAfterSpread: -1})
	if err != nil {
		t.Fatal(err)
	}
	release := make(chan struct{})
	n := &e2eNet{start: time.Now(), h: ctl.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Tag") == "hold" {
			<-release
		}
		w.WriteHeader(200)
	}))}
	defer n.wg.Wait() // its server goroutines end inside the bubble
	tr, err := httpretry.NewTransport(n, append([]httpretry.Option{httpretry.WithTimeout(30 * time.Second)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	mk := func(tag string) *http.Request {
		var body io.Reader
		if method != "GET" {
			body = strings.NewReader("{}")
		}
		req, _ := http.NewRequest(method, "http://provider.test/", body)
		req.Header.Set("X-Tag", tag)
		if key != "" {
			req.Header.Set("Idempotency-Key", key)
		}
		return req
	}
	if preSeen {
		r, e := tr.RoundTrip(mk("pre"))
		if e != nil {
			t.Fatal(e)
		}
		r.Body.Close()
	}
	var wg sync.WaitGroup
	for range 3 {
		wg.Go(func() {
			req, _ := http.NewRequest("GET", "http://provider.test/", nil)
			req.Header.Set("X-Tag", "hold")
			r, e := tr.RoundTrip(req)
			if e == nil {
				r.Body.Close()
			}
		})
	}
	synctest.Wait()
	resp, err = tr.RoundTrip(mk("x"))
	limitAfter = tr.Hosts()["provider.test"].Limiter.Limit()
	close(release)
	wg.Wait()
	return limitAfter, n.log(), resp, err
}

// TestAttackE2ECapacityHintEveryShedAnswer: "a 503 or 429 carrying
// wire.CapacityHeader (an admission's shed answer, "I run n at once") caps
// its limit at n". Admission's shed answers carry the hint whether or not the
// request could be retried.
func TestAttackE2ECapacityHintEveryShedAnswer(t *testing.T) {
	cases := []struct {
		name, method, key string
		preSeen           bool
	}{
		{"GET original shed", "GET", "", false},
		{"POST without key (not retried)", "POST", "", false},
		{"keyed POST whose key was seen (retry: shed with don't-retry)", "POST", "k-e2e-1", true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				lim, log, resp, err := e2eCapacityCase(t, c.method, c.key, c.preSeen)
				for _, s := range log {
					t.Logf("sent at %v %s tag=%s attempt=%q status=%d retry-after=%q cap=%q", s.at, s.method, s.tag, s.attempt, s.status, s.retryAft, s.capHint)
				}
				if resp != nil {
					t.Logf("final %d give-up %q", resp.StatusCode, resp.Header.Get(wire.GiveUpHeader))
					resp.Body.Close()
				} else {
					t.Logf("final err %v", err)
				}
				sawHint := false
				for _, s := range log {
					if s.tag == "x" && s.capHint != "" {
						sawHint = true
					}
				}
				if !sawHint {
					t.Fatalf("no hinted answer: scenario broken")
				}
				if lim != 3 {
					t.Errorf("limiter limit %d right after a shed answer with Stormguard-Capacity: 3, want 3", lim)
				}
			})
		})
	}
}

// TestAttackE2ERetryAfterFloorWithinDeadline: admission sheds with Retry-After: 2;
// the client (2.5 s overall deadline) either waits at least 2 s and sends
// its retry before the deadline, or gives up at once with the shed answer
// (reason deadline). It never sleeps past the deadline.
func TestAttackE2ERetryAfterFloorWithinDeadline(t *testing.T) {
	for trial := range 40 {
		synctest.Test(t, func(t *testing.T) {
			ctl, err := admission.New(admission.Config{MaxInFlight: 1, MaxQueue: -1, RetryAfterBase: 2 * time.Second, RetryAfterSpread: -1})
			if err != nil {
				t.Fatal(err)
			}
			release := make(chan struct{})
			n := &e2eNet{start: time.Now(), h: ctl.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.Header.Get("X-Tag") == "hold" {
					<-release
				}
				w.WriteHeader(200)
			}))}
			defer n.wg.Wait() // its server goroutines end inside the bubble
			tr, err := httpretry.NewTransport(n, httpretry.WithTimeout(2500*time.Millisecond), httpretry.WithLimit(nil))
			if err != nil {
				t.Fatal(err)
			}
			go func() {
				r, e := e2eDo(t, tr, context.Background(), "GET", "hold", "")
				if e == nil {
					r.Body.Close()
				}
			}()
			synctest.Wait()
			start := time.Now()
			resp, err := e2eDo(t, tr, context.Background(), "GET", "x", "")
			took := time.Since(start)
			close(release)
			var xs []e2eSent
			for _, s := range n.log() {
				if s.tag == "x" {
					xs = append(xs, s)
				}
			}
			gu := ""
			if resp != nil {
				gu = resp.Header.Get(wire.GiveUpHeader)
				resp.Body.Close()
			}
			if took > 2500*time.Millisecond {
				t.Errorf("trial %d: RoundTrip took %v, past the 2.5 s deadline (err %v, give-up %q)", trial, took, err, gu)
			}
			for i := 1; i < len(xs); i++ {
				if gap := xs[i].at - xs[i-1].at; gap < 2*time.Second {
					t.Errorf("trial %d: retry %v after a Retry-After: 2 answer", trial, gap)
				}
				if xs[i].at-xs[0].at >= 2500*time.Millisecond {
					t.Errorf("trial %d: attempt sent at %v, past the deadline", trial, xs[i].at-xs[0].at)
				}
			}
			if len(xs) == 1 && took > 10*time.Millisecond {
				t.Errorf("trial %d: gave up after %v (one attempt, give-up %q, err %v), want at once", trial, took, gu, err)
			}
			if trial < 3 || t.Failed() {
				t.Logf("trial %d: %d attempts, took %v, give-up %q, err %v", trial, len(xs), took, gu, err)
			}
		})
	}
}

// TestAttackE2ELimitEarliestDeadlineFirst: over the limit, waiting attempts go out
// earliest deadline first.
func TestAttackE2ELimitEarliestDeadlineFirst(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctl, _ := admission.New(admission.Config{})
		n := &e2eNet{start: time.Now(), h: ctl.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			time.Sleep(200 * time.Millisecond)
			w.WriteHeader(200)
		}))}
		defer n.wg.Wait() // its server goroutines end inside the bubble
		tr, err := httpretry.NewTransport(n, httpretry.WithLimit(&limit.Config{Max: 1}), httpretry.WithTimeout(time.Minute))
		if err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		for _, d := range []time.Duration{0, 8 * time.Second, 3 * time.Second, 5 * time.Second, 4 * time.Second} {
			wg.Go(func() {
				ctx, cancel := context.WithTimeout(context.Background(), d)
				if d == 0 {
					ctx, cancel = context.WithCancel(context.Background())
				}
				defer cancel()
				resp, err := e2eDo(t, tr, ctx, "GET", d.String(), "")
				if err != nil {
					t.Errorf("%v: %v", d, err)
					return
				}
				resp.Body.Close()
			})
			synctest.Wait()
		}
		wg.Wait()
		var order []string
		for _, s := range n.log() {
			order = append(order, s.tag)
		}
		t.Logf("order at the server: %v", order)
		want := []string{"0s", "3s", "4s", "5s", "8s"}
		if fmt.Sprint(order) != fmt.Sprint(want) {
			t.Errorf("order %v, want %v", order, want)
		}
	})
}

// TestAttackE2ELimitFailFast: calls that cannot make their deadline behind the
// limit fail fast with retry.Limited and a reason, not at their deadline.
func TestAttackE2ELimitFailFast(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctl, _ := admission.New(admission.Config{})
		n := &e2eNet{start: time.Now(), h: ctl.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			time.Sleep(time.Second)
			w.WriteHeader(200)
		}))}
		defer n.wg.Wait() // its server goroutines end inside the bubble
		tr, err := httpretry.NewTransport(n, httpretry.WithLimit(&limit.Config{Max: 1}))
		if err != nil {
			t.Fatal(err)
		}
		for range 5 { // learn the latency
			resp, err := e2eDo(t, tr, context.Background(), "GET", "warm", "")
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
		}
		var wg sync.WaitGroup
		type res struct {
			i    int
			took time.Duration
			err  error
			code int
		}
		var mu sync.Mutex
		var out []res
		for i := range 10 {
			wg.Go(func() {
				ctx, cancel := context.WithTimeout(context.Background(), 2500*time.Millisecond)
				defer cancel()
				start := time.Now()
				resp, err := e2eDo(t, tr, ctx, "GET", strconv.Itoa(i), "")
				r := res{i: i, took: time.Since(start), err: err}
				if err == nil {
					r.code = resp.StatusCode
					resp.Body.Close()
				}
				mu.Lock()
				out = append(out, r)
				mu.Unlock()
			})
			time.Sleep(time.Millisecond)
		}
		wg.Wait()
		for _, r := range out {
			t.Logf("call %d: took %v code %d err %v", r.i, r.took, r.code, r.err)
			if r.err != nil {
				if !errors.Is(r.err, retry.Limited) {
					t.Errorf("call %d failed with %v, want retry.Limited", r.i, r.err)
				}
				if r.took >= 2400*time.Millisecond {
					t.Errorf("call %d failed after %v, at its deadline rather than fast", r.i, r.took)
				}
			}
		}
	})
}

// TestAttackE2EHedgeOnlySafeMethods: "WithHedging sends up to max hedges ... of a
// GET, HEAD or OPTIONS request without a body ... A write is never hedged."
func TestAttackE2EHedgeOnlySafeMethods(t *testing.T) {
	for _, m := range []string{"GET", "HEAD", "OPTIONS", "PUT", "DELETE", "POST", "PATCH", "TRACE", "get", "Get", "head", "options", "PROPFIND", "QUERY"} {
		t.Run(m, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				ctl, _ := admission.New(admission.Config{})
				var first atomic.Bool
				n := &e2eNet{start: time.Now(), h: ctl.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					if first.CompareAndSwap(false, true) {
						time.Sleep(time.Second)
					}
					w.WriteHeader(200)
				}))}
				defer n.wg.Wait() // its server goroutines end inside the bubble
				tr, err := httpretry.NewTransport(n, httpretry.WithHedging(100*time.Millisecond, 0, 2), httpretry.WithAttemptTimeout(5*time.Second))
				if err != nil {
					t.Fatal(err)
				}
				req, err := http.NewRequest(m, "http://provider.test/", nil)
				if err != nil {
					t.Fatal(err)
				}
				req.Header.Set("Idempotency-Key", "k-e2e-hedge-"+m)
				resp, err := tr.RoundTrip(req)
				if err != nil {
					t.Fatal(err)
				}
				resp.Body.Close()
				time.Sleep(2 * time.Second)
				sent := len(n.log())
				hedged := sent > 1
				want := m == "GET" || m == "HEAD" || m == "OPTIONS"
				t.Logf("%s: %d copies sent", m, sent)
				if hedged && !want {
					t.Errorf("%s hedged (%d copies), want never", m, sent)
				}
				if !hedged && want {
					t.Errorf("%s not hedged", m)
				}
			})
		})
	}
}

// e2eCheckTimeoutFields checks that each attempt whose context has a deadline
// carries Stormguard-Timeout-Ms equal to its time left in whole ms (rounded
// down; 1 ms slack), and that attempts of a call with a deadline carry it
// whenever they are not the unchanged first attempt of a plain request.
func e2eCheckTimeoutFields(t *testing.T, log []e2eSent) {
	t.Helper()
	for _, s := range log {
		if s.left < 0 {
			if s.timeout != "" {
				t.Errorf("attempt at %v (%s tag %s attempt %q) carries timeout %q without a deadline", s.at, s.method, s.tag, s.attempt, s.timeout)
			}
			continue
		}
		if s.timeout == "" {
			if s.attempt != "" || s.probe != "" {
				t.Errorf("attempt at %v (tag %s attempt %q probe %q) has %v left but no timeout field", s.at, s.tag, s.attempt, s.probe, s.left)
			}
			continue
		}
		ms, err := strconv.ParseInt(s.timeout, 10, 64)
		if err != nil {
			t.Errorf("attempt at %v: bad timeout field %q", s.at, s.timeout)
			continue
		}
		want := s.left.Milliseconds()
		if ms > want || ms < want-1 {
			t.Errorf("attempt at %v (tag %s attempt %q probe %q): timeout field %d ms, context has %v left", s.at, s.tag, s.attempt, s.probe, ms, s.left)
		}
	}
}

// TestAttackE2ETimeoutFieldThroughBreakerWait: calls that wait behind an open
// breaker and are released (probe mark) carry the time they have left.
func TestAttackE2ETimeoutFieldThroughBreakerWait(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctl, _ := admission.New(admission.Config{})
		start := time.Now()
		n := &e2eNet{start: start, h: ctl.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			time.Sleep(50 * time.Millisecond)
			if time.Since(start) < 2500*time.Millisecond {
				w.WriteHeader(503)
				return
			}
			w.WriteHeader(200)
		}))}
		defer n.wg.Wait() // its server goroutines end inside the bubble
		tr, err := httpretry.NewTransport(n, httpretry.WithTimeout(10*time.Second),
			httpretry.WithBreaker(&breaker.Config{ConsecutiveFailures: 3}), httpretry.WithBudget(nil))
		if err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		for i := range 20 {
			wg.Go(func() {
				ctx, cancel := context.WithTimeout(context.Background(), time.Duration(5+i%4)*time.Second)
				defer cancel()
				resp, err := e2eDo(t, tr, ctx, "GET", strconv.Itoa(i), "")
				if err != nil {
					t.Logf("call %d: %v", i, err)
					return
				}
				if resp.StatusCode != 200 {
					t.Logf("call %d: %d %s", i, resp.StatusCode, resp.Header.Get(wire.GiveUpHeader))
				}
				resp.Body.Close()
			})
			time.Sleep(100 * time.Millisecond)
		}
		wg.Wait()
		log := n.log()
		probes := 0
		for _, s := range log {
			if s.probe != "" {
				probes++
			}
		}
		t.Logf("%d attempts sent, %d with the probe mark", len(log), probes)
		e2eCheckTimeoutFields(t, log)
	})
}

// TestAttackE2ETimeoutFieldOnHedges: a hedge is an attempt on the wire; with a
// deadline it carries its time left and the next attempt number.
func TestAttackE2ETimeoutFieldOnHedges(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctl, _ := admission.New(admission.Config{})
		var first atomic.Bool
		n := &e2eNet{start: time.Now(), h: ctl.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if first.CompareAndSwap(false, true) {
				time.Sleep(time.Second)
			}
			w.WriteHeader(200)
		}))}
		defer n.wg.Wait() // its server goroutines end inside the bubble
		tr, err := httpretry.NewTransport(n, httpretry.WithHedging(100*time.Millisecond, 0, 3), httpretry.WithTimeout(5*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		resp, err := e2eDo(t, tr, ctx, "GET", "h", "")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		time.Sleep(2 * time.Second)
		log := n.log()
		for _, s := range log {
			t.Logf("at %v attempt %q timeout %q left %v", s.at, s.attempt, s.timeout, s.left)
		}
		if len(log) < 2 {
			t.Fatalf("no hedge")
		}
		if log[1].attempt != "2" {
			t.Errorf("hedge attempt header %q, want 2", log[1].attempt)
		}
		e2eCheckTimeoutFields(t, log)
	})
}

// TestAttackE2ECapacityHintPacesClient: a transport with its own limiter, after a
// shed answer with Stormguard-Capacity: 3, starts no attempt while 3 or more
// of its attempts are in flight to the host, until 1 s after the last hinted
// answer.
func TestAttackE2ECapacityHintPacesClient(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctl, _ := admission.New(admission.Config{MaxInFlight: 3, MaxQueue: -1, MinRetriesPerSecond: 100})
		n := &e2eNet{start: time.Now(), h: ctl.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			time.Sleep(100 * time.Millisecond)
			w.WriteHeader(200)
		}))}
		defer n.wg.Wait() // its server goroutines end inside the bubble
		tr, err := httpretry.NewTransport(n, httpretry.WithLimit(&limit.Config{}), httpretry.WithTimeout(20*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		var ok atomic.Int64
		for i := range 60 {
			wg.Go(func() {
				resp, err := e2eDo(t, tr, context.Background(), "GET", strconv.Itoa(i), "")
				if err != nil {
					return
				}
				if resp.StatusCode == 200 {
					ok.Add(1)
				}
				resp.Body.Close()
			})
			if i%20 == 19 {
				time.Sleep(300 * time.Millisecond)
			}
		}
		wg.Wait()
		log := n.log()
		bad := 0
		shed := 0
		for _, s := range log {
			if s.capHint != "" {
				shed++
			}
			// the last hinted answer before this send
			last := time.Duration(-1)
			for _, h := range log {
				if h.capHint != "" && h.ansAt < s.at && h.ansAt > last {
					last = h.ansAt
				}
			}
			if last >= 0 && s.at-last < time.Second && s.inBefore >= 3 {
				bad++
				if bad <= 5 {
					t.Logf("attempt sent at %v with %d in flight, %v after a hinted answer", s.at, s.inBefore, s.at-last)
				}
			}
		}
		t.Logf("%d attempts, %d shed with a hint, %d served of 60; %d sent over the hint", len(log), shed, ok.Load(), bad)
		if bad > 0 {
			t.Errorf("%d attempts started over the capacity hint within 1 s of a hinted answer", bad)
		}
	})
}

// TestAttackE2EBudgetAndAttemptsAgainstFailingProvider: 300 GETs over 3 s to a
// provider whose handler answers 503 (admission lets every retry through):
// each call makes at most 3 attempts, and the retries stay within 10% of the
// requests plus 1 per second over the window.
func TestAttackE2EBudgetAndAttemptsAgainstFailingProvider(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctl, err := admission.New(admission.Config{MinRetriesPerSecond: 10000})
		if err != nil {
			t.Fatal(err)
		}
		n := &e2eNet{start: time.Now(), h: ctl.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(503)
		}))}
		defer n.wg.Wait() // its server goroutines end inside the bubble
		tr, err := httpretry.NewTransport(n, httpretry.WithBreaker(nil), httpretry.WithTimeout(30*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		for i := range 300 {
			wg.Go(func() {
				resp, err := e2eDo(t, tr, context.Background(), "GET", strconv.Itoa(i), "")
				if err == nil {
					resp.Body.Close()
				}
			})
			time.Sleep(10 * time.Millisecond)
		}
		wg.Wait()
		per := map[string]int{}
		retries := 0
		for _, s := range n.log() {
			per[s.tag]++
			if s.attempt != "" {
				retries++
			}
		}
		for tag, c := range per {
			if c > 3 {
				t.Errorf("call %s: %d attempts", tag, c)
			}
		}
		// the whole run fits in one 10 s window (plus the last sleeps)
		max := int(0.1*300) + 13
		t.Logf("%d retries for 300 requests (allowed about %d)", retries, max)
		if retries > max {
			t.Errorf("%d retries for 300 requests, want <= %d", retries, max)
		}
	})
}

// TestAttackE2EGiveUpDeadlineOnLongRetryAfter: admission sheds with Retry-After: 5;
// a call with 3 s left gives up at once with that answer, marked
// "deadline;attempts=1;retry-after=5".
func TestAttackE2EGiveUpDeadlineOnLongRetryAfter(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctl, err := admission.New(admission.Config{MaxInFlight: 1, MaxQueue: -1, RetryAfterBase: 5 * time.Second, RetryAfterSpread: -1})
		if err != nil {
			t.Fatal(err)
		}
		release := make(chan struct{})
		n := &e2eNet{start: time.Now(), h: ctl.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Header.Get("X-Tag") == "hold" {
				<-release
			}
			w.WriteHeader(200)
		}))}
		defer n.wg.Wait() // its server goroutines end inside the bubble
		tr, err := httpretry.NewTransport(n, httpretry.WithLimit(nil))
		if err != nil {
			t.Fatal(err)
		}
		go func() {
			r, e := e2eDo(t, tr, context.Background(), "GET", "hold", "")
			if e == nil {
				r.Body.Close()
			}
		}()
		synctest.Wait()
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		start := time.Now()
		resp, err := e2eDo(t, tr, ctx, "GET", "x", "")
		took := time.Since(start)
		close(release)
		if err != nil {
			t.Fatalf("err %v after %v", err, took)
		}
		defer resp.Body.Close()
		gu := resp.Header.Get(wire.GiveUpHeader)
		t.Logf("%d %q after %v", resp.StatusCode, gu, took)
		g, ok := wire.ParseGiveUp(gu)
		if !ok || g.Reason != "deadline" || g.Attempts != 1 || g.RetryAfter != 5*time.Second || took != 0 {
			t.Errorf("give-up %q after %v, want deadline;attempts=1;retry-after=5 at once", gu, took)
		}
	})
}
