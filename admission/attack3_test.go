// Black-box attack on package admission (AREA = admission): each test names
// the documented sentence it checks.

package admission_test

import (
	"context"
	"fmt"
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
	"github.com/stormguard/stormguard/observe"
	"github.com/stormguard/stormguard/wire"
)

func atkNew(t *testing.T, c admission.Config) *admission.Controller {
	t.Helper()
	ctl, err := admission.New(c)
	if err != nil {
		t.Fatalf("New(%+v): %v", c, err)
	}
	return ctl
}

// atkServe runs h on a GET with the given header fields and returns the
// recorder.
func atkServe(h http.Handler, ctx context.Context, hdr ...string) *httptest.ResponseRecorder {
	r := httptest.NewRequest("GET", "/", nil)
	if ctx != nil {
		r = r.WithContext(ctx)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		r.Header.Add(hdr[i], hdr[i+1])
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, r)
	return rec
}

// ---------------------------------------------------------------------------
// Observer panics.
//
// Wrap: "It then either runs next (releasing the permit when next returns or
// panics) or answers without calling next"; Permit: "Give it back with
// Release exactly once"; New: "A Controller that was built never fails or
// panics later". net/http recovers a panicking handler and the server goes
// on, so a panic raised by the Observer inside Wrap (a metrics exporter's
// bug) must not leave a slot or a queue place taken for ever. (The sibling
// package limit documents the same for its observer: docs/limit.md "Every
// slot is given back exactly once when its attempt ends, a panic included
// ... (or of the observer ...)".)

// An Observer that panics on the "admitted" event: the slot taken for the
// request is never given back, and the server, MaxInFlight 1, sheds every
// later request.
func TestAttackAdmObserverPanicOnAdmittedLeaksSlot(t *testing.T) {
	var boom atomic.Bool
	boom.Store(true)
	obs := observe.Func(func(_ context.Context, e observe.Event) {
		if e.Outcome == "admitted" && boom.CompareAndSwap(true, false) {
			panic("observer bug")
		}
	})
	ctl := atkNew(t, admission.Config{MaxInFlight: 1, MaxQueue: -1, Observer: obs})
	ran := 0
	h := ctl.Wrap(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { ran++ }))
	func() {
		defer func() { _ = recover() }() // as net/http does
		atkServe(h, nil)
	}()
	if s := ctl.Stats(); s.InFlight != 0 {
		t.Errorf("after the Observer panicked on the admitted event: Stats.InFlight = %d, want 0 (slot leaked)", s.InFlight)
	}
	rec := atkServe(h, nil)
	if rec.Code != 200 {
		t.Errorf("next request on an idle server: %d (Retry-After %q, capacity %q), want 200: the one slot leaked",
			rec.Code, rec.Header().Get("Retry-After"), rec.Header().Get(wire.CapacityHeader))
	}
}

// An Observer that panics on the "queued" event: the request stays in the
// queue for ever (Stats.Queued 1), the freed slot is then handed to it and
// never given back.
func TestAttackAdmObserverPanicOnQueuedLeaksQueueAndSlot(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var boom atomic.Bool
		boom.Store(true)
		obs := observe.Func(func(_ context.Context, e observe.Event) {
			if e.Outcome == "queued" && boom.CompareAndSwap(true, false) {
				panic("observer bug")
			}
		})
		ctl := atkNew(t, admission.Config{MaxInFlight: 1, MaxQueue: 1, Observer: obs})
		p, _ := ctl.Acquire(context.Background(), 1)
		h := ctl.Wrap(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
		func() {
			defer func() { _ = recover() }()
			atkServe(h, nil) // queues; the observer panics
		}()
		p.Release()
		time.Sleep(2 * time.Second) // far past MaxQueueWait
		synctest.Wait()
		s := ctl.Stats()
		if s.InFlight != 0 || s.Queued != 0 {
			t.Errorf("all requests done, 2 s later: InFlight %d Queued %d, want 0 0", s.InFlight, s.Queued)
		}
		rec := atkServe(h, nil)
		if rec.Code != 200 {
			t.Errorf("next request on an idle server: %d, want 200 (slot leaked to a request that is gone)", rec.Code)
		}
	})
}

// Config.Rand: "The Controller serialises its calls to a Rand it was
// given". A Rand that panics once (recovered by net/http) leaves the
// serialising lock held: every later refusal blocks for ever, and so does
// the request goroutine (New: "A Controller that was built never fails or
// panics later"; every refusal answers 503 at once).
func TestAttackAdmRandPanicDeadlocksRefusals(t *testing.T) {
	var n atomic.Int32
	ctl := atkNew(t, admission.Config{MaxInFlight: 1, MaxQueue: -1, Rand: func() float64 {
		if n.Add(1) == 1 {
			panic("rand bug")
		}
		return 0.5
	}})
	p, _ := ctl.Acquire(context.Background(), 1)
	defer p.Release()
	func() {
		defer func() { _ = recover() }()
		ctl.Acquire(context.Background(), 1) // refused; Rand panics
	}()
	done := make(chan admission.Decision, 1)
	go func() {
		_, d := ctl.Acquire(context.Background(), 1)
		done <- d
	}()
	select {
	case d := <-done:
		if d.Outcome != admission.QueueFull {
			t.Errorf("second refusal: %v", d.Outcome)
		}
	case <-time.After(2 * time.Second): // detecting a hang, not measuring a delay
		t.Fatalf("a refusal after a Rand panic blocked for 2 s (the Rand lock was left held)")
	}
}

// ---------------------------------------------------------------------------
// Timeout fields.

// Package doc step 1: the deadline is "the earliest of the times the
// request's Stormguard-Timeout-Ms field ... and Envoy's
// x-envoy-expected-rq-timeout-ms say"; Wrap: "malformed values are
// ignored". A field sent on two lines (a proxy that adds its own) says two
// times; its earliest is what the caller waits for. And a malformed first
// line must not hide a well-formed second one.
func TestAttackAdmTimeoutFieldTwoLines(t *testing.T) {
	ctl := atkNew(t, admission.Config{})
	ran := 0
	h := ctl.Wrap(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { ran++ }))
	for _, tc := range []struct {
		name string
		vals []string
	}{
		{wire.TimeoutHeader, []string{"5000", "0"}},
		{wire.TimeoutHeader, []string{"abc", "0"}},
		{"X-Envoy-Expected-Rq-Timeout-Ms", []string{"5000", "0"}},
		{"X-Envoy-Expected-Rq-Timeout-Ms", []string{"-1", "0"}},
	} {
		ran = 0
		hdr := []string{}
		for _, v := range tc.vals {
			hdr = append(hdr, tc.name, v)
		}
		rec := atkServe(h, nil, hdr...)
		if rec.Code != 503 || ran != 0 {
			t.Errorf("%s on two lines %q: code %d, handler ran %d times; want 503 (the earliest time, 0, is up)", tc.name, tc.vals, rec.Code, ran)
		}
	}
}

// Package doc: "the earliest of" both fields: own 300 ms, Envoy 200 ms on a
// busy server with a deep queue: dropped at exactly 200 ms as Canceled with
// the don't-retry signal and no capacity hint, Observer reason "deadline".
func TestAttackAdmEarliestFieldDropsInQueue(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var mu sync.Mutex
		var evs []observe.Event
		obs := observe.Func(func(_ context.Context, e observe.Event) { mu.Lock(); evs = append(evs, e); mu.Unlock() })
		ctl := atkNew(t, admission.Config{MaxInFlight: 1, Observer: obs})
		p, _ := ctl.Acquire(context.Background(), 1)
		h := ctl.Wrap(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
		start := time.Now()
		rec := atkServe(h, nil, wire.TimeoutHeader, "300", "X-Envoy-Expected-Rq-Timeout-Ms", "200")
		el := time.Since(start)
		p.Release()
		if rec.Code != 503 || !wire.DontRetry(rec.Header()) || rec.Header().Get(wire.CapacityHeader) != "" || el != 200*time.Millisecond {
			t.Errorf("code %d dontRetry %v capacity %q after %v; want 503, don't retry, no hint, after 200ms",
				rec.Code, wire.DontRetry(rec.Header()), rec.Header().Get(wire.CapacityHeader), el)
		}
		mu.Lock()
		defer mu.Unlock()
		last := evs[len(evs)-1]
		if last.Outcome != "shed-busy" || last.Reason != "deadline" || last.Elapsed != 200*time.Millisecond {
			t.Errorf("last event %+v, want shed-busy/deadline after 200ms", last)
		}
	})
}

// Wrap: "100 years or more means no deadline"; less is a deadline. Values at
// the boundary, and an adaptive limit (which keeps the deadline in its
// Permit) must not misbehave with a deadline 99 years away.
func TestAttackAdmTimeoutFieldNearHundredYears(t *testing.T) {
	ctl := atkNew(t, admission.Config{MaxInFlight: 2, LatencyCeiling: time.Second})
	ran := 0
	h := ctl.Wrap(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { ran++ }))
	year := int64(365 * 24 * 3600 * 1000)
	for _, v := range []string{
		strconv.FormatInt(99*year, 10), strconv.FormatInt(100*year-1, 10), strconv.FormatInt(100*year, 10),
		"999999999999999", "9223372036854775807", "18446744073709551616", "1e9", "1.5", "0x10", "+5", " 7 ", "\t7\t",
	} {
		ran = 0
		rec := atkServe(h, nil, wire.TimeoutHeader, v)
		if rec.Code != 200 || ran != 1 {
			t.Errorf("%s %q: code %d ran %d; want the handler run", wire.TimeoutHeader, v, rec.Code, ran)
		}
	}
	if s := ctl.Stats(); s.InFlight != 0 {
		t.Errorf("InFlight %d", s.InFlight)
	}
}

// Attempt header edge values (package doc: "a value that is not a number
// from 1 up, is an original; 2 or more is a retry").
func TestAttackAdmAttemptHeaderValues(t *testing.T) {
	for _, tc := range []struct {
		v     []string
		retry bool
	}{
		{[]string{"2"}, true}, {[]string{" 2 "}, true}, {[]string{"2, 7"}, true}, {[]string{"0002"}, true},
		{[]string{"1048576"}, true},
		{[]string{"1048577"}, false}, {[]string{"99999999999999999999999999"}, false},
		{[]string{"-2"}, false}, {[]string{"+2"}, false}, {[]string{"2.0"}, false}, {[]string{"0"}, false},
		{[]string{""}, false}, {[]string{"two"}, false}, {[]string{"1", "5"}, false},
	} {
		ctl := atkNew(t, admission.Config{})
		h := ctl.Wrap(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
		var hdr []string
		for _, v := range tc.v {
			hdr = append(hdr, wire.AttemptHeader, v)
		}
		atkServe(h, nil, hdr...)
		s := ctl.Stats()
		if got := s.Retries == 1; got != tc.retry {
			t.Errorf("attempt %q: counted retry=%v (orig %d retries %d), want %v", tc.v, got, s.Originals, s.Retries, tc.retry)
		}
	}
}

// ---------------------------------------------------------------------------
// Retry-After and the capacity hint.

// Package doc: "RetryAfterBase + U·RetryAfterSpread with U uniform in [0,
// 1) ... rounded down, at least 1 s"; Wrap: "with RetryAfterBase and
// RetryAfterSpread in whole seconds, it is uniform over the
// RetryAfterSpread/1s values from RetryAfterBase up".
func TestAttackAdmRetryAfterRange(t *testing.T) {
	for _, tc := range []struct {
		base, spread time.Duration
		lo, hi       int // whole seconds sent, inclusive
	}{
		{time.Second, 10 * time.Second, 1, 10},
		{2 * time.Second, 3 * time.Second, 2, 4},
		{time.Nanosecond, time.Second, 1, 1},
		{1500 * time.Millisecond, -1, 1, 1},
		{24*time.Hour - 5*time.Second, 5 * time.Second, 86395, 86399},
		{24 * time.Hour, -1, 86400, 86400},
	} {
		var u float64
		ctl := atkNew(t, admission.Config{MaxInFlight: 1, MaxQueue: -1, RetryAfterBase: tc.base, RetryAfterSpread: tc.spread,
			Rand: func() float64 { return u }})
		p, _ := ctl.Acquire(context.Background(), 1)
		h := ctl.Wrap(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
		seen := map[int]bool{}
		for i := 0; i <= 1000; i++ {
			u = float64(i) / 1000
			if i == 1000 {
				u = 0.9999999999999999
			}
			_, d := ctl.Acquire(context.Background(), 1)
			spread := max(tc.spread, 0)
			if d.RetryAfter < tc.base || (spread > 0 && d.RetryAfter >= tc.base+spread) || (spread == 0 && d.RetryAfter != tc.base) {
				t.Errorf("base %v spread %v u %v: Decision.RetryAfter %v", tc.base, tc.spread, u, d.RetryAfter)
			}
			rec := atkServe(h, nil)
			s, err := strconv.Atoi(rec.Header().Get("Retry-After"))
			if err != nil || s < tc.lo || s > tc.hi {
				t.Errorf("base %v spread %v u %v: Retry-After %q, want %d..%d", tc.base, tc.spread, u, rec.Header().Get("Retry-After"), tc.lo, tc.hi)
			}
			seen[s] = true
		}
		if len(seen) != tc.hi-tc.lo+1 {
			t.Errorf("base %v spread %v: values seen %v, want all of %d..%d", tc.base, tc.spread, seen, tc.lo, tc.hi)
		}
		p.Release()
	}
}

// Package doc: "The capacity hint of a shed answer is the adaptive limit in
// force"; Wrap: "the in-flight limit in force, MaxInFlight or the adaptive
// limit". After a drop cuts the limit from 10 to 9, exactly 9 requests run
// at once and the shed answer says 9.
func TestAttackAdmCapacityHintAdaptive(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctl := atkNew(t, admission.Config{MaxInFlight: 10, MaxQueue: -1, LatencyCeiling: 100 * time.Millisecond})
		p, _ := ctl.Acquire(context.Background(), 1)
		time.Sleep(100 * time.Millisecond) // a drop: the limit 10 -> 9
		p.Release()
		var ps []admission.Permit
		for {
			q, d := ctl.Acquire(context.Background(), 1)
			if d.Outcome != admission.Admitted {
				break
			}
			ps = append(ps, q)
		}
		h := ctl.Wrap(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
		rec := atkServe(h, nil)
		if rec.Code != 503 || rec.Header().Get(wire.CapacityHeader) != strconv.Itoa(len(ps)) || len(ps) != 9 {
			t.Errorf("admitted %d at once, shed answer %d says capacity %q; want 9 and \"9\"", len(ps), rec.Code, rec.Header().Get(wire.CapacityHeader))
		}
		for i := range ps {
			ps[i].Release()
		}
	})
}

// Capacity hint on each kind of refusal: QueueFull and QueueTimeout carry
// it, RetryRefused and Canceled do not; the value is MaxInFlight.
func TestAttackAdmCapacityHintKinds(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctl := atkNew(t, admission.Config{MaxInFlight: 3, MaxQueue: 1, MinRetriesPerSecond: -1})
		h := ctl.Wrap(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
		var ps []admission.Permit
		for range 3 {
			p, _ := ctl.Acquire(context.Background(), 1)
			ps = append(ps, p)
		}
		// Retry refused by the ratio (no floor, 3 originals: 0.3 < 1).
		rec := atkServe(h, nil, wire.AttemptHeader, "2")
		if rec.Code != 503 || rec.Header().Get(wire.CapacityHeader) != "" || !wire.DontRetry(rec.Header()) {
			t.Errorf("retry refused: %d hint %q dontRetry %v", rec.Code, rec.Header().Get(wire.CapacityHeader), wire.DontRetry(rec.Header()))
		}
		// Queue timeout.
		rec = atkServe(h, nil)
		if rec.Code != 503 || rec.Header().Get(wire.CapacityHeader) != "3" || wire.DontRetry(rec.Header()) {
			t.Errorf("queue timeout: %d hint %q dontRetry %v", rec.Code, rec.Header().Get(wire.CapacityHeader), wire.DontRetry(rec.Header()))
		}
		// Queue full.
		go atkServe(h, nil)
		synctest.Wait()
		rec = atkServe(h, nil)
		if rec.Code != 503 || rec.Header().Get(wire.CapacityHeader) != "3" {
			t.Errorf("queue full: %d hint %q", rec.Code, rec.Header().Get(wire.CapacityHeader))
		}
		for i := range ps {
			ps[i].Release()
		}
		synctest.Wait()
	})
}

// ---------------------------------------------------------------------------
// Queue bounds, disconnects.

// Config.MaxQueue: "the most requests that wait for a free slot at once; a
// request that finds the queue full is shed at once". 200 requests on 2
// slots and a queue of 5: 2 run, 5 wait, 193 shed at once; the 5 time out
// at MaxQueueWait (a burst: 500 ms).
func TestAttackAdmQueueBoundManyWaiters(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var maxQ atomic.Int64
		var queued atomic.Int64
		obs := observe.Func(func(_ context.Context, e observe.Event) {
			if e.Outcome == "queued" {
				if n := queued.Add(1); n > maxQ.Load() {
					maxQ.Store(n)
				}
			} else if e.Elapsed > 0 || e.Reason == "queue-timeout" {
				queued.Add(-1)
			}
		})
		ctl := atkNew(t, admission.Config{MaxInFlight: 2, MaxQueue: 5, Observer: obs})
		p1, _ := ctl.Acquire(context.Background(), 1)
		p2, _ := ctl.Acquire(context.Background(), 1)
		var mu sync.Mutex
		count := map[admission.Outcome]int{}
		waits := map[time.Duration]int{}
		var wg sync.WaitGroup
		start := time.Now()
		for range 200 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				p, d := ctl.Acquire(context.Background(), 1)
				el := time.Since(start)
				p.Release()
				mu.Lock()
				count[d.Outcome]++
				waits[el]++
				mu.Unlock()
			}()
		}
		synctest.Wait()
		if s := ctl.Stats(); s.Queued != 5 {
			t.Errorf("Queued %d, want 5", s.Queued)
		}
		wg.Wait()
		p1.Release()
		p2.Release()
		if count[admission.QueueFull] != 195 || count[admission.QueueTimeout] != 5 || waits[500*time.Millisecond] != 5 || maxQ.Load() > 5 {
			t.Errorf("outcomes %v waits %v max queued %d; want 195 queue-full at 0, 5 queue-timeout at 500ms", count, waits, maxQ.Load())
		}
	})
}

// Package doc step 3: a queued request "is refused with 503 when ... its
// context ends". A client that disconnects while queued: its handler never
// runs, it leaves the queue at once, and the slot that frees later goes to
// the next in line.
func TestAttackAdmDisconnectWhileQueued(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctl := atkNew(t, admission.Config{MaxInFlight: 1, MaxQueue: 5})
		var ran atomic.Int32
		h := ctl.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			ran.Add(1)
		}))
		p, _ := ctl.Acquire(context.Background(), 1)
		ctx, cancel := context.WithCancel(context.Background())
		res := make(chan *httptest.ResponseRecorder, 2)
		go func() { res <- atkServe(h, ctx, wire.AttemptHeader, "2") }()
		synctest.Wait()
		go func() { res <- atkServe(h, nil) }()
		synctest.Wait()
		if s := ctl.Stats(); s.Queued != 2 {
			t.Fatalf("Queued %d, want 2", s.Queued)
		}
		time.Sleep(10 * time.Millisecond)
		cancel()
		gone := <-res
		if gone.Code != 503 || !wire.DontRetry(gone.Header()) {
			t.Errorf("disconnected retry: %d dontRetry %v", gone.Code, wire.DontRetry(gone.Header()))
		}
		if s := ctl.Stats(); s.Queued != 1 || s.Outcomes[admission.Canceled] != 1 {
			t.Errorf("after the disconnect: %+v", s)
		}
		p.Release()
		ok := <-res
		if ok.Code != 200 || ran.Load() != 1 {
			t.Errorf("next in line: %d ran %d", ok.Code, ran.Load())
		}
		if s := ctl.Stats(); s.InFlight != 0 || s.Queued != 0 {
			t.Errorf("end: %+v", s)
		}
	})
}

// ---------------------------------------------------------------------------
// Probes.

// Package doc step 2: a marked probe "skips the ratio only onto an idle
// slot"; refused "with RetryAfterBase and without the don't-retry signal"
// otherwise. With the allowance spent: an idle server admits the probe,
// a busy one refuses it with RetryAfter = base exactly and no signal.
func TestAttackAdmProbeIdleAndBusy(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctl := atkNew(t, admission.Config{MaxInFlight: 1, RetryAfterBase: 3 * time.Second, Rand: func() float64 { return 0.99 }})
		for range 10 {
			p, d := ctl.Acquire(context.Background(), 2)
			if d.Outcome != admission.Admitted {
				t.Fatalf("floor retry: %v", d.Outcome)
			}
			p.Release()
		}
		if _, d := ctl.Acquire(context.Background(), 2); d.Outcome != admission.RetryRefused {
			t.Fatalf("11th retry: %v", d.Outcome)
		}
		h := ctl.Wrap(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
		rec := atkServe(h, nil, wire.AttemptHeader, "5", wire.ProbeHeader, " 1\t")
		if rec.Code != 200 {
			t.Errorf("probe on an idle server with the allowance spent: %d", rec.Code)
		}
		// Unmarked by attempt header but keyed: a key seen makes it a retry; the probe mark still counts.
		atkServe(h, nil, "Idempotency-Key", "k1")
		rec = atkServe(h, nil, "Idempotency-Key", "k1", wire.ProbeHeader, "1")
		if rec.Code != 200 {
			t.Errorf("keyed resend marked as probe on an idle server: %d", rec.Code)
		}
		p, _ := ctl.Acquire(context.Background(), 1)
		rec = atkServe(h, nil, wire.AttemptHeader, "5", wire.ProbeHeader, "1")
		if rec.Code != 503 || rec.Header().Get("Retry-After") != "3" || wire.DontRetry(rec.Header()) {
			t.Errorf("probe on a busy server: %d Retry-After %q dontRetry %v; want 503, 3, no signal", rec.Code, rec.Header().Get("Retry-After"), wire.DontRetry(rec.Header()))
		}
		p.Release()
	})
}

// ---------------------------------------------------------------------------
// Config validation: "It returns an error that says which if a field is out
// of range."
func TestAttackAdmConfigErrorsNameField(t *testing.T) {
	for _, tc := range []struct {
		c     admission.Config
		field string
	}{
		{admission.Config{LatencyCeiling: -1}, "LatencyCeiling"},
		{admission.Config{LatencyCeiling: 1, MaxInFlight: -1}, "MaxInFlight"},
		{admission.Config{MaxQueueWait: -1}, "MaxQueueWait"},
		{admission.Config{RetryRatio: 1.0000001}, "RetryRatio"},
		{admission.Config{MinRetriesPerSecond: atkPosInf()}, "MinRetriesPerSecond"},
		{admission.Config{Window: -1}, "Window"},
		{admission.Config{Window: 9 * time.Millisecond}, "Window"},
		{admission.Config{Window: 10*time.Millisecond + 5}, "Window"},
		{admission.Config{RetryAfterBase: -1}, "RetryAfterBase"},
		{admission.Config{RetryAfterBase: 24 * time.Hour}, "RetryAfterSpread"},
		{admission.Config{RetryAfterSpread: 24 * time.Hour}, "RetryAfterSpread"},
	} {
		_, err := admission.New(tc.c)
		if err == nil || !strings.Contains(err.Error(), tc.field) {
			t.Errorf("New(%+v): %v, want an error naming %s", tc.c, err, tc.field)
		}
	}
	for _, c := range []admission.Config{
		{MaxInFlight: -5, MaxQueue: 7},
		{RetryRatio: atkNegInf()},
		{MinRetriesPerSecond: 1e308},
		{MinRetriesPerSecond: -1e308},
		{Window: 10 * time.Millisecond},
		{Window: 1<<62 - (1<<62)%10},
		{RetryAfterBase: 24 * time.Hour, RetryAfterSpread: -1},
		{RetryAfterSpread: -1 << 63},
		{MaxQueueWait: 1},
		{MaxQueueWait: 1<<63 - 1},
		{LatencyCeiling: 1},
	} {
		ctl, err := admission.New(c)
		if err != nil {
			t.Errorf("New(%+v): %v, want valid", c, err)
			continue
		}
		// Built: never fails or panics later.
		func() {
			defer func() {
				if r := recover(); r != nil {
					t.Errorf("Config %+v: panic %v", c, r)
				}
			}()
			h := ctl.Wrap(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
			for i := range 30 {
				atkServe(h, nil, wire.AttemptHeader, strconv.Itoa(1+i%3), "Idempotency-Key", fmt.Sprint(i%4), wire.TimeoutHeader, "50")
			}
		}()
	}
}

func atkPosInf() float64 { return 1 / atkZero() }
func atkNegInf() float64 { return -1 / atkZero() }

var atkZeroVar float64

func atkZero() float64 { return atkZeroVar }

// ---------------------------------------------------------------------------
// Concurrency: Stats invariants after a storm through Wrap with every
// feature on. "A Controller is safe for concurrent use"; Stats: Outcomes
// counts the requests by their final decision (one each).
func TestAttackAdmConcurrentStorm(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var events atomic.Int64
		var queuedEv atomic.Int64
		obs := observe.Func(func(_ context.Context, e observe.Event) {
			events.Add(1)
			if e.Outcome == "queued" {
				queuedEv.Add(1)
			}
		})
		ctl := atkNew(t, admission.Config{MaxInFlight: 4, MaxQueue: 6, LatencyCeiling: 80 * time.Millisecond,
			Client: func(r *http.Request) string { return r.Header.Get("X-Client") }, Observer: obs})
		var running, peakRun atomic.Int64
		h := ctl.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			n := running.Add(1)
			for {
				m := peakRun.Load()
				if n <= m || peakRun.CompareAndSwap(m, n) {
					break
				}
			}
			d, _ := strconv.Atoi(r.Header.Get("X-Work"))
			time.Sleep(time.Duration(d) * time.Millisecond)
			running.Add(-1)
			if d%7 == 0 {
				panic(http.ErrAbortHandler)
			}
		}))
		var wg sync.WaitGroup
		var codes sync.Map
		for g := range 40 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range 30 {
					ctx := context.Background()
					var cancel context.CancelFunc = func() {}
					if i%5 == 0 {
						ctx, cancel = context.WithTimeout(ctx, time.Duration(10+g)*time.Millisecond)
					}
					func() {
						defer func() { _ = recover() }()
						rec := atkServe(h, ctx, wire.AttemptHeader, strconv.Itoa(1+i%3), "X-Client", strconv.Itoa(g%5),
							"Idempotency-Key", strconv.Itoa(g*100+i/2), "X-Work", strconv.Itoa(5+(g*i)%60),
							wire.TimeoutHeader, strconv.Itoa(20+(g*7+i)%200), wire.ProbeHeader, strconv.Itoa(i%2))
						v, _ := codes.LoadOrStore(rec.Code, new(atomic.Int64))
						v.(*atomic.Int64).Add(1)
					}()
					cancel()
					time.Sleep(time.Duration(i%4) * time.Millisecond)
				}
			}()
		}
		wg.Wait()
		s := ctl.Stats()
		var sum uint64
		for _, n := range s.Outcomes {
			sum += n
		}
		if s.InFlight != 0 || s.Queued != 0 || sum != s.Originals+s.Retries || sum != 1200 {
			t.Errorf("after the storm: %+v (sum of outcomes %d, want 1200 = originals+retries)", s, sum)
		}
		if peakRun.Load() > 4 {
			t.Errorf("peak handlers running at once %d > MaxInFlight 4", peakRun.Load())
		}
		if events.Load() != int64(sum)+queuedEv.Load() {
			t.Errorf("events %d, want one per request (%d) plus one per queued (%d)", events.Load(), sum, queuedEv.Load())
		}
		codes.Range(func(k, v any) bool { t.Logf("code %v: %d", k, v.(*atomic.Int64).Load()); return true })
		t.Logf("%+v peak %d", s, peakRun.Load())
	})
}

// ---------------------------------------------------------------------------
// Package doc step 3: a queued request "runs as soon as a slot frees, or is
// refused with 503 when ... its context ends or its caller's deadline comes
// ([Canceled])"; Acquire: it waits "until a slot frees ([Admitted]), ... or
// ctx ends ... ([Canceled])". Here the client disconnects (its context is
// canceled) strictly before the slot frees, in program order: the request
// must be refused, and the handler must not run for a caller who left.
func TestAttackAdmCanceledBeforeSlotFreesIsNotRun(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctl := atkNew(t, admission.Config{MaxInFlight: 1})
		var ran, ranCanceled atomic.Int32
		h := ctl.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			ran.Add(1)
			if r.Context().Err() != nil {
				ranCanceled.Add(1)
			}
		}))
		p, _ := ctl.Acquire(context.Background(), 1)
		ctx, cancel := context.WithCancel(context.Background())
		res := make(chan int, 1)
		go func() { res <- atkServe(h, ctx).Code }()
		synctest.Wait() // queued
		time.Sleep(50 * time.Millisecond)
		cancel()    // the client leaves...
		p.Release() // ...then the slot frees
		code := <-res
		if ran.Load() != 0 || code != 503 {
			t.Errorf("client gone before the slot freed: code %d, handler ran %d times (%d with its context already canceled); want 503 and no run",
				code, ran.Load(), ranCanceled.Load())
		}
		if s := ctl.Stats(); s.Outcomes[admission.Canceled] != 1 {
			t.Errorf("outcomes %v, want one canceled", s.Outcomes)
		}
	})
}

// The same through Acquire: ctx ended before the Release that frees the slot.
func TestAttackAdmAcquireCanceledBeforeSlotFrees(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctl := atkNew(t, admission.Config{MaxInFlight: 1})
		p, _ := ctl.Acquire(context.Background(), 1)
		ctx, cancel := context.WithCancel(context.Background())
		res := make(chan admission.Decision, 1)
		go func() {
			q, d := ctl.Acquire(ctx, 1)
			q.Release()
			res <- d
		}()
		synctest.Wait()
		cancel()
		p.Release()
		if d := <-res; d.Outcome != admission.Canceled {
			t.Errorf("ctx ended before the slot freed: %v, want canceled", d.Outcome)
		}
	})
}

// Acquire: "A request with a deadline that leaves it no more time than the
// last request of its class given a slot from the queue waited is dropped at
// once". The last original waited 100 ms; another still waits. 100 ms left:
// dropped at once; 101 ms left: queued.
func TestAttackAdmSojournBoundary(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctl := atkNew(t, admission.Config{MaxInFlight: 1, MaxQueue: 10})
		p, _ := ctl.Acquire(context.Background(), 1)
		got := make(chan admission.Permit, 2)
		for range 2 {
			go func() {
				q, _ := ctl.Acquire(context.Background(), 1)
				got <- q
			}()
			synctest.Wait()
		}
		time.Sleep(100 * time.Millisecond)
		p.Release()
		q := <-got // waited 100 ms; one original still waits
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		start := time.Now()
		_, d := ctl.Acquire(ctx, 1)
		cancel()
		if d.Outcome != admission.Canceled || !d.DontRetry || time.Since(start) != 0 {
			t.Errorf("100 ms left, last waited 100 ms: %+v after %v; want canceled at once, don't retry", d, time.Since(start))
		}
		ctx2, cancel2 := context.WithTimeout(context.Background(), 101*time.Millisecond)
		res := make(chan admission.Decision, 1)
		go func() { r, d := ctl.Acquire(ctx2, 1); r.Release(); res <- d }()
		synctest.Wait()
		if s := ctl.Stats(); s.Queued != 2 {
			t.Errorf("101 ms left: Queued %d, want 2 (queued)", s.Queued)
		}
		q.Release()
		q2 := <-got
		q2.Release()
		<-res
		cancel2()
	})
}

// The zero Controller "is usable and behaves as New(Config{})"; nil ctx
// "never ends".
func TestAttackAdmZeroControllerNilCtx(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var c admission.Controller
		//lint:ignore SA1012 nil ctx is documented
		p, d := c.Acquire(nil, 1)
		if d.Outcome != admission.Admitted {
			t.Fatalf("zero Controller: %v", d.Outcome)
		}
		p.Release()
		ctl := atkNew(t, admission.Config{MaxInFlight: 1, LatencyCeiling: time.Second})
		//lint:ignore SA1012 nil ctx is documented
		p, _ = ctl.Acquire(nil, 1)
		res := make(chan admission.Decision, 1)
		go func() {
			//lint:ignore SA1012 nil ctx is documented
			q, d := ctl.Acquire(nil, 2)
			q.Release()
			res <- d
		}()
		synctest.Wait()
		time.Sleep(10 * time.Millisecond)
		p.Release()
		if d := <-res; d.Outcome != admission.Admitted {
			t.Errorf("nil ctx queued: %v", d.Outcome)
		}
	})
}

// Config.Rand: "The Controller serialises its calls to a Rand it was given".
func TestAttackAdmRandSerialised(t *testing.T) {
	var in, overlap atomic.Int32
	ctl := atkNew(t, admission.Config{MaxInFlight: 1, MaxQueue: -1, Rand: func() float64 {
		if in.Add(1) > 1 {
			overlap.Add(1)
		}
		for range 100 {
			_ = in.Load()
		}
		in.Add(-1)
		return 0.3
	}})
	p, _ := ctl.Acquire(context.Background(), 1)
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 2000 {
				ctl.Acquire(context.Background(), 1)
			}
		}()
	}
	wg.Wait()
	p.Release()
	if overlap.Load() != 0 {
		t.Errorf("Rand called concurrently %d times", overlap.Load())
	}
}

// Concurrency without a bubble: "A Controller is safe for concurrent use".
// Acquire/AcquireProbe/Release/Stats/Wrap from many goroutines with the
// adaptive limit, an observer and canceled contexts; at the end nothing is
// in flight or queued and every request has exactly one outcome.
func TestAttackAdmRaceStorm(t *testing.T) {
	var evs atomic.Int64
	ctl := atkNew(t, admission.Config{MaxInFlight: 3, MaxQueue: 4, MaxQueueWait: 20 * time.Millisecond,
		LatencyCeiling: 2 * time.Millisecond, Observer: observe.Func(func(context.Context, observe.Event) { evs.Add(1) }),
		Client: func(r *http.Request) string { return r.Header.Get("X-C") }})
	h := ctl.Wrap(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	var wg sync.WaitGroup
	for g := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 300 {
				ctx, cancel := context.WithCancel(context.Background())
				if i%3 == 0 {
					go cancel()
				}
				switch i % 4 {
				case 0:
					p, _ := ctl.Acquire(ctx, 1+i%3)
					p.Release()
				case 1:
					p, _ := ctl.AcquireProbe(ctx, 2)
					p.Release()
				case 2:
					atkServe(h, ctx, wire.AttemptHeader, strconv.Itoa(1+g%2), "X-C", strconv.Itoa(g%3), "Idempotency-Key", strconv.Itoa(i/8))
				case 3:
					_ = ctl.Stats()
				}
				cancel()
			}
		}()
	}
	wg.Wait()
	s := ctl.Stats()
	var sum uint64
	for _, n := range s.Outcomes {
		sum += n
	}
	if s.InFlight != 0 || s.Queued != 0 || sum != s.Originals+s.Retries || sum != 16*225 {
		t.Errorf("after the storm: %+v, sum %d want %d", s, sum, 16*225)
	}
}

// Package doc, "The queue holds no more than its callers wait for": per
// class, a request that joins a list that stood (all waited over the target
// for a whole interval) waits at most 25 turns, at least the target (5 ms
// with no turn measured yet); one that joins an empty list may wait
// MaxQueueWait. "Each class has its own delay control, so retries that stand
// in their list ... do not shorten the originals' wait."
func TestAttackAdmPerClassDelayControl(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctl := atkNew(t, admission.Config{MaxInFlight: 1, MaxQueue: 10})
		p, _ := ctl.Acquire(context.Background(), 1)
		type res struct {
			name string
			d    admission.Decision
			at   time.Duration
		}
		out := make(chan res, 3)
		start := time.Now()
		run := func(name string, attempt int) {
			q, d := ctl.Acquire(context.Background(), attempt)
			q.Release()
			out <- res{name, d, time.Since(start)}
		}
		go run("R1", 2)
		synctest.Wait()
		time.Sleep(150 * time.Millisecond)
		go run("R2", 2)
		go run("O1", 1)
		synctest.Wait()
		got := map[string]res{}
		for range 3 {
			r := <-out
			got[r.name] = r
		}
		p.Release()
		// The list handed no slot over in 150 ms: a turn of at least 150 ms,
		// so R2 waits the 100 ms interval (25 turns, capped).
		if r := got["R2"]; r.d.Outcome != admission.QueueTimeout || r.at != 250*time.Millisecond {
			t.Errorf("R2 joining a standing retry list: %v at %v, want queue-timeout at 250ms", r.d.Outcome, r.at)
		}
		if r := got["O1"]; r.d.Outcome != admission.QueueTimeout || r.at != 650*time.Millisecond {
			t.Errorf("O1 joining an empty original list: %v at %v, want queue-timeout at 650ms", r.d.Outcome, r.at)
		}
		if r := got["R1"]; r.d.Outcome != admission.QueueTimeout || r.at != 500*time.Millisecond {
			t.Errorf("R1: %v at %v, want queue-timeout at 500ms", r.d.Outcome, r.at)
		}
	})
}

// Package doc: "An admission that does not queue takes no lock and
// allocates nothing ... the key table is atomic words, and the HTTP
// middleware reads the attempt header without copying it"; Config.Client:
// "Wrap's admitted path allocates nothing beyond it"; Wrap: "The returned
// handler allocates nothing on the admitted path". Checked with the
// adaptive limit, a client function, an idempotency key and a context
// deadline, above and below the one-pass header threshold.
func TestAttackAdmAdmittedPathAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts are not meaningful under -race")
	}
	for _, many := range []bool{false, true} {
		for _, adaptive := range []bool{false, true} {
			c := admission.Config{MaxInFlight: 4, MinRetriesPerSecond: 1e9,
				Client: func(r *http.Request) string { return r.RemoteAddr }}
			if adaptive {
				c.LatencyCeiling = time.Hour
			}
			ctl := atkNew(t, c)
			h := ctl.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(204) }))
			ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
			r := httptest.NewRequest("GET", "/", nil).WithContext(ctx)
			// Originals with fresh keys: with Client, the per-client floor
			// would refuse repeated retries (a refusal may allocate).
			keys := make([][]string, 2000)
			for i := range keys {
				keys[i] = []string{"key-" + strconv.Itoa(i)}
			}
			r.Header[wire.AttemptHeader] = []string{"1"}
			if many {
				r.Header[wire.TimeoutHeader] = []string{"30000"}
				r.Header["X-Envoy-Expected-Rq-Timeout-Ms"] = []string{"20000"}
				r.Header[wire.ProbeHeader] = []string{"1"}
				r.Header["X-Other"] = []string{"1"}
			}
			w := &nopWriter{h: http.Header{}}
			i := 0
			before := ctl.Stats().Outcomes[admission.Admitted]
			if n := testing.AllocsPerRun(500, func() { r.Header["Idempotency-Key"] = keys[i]; i++; h.ServeHTTP(w, r) }); n != 0 {
				t.Errorf("many=%v adaptive=%v: %v allocs per admitted request, want 0", many, adaptive, n)
			}
			if got := ctl.Stats().Outcomes[admission.Admitted] - before; got != 501 {
				t.Errorf("admitted %d of 501", got)
			}
			if n := testing.AllocsPerRun(500, func() {
				p, _ := ctl.Acquire(ctx, 1)
				p.Release()
			}); n != 0 {
				t.Errorf("adaptive=%v: Acquire+Release %v allocs", adaptive, n)
			}
			cancel()
		}
	}
}
