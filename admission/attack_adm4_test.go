package admission_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stormguard/stormguard/admission"
	"github.com/stormguard/stormguard/httpretry"
	"github.com/stormguard/stormguard/retry"
	"github.com/stormguard/stormguard/wire"
)

const z26Envoy = "X-Envoy-Expected-Rq-Timeout-Ms"

func z26New(t testing.TB, c admission.Config) *admission.Controller {
	t.Helper()
	ctl, err := admission.New(c)
	if err != nil {
		t.Fatal(err)
	}
	return ctl
}

// Parse edges of the two timeout fields, per doc.go:32-35 and Wrap's doc:
// the earliest valid value counts, malformed ones are ignored, 100 years or
// more means no deadline; a value of 0 is a deadline that has passed.
func TestAttackAdm4TimeoutFieldParseEdges(t *testing.T) {
	type tc struct {
		name        string
		own, envoy  []string
		wantDropped bool
	}
	cases := []tc{
		{"zero", []string{"0"}, nil, true},
		{"envoy zero", nil, []string{"0"}, true},
		{"spaces zero", []string{" \t0 \t"}, nil, true},
		{"negative", []string{"-1"}, nil, false},
		{"envoy negative", nil, []string{"-5"}, false},
		{"minus zero", []string{"-0"}, nil, false},
		{"plus", []string{"+0"}, nil, false},
		{"exp", []string{"0e3"}, nil, false},
		{"hex", []string{"0x0"}, nil, false},
		{"unit", []string{"0ms"}, nil, false},
		{"decimal", []string{"0.0"}, nil, false},
		{"arabic zero", []string{"\u0660"}, nil, false},
		{"empty", []string{""}, nil, false},
		{"commas", []string{",,,"}, nil, false},
		{"quoted", []string{`"0"`}, nil, false},
		{"list malformed then zero", []string{"abc,0"}, nil, true},
		{"list zero trailing comma", []string{"0,"}, nil, true},
		{"list with spaces", []string{"5000 , 0"}, nil, true},
		{"lines malformed then zero", []string{"abc", "0"}, nil, true},
		{"envoy malformed own zero", []string{"0"}, []string{"abc"}, true},
		{"own malformed envoy zero", []string{"abc"}, []string{"0"}, true},
		{"huge", []string{"99999999999999999999999999999999"}, nil, false},
		{"int64 max", []string{"9223372036854775807"}, nil, false},
		{"uint64 overflow", []string{"18446744073709551616"}, nil, false},
		{"100 years exactly", []string{strconv.FormatInt(int64(100*365*24*time.Hour/time.Millisecond), 10)}, nil, false},
		{"just under 100 years", []string{strconv.FormatInt(int64(100*365*24*time.Hour/time.Millisecond)-1, 10)}, nil, false},
		{"many leading zeros", []string{"0000000000000000000000000000000000000000"}, nil, true},
		{"huge then zero", []string{"99999999999999999999999999999999,0"}, nil, true},
		{"negative then zero lines", nil, []string{"-1", "0"}, true},
		{"large valid", []string{"60000"}, []string{"120000"}, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ctl := z26New(t, admission.Config{})
			h := ctl.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(204) }))
			for _, extra := range []int{0, 6} { // map ranged, and looked up (more than 4 fields)
				r := httptest.NewRequest("GET", "/", nil)
				for i := 0; i < extra; i++ {
					r.Header.Set("X-Pad-"+strconv.Itoa(i), "x")
				}
				if c.own != nil {
					r.Header[wire.TimeoutHeader] = c.own
				}
				if c.envoy != nil {
					r.Header[z26Envoy] = c.envoy
				}
				rec := httptest.NewRecorder()
				h.ServeHTTP(rec, r)
				if c.wantDropped {
					if rec.Code != 503 || !wire.DontRetry(rec.Header()) {
						t.Errorf("extra=%d own=%q envoy=%q: code %d dontRetry %v, want 503 with don't-retry", extra, c.own, c.envoy, rec.Code, wire.DontRetry(rec.Header()))
					}
					if rec.Header().Get(wire.CapacityHeader) != "" {
						t.Errorf("extra=%d: deadline drop carries a capacity hint %q", extra, rec.Header().Get(wire.CapacityHeader))
					}
				} else if rec.Code != 204 {
					t.Errorf("extra=%d own=%q envoy=%q: code %d, want admitted", extra, c.own, c.envoy, rec.Code)
				}
			}
			s := ctl.Stats()
			want := uint64(0)
			if c.wantDropped {
				want = 2
			}
			if s.Outcomes[admission.Canceled] != want {
				t.Errorf("Canceled = %d, want %d", s.Outcomes[admission.Canceled], want)
			}
		})
	}
}

// A timeout field's deadline bounds the wait in the queue and drops the
// request ([Canceled], don't retry) when it comes, never QueueTimeout.
func TestAttackAdm4EnvoyDeadlineInQueue(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctl := z26New(t, admission.Config{MaxInFlight: 1, MaxQueueWait: 10 * time.Second})
		p, d := ctl.Acquire(context.Background(), 1)
		if d.Outcome != admission.Admitted {
			t.Fatal(d)
		}
		h := ctl.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
		r := httptest.NewRequest("GET", "/", nil)
		r.Header.Set(z26Envoy, "250")
		r.Header.Set(wire.TimeoutHeader, "bogus, 900")
		start := time.Now()
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, r)
		if el := time.Since(start); el != 250*time.Millisecond {
			t.Errorf("waited %v, want 250ms", el)
		}
		if rec.Code != 503 || !wire.DontRetry(rec.Header()) {
			t.Errorf("code %d dontRetry %v", rec.Code, wire.DontRetry(rec.Header()))
		}
		if s := ctl.Stats(); s.Outcomes[admission.Canceled] != 1 || s.Outcomes[admission.QueueTimeout] != 0 {
			t.Errorf("outcomes %v", s.Outcomes)
		}
		p.Release()
	})
}

// Wrap releases the permit when next returns, whatever it did: hijacked the
// connection, streamed with Flush, or panicked with http.ErrAbortHandler.
// The ResponseWriter reaches the handler with its optional interfaces.
func TestAttackAdm4HijackStreamAbort(t *testing.T) {
	ctl := z26New(t, admission.Config{MaxInFlight: 1, MaxQueue: -1})
	hijacked := make(chan struct{})
	release := make(chan struct{})
	mux := http.NewServeMux()
	mux.HandleFunc("/hijack", func(w http.ResponseWriter, r *http.Request) {
		hj, ok := w.(http.Hijacker)
		if !ok {
			t.Error("no Hijacker through Wrap")
			return
		}
		conn, buf, err := hj.Hijack()
		if err != nil {
			t.Error(err)
			return
		}
		close(hijacked)
		<-release
		_, _ = buf.WriteString("HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nhi")
		_ = buf.Flush()
		_ = conn.Close()
	})
	mux.HandleFunc("/stream", func(w http.ResponseWriter, r *http.Request) {
		f, ok := w.(http.Flusher)
		if !ok {
			t.Error("no Flusher through Wrap")
			return
		}
		for i := 0; i < 3; i++ {
			_, _ = io.WriteString(w, "x\n")
			f.Flush()
		}
	})
	mux.HandleFunc("/abort", func(w http.ResponseWriter, r *http.Request) {
		panic(http.ErrAbortHandler)
	})
	mux.HandleFunc("/ok", func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(204) })
	srv := httptest.NewServer(ctl.Wrap(mux))
	defer srv.Close()
	cl := srv.Client()

	done := make(chan string, 1)
	go func() {
		resp, err := cl.Get(srv.URL + "/hijack")
		if err != nil {
			done <- err.Error()
			return
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		done <- string(b)
	}()
	<-hijacked
	// The slot is held while the hijacking handler runs.
	resp, err := cl.Get(srv.URL + "/ok")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 503 || resp.Header.Get(wire.CapacityHeader) != "1" {
		t.Errorf("during hijack: %d capacity %q, want 503 with capacity 1", resp.StatusCode, resp.Header.Get(wire.CapacityHeader))
	}
	close(release)
	if got := <-done; got != "hi" {
		t.Errorf("hijack body %q", got)
	}
	waitIdle := func() {
		for i := 0; i < 2000 && ctl.Stats().InFlight != 0; i++ {
			time.Sleep(time.Millisecond)
		}
		if n := ctl.Stats().InFlight; n != 0 {
			t.Fatalf("InFlight %d after handler returned", n)
		}
	}
	waitIdle()
	resp, err = cl.Get(srv.URL + "/stream")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(b) != "x\nx\nx\n" {
		t.Errorf("stream %q", b)
	}
	waitIdle()
	if _, err := cl.Get(srv.URL + "/abort"); err == nil {
		t.Error("abort: no error")
	}
	waitIdle()
	resp, err = cl.Get(srv.URL + "/ok")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 204 {
		t.Errorf("after abort: %d", resp.StatusCode)
	}
}

// Many goroutines make first use of a zero Controller at once (-race).
func TestAttackAdm4ZeroControllerConcurrentFirstUse(t *testing.T) {
	var ctl admission.Controller
	var wg sync.WaitGroup
	var admitted atomic.Int64
	h := ctl.Wrap(nil)
	for i := 0; i < 16; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			switch i % 3 {
			case 0:
				p, d := ctl.Acquire(context.Background(), 1)
				if d.Outcome == admission.Admitted {
					admitted.Add(1)
				}
				p.Release()
			case 1:
				_ = ctl.Stats()
				p, d := ctl.AcquireProbe(context.Background(), 3)
				if d.Outcome == admission.Admitted {
					admitted.Add(1)
				}
				p.Release()
			default:
				rec := httptest.NewRecorder()
				h.ServeHTTP(rec, httptest.NewRequest("GET", "/", nil))
				if rec.Code == 404 {
					admitted.Add(1)
				}
			}
		}(i)
	}
	wg.Wait()
	if admitted.Load() != 16 {
		t.Errorf("admitted %d of 16", admitted.Load())
	}
	if s := ctl.Stats(); s.InFlight != 0 || s.Outcomes[admission.Admitted] != 16 {
		t.Errorf("stats %+v", s)
	}
}

// memNet serves a request with h on the calling goroutine (a synctest
// bubble has no real network).
type memNet struct {
	h    http.Handler
	mu   sync.Mutex
	seen []http.Header
	at   []time.Time
}

func (n *memNet) RoundTrip(r *http.Request) (*http.Response, error) {
	n.mu.Lock()
	n.seen = append(n.seen, r.Header.Clone())
	n.at = append(n.at, time.Now())
	n.mu.Unlock()
	rec := httptest.NewRecorder()
	n.h.ServeHTTP(rec, r.Clone(context.Background()))
	resp := rec.Result()
	resp.Request = r
	return resp, nil
}

// A client through httpretry against an admission-guarded server that has
// no room: the shed original (QueueFull, no don't-retry, Retry-After,
// capacity hint) is retried no sooner than its Retry-After, with the
// attempt header; the retry, refused with the don't-retry signal, is not
// retried again; the caller gets the 503 marked as a give-up; and the
// client's own limiter is capped at the hint.
func TestAttackAdm4HTTPRetryHonoursShedAnswers(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctl := z26New(t, admission.Config{MaxInFlight: 3, MaxQueue: -1, RetryAfterBase: 2 * time.Second, RetryAfterSpread: -1})
		var held []admission.Permit
		for i := 0; i < 3; i++ {
			p, d := ctl.Acquire(context.Background(), 1)
			if d.Outcome != admission.Admitted {
				t.Fatal(d)
			}
			held = append(held, p)
		}
		net := &memNet{h: ctl.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))}
		tr, err := httpretry.NewTransport(net, httpretry.WithBreaker(nil), httpretry.WithRetry(retry.WithMaxAttempts(5)))
		if err != nil {
			t.Fatal(err)
		}
		req, _ := http.NewRequest("GET", "http://svc.example/x", nil)
		start := time.Now()
		resp, err := tr.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 503 || !wire.DontRetry(resp.Header) {
			t.Errorf("final: %d dontRetry %v", resp.StatusCode, wire.DontRetry(resp.Header))
		}
		if resp.Header.Get(wire.GiveUpHeader) == "" {
			t.Errorf("final answer not marked %s: %v", wire.GiveUpHeader, resp.Header)
		}
		if len(net.seen) != 2 {
			t.Fatalf("attempts %d, want 2 (original, then the retry refused with don't-retry)", len(net.seen))
		}
		if gap := net.at[1].Sub(net.at[0]); gap < 2*time.Second || gap > 3*time.Second {
			t.Errorf("retry after %v, want within [2s, 3s] (Retry-After 2 a floor, spread by up to half)", gap)
		}
		_ = start
		if got := net.seen[1].Get(wire.AttemptHeader); got != "2" {
			t.Errorf("retry's attempt header %q", got)
		}
		if g := tr.Hosts()["svc.example"]; g.Limiter == nil || g.Limiter.Limit() > 3 {
			lim := -1
			if g.Limiter != nil {
				lim = g.Limiter.Limit()
			}
			t.Errorf("client limiter %d after a hint of 3", lim)
		}
		s := ctl.Stats()
		if s.Originals != 4 || s.Retries != 1 || s.Outcomes[admission.QueueFull] != 2 {
			t.Errorf("server stats %+v", s)
		}
		for i := range held {
			held[i].Release()
		}
	})
}

// With a deadline shorter than the Retry-After the server sends, the
// client gives up at once with that answer; the attempt carried the time
// it had left.
func TestAttackAdm4HTTPRetryGivesUpPastDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctl := z26New(t, admission.Config{MaxInFlight: 1, MaxQueue: -1, RetryAfterBase: 5 * time.Second, RetryAfterSpread: -1})
		p, _ := ctl.Acquire(context.Background(), 1)
		net := &memNet{h: ctl.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))}
		tr, err := httpretry.NewTransport(net, httpretry.WithBreaker(nil), httpretry.WithTimeout(3*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		req, _ := http.NewRequest("GET", "http://svc.example/x", nil)
		start := time.Now()
		resp, err := tr.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if el := time.Since(start); el != 0 {
			t.Errorf("gave up after %v, want at once", el)
		}
		if len(net.seen) != 1 || resp.StatusCode != 503 {
			t.Errorf("attempts %d status %d", len(net.seen), resp.StatusCode)
		}
		if v := net.seen[0].Get(wire.TimeoutHeader); v != "3000" && v != "2999" {
			t.Errorf("timeout field %q, want about 3000", v)
		}
		p.Release()
	})
}

// A client attempt whose time left (the timeout field httpretry sends) is
// no more than the queue's recent delay is dropped on arrival with the
// don't-retry signal, and the client does not retry on top.
func TestAttackAdm4HTTPRetrySojournDrop(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctl := z26New(t, admission.Config{MaxInFlight: 1, MaxQueue: 10, MaxQueueWait: 10 * time.Second})
		p, _ := ctl.Acquire(context.Background(), 1)
		// Two originals queue; the first gets a slot after 400 ms: the
		// originals' recent delay is 400 ms while the second still waits.
		got := make(chan admission.Permit, 2)
		for i := 0; i < 2; i++ {
			go func() {
				p, d := ctl.Acquire(context.Background(), 1)
				if d.Outcome != admission.Admitted {
					t.Errorf("queued original: %+v", d)
				}
				got <- p
			}()
			synctest.Wait()
		}
		time.Sleep(400 * time.Millisecond)
		p.Release()
		first := <-got
		net := &memNet{h: ctl.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))}
		tr, err := httpretry.NewTransport(net, httpretry.WithBreaker(nil), httpretry.WithAttemptTimeout(300*time.Millisecond), httpretry.WithTimeout(5*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		req, _ := http.NewRequest("GET", "http://svc.example/x", nil)
		start := time.Now()
		resp, err := tr.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if el := time.Since(start); el != 0 {
			t.Errorf("took %v", el)
		}
		if len(net.seen) != 1 || resp.StatusCode != 503 || !wire.DontRetry(resp.Header) {
			t.Errorf("attempts %d status %d dontRetry %v", len(net.seen), resp.StatusCode, wire.DontRetry(resp.Header))
		}
		if s := ctl.Stats(); s.Outcomes[admission.Canceled] != 1 {
			t.Errorf("outcomes %v", s.Outcomes)
		}
		first.Release()
		second := <-got
		second.Release()
	})
}

// sendN sends n requests through h with the attempt number attempt and
// returns how many were admitted.
func z26SendN(h http.Handler, n, attempt int) int {
	ok := 0
	for i := 0; i < n; i++ {
		r := httptest.NewRequest("GET", "/", nil)
		if attempt >= 2 {
			r.Header.Set(wire.AttemptHeader, strconv.Itoa(attempt))
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, r)
		if rec.Code == http.StatusNoContent {
			ok++
		}
	}
	return ok
}

// Config.Client's per-client rule (config.go:420-427, doc.go:252-257): a
// retry is admitted only if the global rule admits it and that client's
// retries + 1 <= RetryRatio·its originals + 1. With RetryRatio 0.29 and
// 100 originals: 29 + 1 <= 0.29·100 + 1 = 30, so the 30th retry is within
// the rule (the global rule, 0.29·100 + 10 = 39, admits 39).
func TestAttackAdmClientRatioRounding(t *testing.T) {
	for _, tc := range []struct {
		ratio float64
		orig  int
		want  int
	}{
		{0.29, 100, 30},
		{0.57, 100, 58},
		{0.58, 50, 30},
	} {
		t.Run(strconv.FormatFloat(tc.ratio, 'g', -1, 64), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				ctl := z26New(t, admission.Config{RetryRatio: tc.ratio, MinRetriesPerSecond: 100,
					Client: func(*http.Request) string { return "a" }})
				h := ctl.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusNoContent) }))
				if n := z26SendN(h, tc.orig, 1); n != tc.orig {
					t.Fatalf("originals admitted %d", n)
				}
				got := z26SendN(h, 2*tc.want, 2)
				if got != tc.want {
					t.Errorf("RetryRatio %v, %d originals of one client: %d retries admitted, want %d (retries+1 <= %v·%d+1)",
						tc.ratio, tc.orig, got, tc.want, tc.ratio, tc.orig)
				}
			})
		})
	}
}

// The global rule alone (no Config.Client) at the same figures: the
// documented count (budget allows for float rounding).
func TestAttackAdm4GlobalRatioFloatRounding(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctl := z26New(t, admission.Config{RetryRatio: 0.29, MinRetriesPerSecond: -1})
		h := ctl.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusNoContent) }))
		z26SendN(h, 100, 1)
		if got := z26SendN(h, 60, 2); got != 29 {
			t.Errorf("%d retries admitted, want 29 (retries+1 <= 0.29·100)", got)
		}
	})
}
