// Black-box attack on package admission (AREA = adm3).

package admission_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stormguard/stormguard/admission"
	"github.com/stormguard/stormguard/observe"
	"github.com/stormguard/stormguard/wire"
)

func ad3New(t testing.TB, c admission.Config) *admission.Controller {
	t.Helper()
	ctl, err := admission.New(c)
	if err != nil {
		t.Fatalf("New(%+v): %v", c, err)
	}
	return ctl
}

// ad3Req builds a request with the given header fields (name, value pairs).
func ad3Req(kv ...string) *http.Request {
	r := httptest.NewRequest(http.MethodGet, "http://provider.test/x", nil)
	for i := 0; i+1 < len(kv); i += 2 {
		r.Header.Add(kv[i], kv[i+1])
	}
	return r
}

func ad3Serve(h http.Handler, r *http.Request) *httptest.ResponseRecorder {
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, r)
	return rec
}

func ad3Sum(s admission.Stats) uint64 {
	var n uint64
	for _, v := range s.Outcomes {
		n += v
	}
	return n
}

// ad3Obs is an observer that counts events and may panic on one outcome.
type ad3Obs struct {
	mu      sync.Mutex
	events  []observe.Event
	panicOn string
}

func (o *ad3Obs) Observe(_ context.Context, e observe.Event) {
	o.mu.Lock()
	o.events = append(o.events, e)
	o.mu.Unlock()
	if o.panicOn != "" && e.Outcome == o.panicOn {
		panic("ad3 observer")
	}
}

// Probes over HTTP: a marked retry takes an idle slot whatever the ratio
// says; with the slot busy it is refused as QueueFull with RetryAfterBase,
// no don't-retry; an unmarked retry beyond the ratio gets the don't-retry
// signal and no capacity hint.
func TestAttackAdm3ProbeIdleSlotAndRefusals(t *testing.T) {
	ctl := ad3New(t, admission.Config{MaxInFlight: 1, RetryRatio: -1, MinRetriesPerSecond: -1,
		RetryAfterBase: 3 * time.Second, RetryAfterSpread: 5 * time.Second})
	ran := 0
	h := ctl.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { ran++ }))
	for range 5 {
		rec := ad3Serve(h, ad3Req(wire.AttemptHeader, "3", wire.ProbeHeader, "1"))
		if rec.Code != 200 {
			t.Fatalf("probe onto an idle slot with no ratio: %d %v", rec.Code, rec.Header())
		}
	}
	if ran != 5 {
		t.Fatalf("ran %d", ran)
	}
	rec := ad3Serve(h, ad3Req(wire.AttemptHeader, "2"))
	if rec.Code != 503 || !wire.DontRetry(rec.Header()) || rec.Header().Get(wire.CapacityHeader) != "" {
		t.Errorf("retry beyond the ratio: %d %v, want 503 with don't-retry and no capacity", rec.Code, rec.Header())
	}
	if ra, err := strconv.Atoi(rec.Header().Get("Retry-After")); err != nil || ra < 3 || ra > 7 {
		t.Errorf("retry refused: Retry-After %q, want 3..7", rec.Header().Get("Retry-After"))
	}
	// Slot busy: the probe is refused with the base and no don't-retry.
	p, d := ctl.Acquire(context.Background(), 1)
	if d.Outcome != admission.Admitted {
		t.Fatal(d)
	}
	for range 5 {
		rec = ad3Serve(h, ad3Req(wire.AttemptHeader, "2", wire.ProbeHeader, " 1\t", "X-A", "1", "X-B", "2", "X-C", "3", "X-D", "4"))
		if rec.Code != 503 || wire.DontRetry(rec.Header()) || rec.Header().Get("Retry-After") != "3" {
			t.Errorf("probe with the slot busy: %d %v, want 503, Retry-After 3, no don't-retry", rec.Code, rec.Header())
		}
	}
	p.Release()
	s := ctl.Stats()
	if s.Retries != 11 || s.Originals != 1 || s.InFlight != 0 || ad3Sum(s) != 12 {
		t.Errorf("stats %+v", s)
	}
	if s.Outcomes[admission.QueueFull] != 5 || s.Outcomes[admission.RetryRefused] != 1 || s.Outcomes[admission.Admitted] != 6 {
		t.Errorf("outcomes %+v", s.Outcomes)
	}
}

// Config.Observer: "An Observer that panics ... on "admitted" ... gives back
// the slot ...: the request does not run". Stats: "Outcomes[Admitted] were
// given a permit". A request whose admitted event panicked got no permit
// and did not run, yet Stats counts it as admitted.
func TestAttackAdm3ObserverPanicAdmittedCountedAsAdmitted(t *testing.T) {
	obs := &ad3Obs{panicOn: "admitted"}
	ctl := ad3New(t, admission.Config{MaxInFlight: 1, Observer: obs})
	func() {
		defer func() { _ = recover() }()
		p, _ := ctl.Acquire(context.Background(), 1)
		p.Release()
		t.Fatal("no panic")
	}()
	s := ctl.Stats()
	if s.InFlight != 0 {
		t.Fatalf("slot leaked: %+v", s)
	}
	if s.Outcomes[admission.Admitted] != 0 {
		t.Errorf("Stats.Outcomes[Admitted] = %d after the only request's admitted event panicked (no permit given, request not run), want 0", s.Outcomes[admission.Admitted])
	}
}

// MaxQueueWait: an original waits exactly MaxQueueWait, then QueueTimeout
// without the don't-retry signal; a retry the same with it; both carry the
// capacity hint over HTTP.
func TestAttackAdm3QueueTimeoutExact(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctl := ad3New(t, admission.Config{MaxInFlight: 2, MaxQueueWait: 300 * time.Millisecond})
		var held []admission.Permit
		for range 2 {
			p, d := ctl.Acquire(context.Background(), 1)
			if d.Outcome != admission.Admitted {
				t.Fatal(d)
			}
			held = append(held, p)
		}
		h := ctl.Wrap(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { t.Error("handler ran") }))
		var wg sync.WaitGroup
		for _, att := range []string{"1", "2"} {
			wg.Go(func() {
				start := time.Now()
				rec := ad3Serve(h, ad3Req(wire.AttemptHeader, att))
				el := time.Since(start)
				if el != 300*time.Millisecond {
					t.Errorf("attempt %s: refused after %v, want 300ms", att, el)
				}
				if rec.Code != 503 || rec.Header().Get(wire.CapacityHeader) != "2" || wire.DontRetry(rec.Header()) != (att == "2") {
					t.Errorf("attempt %s: %d %v", att, rec.Code, rec.Header())
				}
			})
		}
		wg.Wait()
		for i := range held {
			held[i].Release()
		}
		s := ctl.Stats()
		if s.Outcomes[admission.QueueTimeout] != 2 || s.InFlight != 0 || s.Queued != 0 {
			t.Errorf("stats %+v", s)
		}
	})
}

// Hostile timeout fields: junk, negative, huge values are ignored (the
// request is admitted); 0 means the deadline passed (dropped with the
// don't-retry signal, handler not run); the earliest valid value counts.
func TestAttackAdm3HostileTimeoutFields(t *testing.T) {
	cases := []struct {
		name  string
		kv    []string
		admit bool
	}{
		{"negative", []string{wire.TimeoutHeader, "-5"}, true},
		{"junk", []string{wire.TimeoutHeader, "5ms"}, true},
		{"float", []string{wire.TimeoutHeader, "1.5"}, true},
		{"hex", []string{wire.TimeoutHeader, "0x10"}, true},
		{"huge", []string{wire.TimeoutHeader, "999999999999999999999999999999"}, true},
		{"plus", []string{wire.TimeoutHeader, "+10"}, true},
		{"empty", []string{wire.TimeoutHeader, ""}, true},
		{"zero", []string{wire.TimeoutHeader, "0"}, false},
		{"zeros", []string{wire.TimeoutHeader, "0000"}, false},
		{"envoy zero", []string{"X-Envoy-Expected-Rq-Timeout-Ms", "0"}, false},
		{"list with zero", []string{wire.TimeoutHeader, "junk, 1000, 0"}, false},
		{"two lines", []string{wire.TimeoutHeader, "1000", wire.TimeoutHeader, "0"}, false},
		{"own big envoy zero", []string{wire.TimeoutHeader, "100000", "X-Envoy-Expected-Rq-Timeout-Ms", " 0 "}, false},
		{"many headers zero", []string{"A", "1", "B", "2", "C", "3", "D", "4", wire.TimeoutHeader, "0"}, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ctl := ad3New(t, admission.Config{})
			ran := false
			h := ctl.Wrap(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { ran = true }))
			rec := ad3Serve(h, ad3Req(tc.kv...))
			if tc.admit {
				if !ran || rec.Code != 200 {
					t.Errorf("%v: %d ran=%v, want admitted", tc.kv, rec.Code, ran)
				}
				return
			}
			if ran || rec.Code != 503 || !wire.DontRetry(rec.Header()) {
				t.Errorf("%v: %d ran=%v %v, want dropped with don't-retry", tc.kv, rec.Code, ran, rec.Header())
			}
			if s := ctl.Stats(); s.Outcomes[admission.Canceled] != 1 || ad3Sum(s) != 1 {
				t.Errorf("stats %+v", s)
			}
		})
	}
}

// Hostile attempt values: anything that is not 1..2^20 is an original.
func TestAttackAdm3HostileAttemptValues(t *testing.T) {
	ctl := ad3New(t, admission.Config{RetryRatio: -1, MinRetriesPerSecond: -1})
	h := ctl.Wrap(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	for _, v := range []string{"-2", "0", "junk", "2.0", "99999999999999999999", "1048577", "", " ", "0x2", "+2"} {
		if rec := ad3Serve(h, ad3Req(wire.AttemptHeader, v)); rec.Code != 200 {
			t.Errorf("attempt %q: %d, want an original admitted", v, rec.Code)
		}
	}
	for _, v := range []string{"2", " 2 ", "2, 1", "1048576", "0002"} {
		if rec := ad3Serve(h, ad3Req(wire.AttemptHeader, v)); rec.Code != 503 || !wire.DontRetry(rec.Header()) {
			t.Errorf("attempt %q: %d, want a retry refused", v, rec.Code)
		}
	}
}

// A request with a deadline shorter than the queue's wait is dropped at its
// deadline as Canceled with don't-retry, and its handler never runs, even
// when the slot frees at that very moment.
func TestAttackAdm3FieldDeadlineInQueue(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctl := ad3New(t, admission.Config{MaxInFlight: 1})
		p, _ := ctl.Acquire(context.Background(), 1)
		var ran atomic.Int32
		h := ctl.Wrap(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { ran.Add(1) }))
		var wg sync.WaitGroup
		wg.Go(func() {
			start := time.Now()
			rec := ad3Serve(h, ad3Req(wire.TimeoutHeader, "50"))
			if el := time.Since(start); el != 50*time.Millisecond || rec.Code != 503 || !wire.DontRetry(rec.Header()) {
				t.Errorf("after %v: %d %v, want dropped at 50ms with don't-retry", el, rec.Code, rec.Header())
			}
		})
		time.Sleep(50 * time.Millisecond)
		p.Release() // the slot frees at the caller's deadline
		wg.Wait()
		if ran.Load() != 0 {
			t.Errorf("handler ran for a caller whose deadline had passed")
		}
		if s := ctl.Stats(); s.InFlight != 0 || s.Queued != 0 || s.Outcomes[admission.Canceled] != 1 {
			t.Errorf("stats %+v", s)
		}
	})
}

// The handler panicking inside Wrap gives its slot back and the queued
// request gets it.
func TestAttackAdm3WrapPanicHandsSlotOn(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctl := ad3New(t, admission.Config{MaxInFlight: 1})
		entered := make(chan struct{})
		h := ctl.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Header.Get("X-Panic") != "" {
				close(entered)
				time.Sleep(10 * time.Millisecond)
				panic(http.ErrAbortHandler)
			}
		}))
		var wg sync.WaitGroup
		wg.Go(func() {
			defer func() {
				if recover() == nil {
					t.Error("no panic")
				}
			}()
			ad3Serve(h, ad3Req("X-Panic", "1"))
		})
		<-entered
		var code int
		wg.Go(func() { code = ad3Serve(h, ad3Req()).Code })
		wg.Wait()
		if code != 200 {
			t.Errorf("queued request after the panic: %d", code)
		}
		if s := ctl.Stats(); s.InFlight != 0 || s.Outcomes[admission.Admitted] != 2 {
			t.Errorf("stats %+v", s)
		}
	})
}

// Permit.Release twice on the same variable frees one slot only (adaptive
// and fixed).
func TestAttackAdm3ReleaseTwice(t *testing.T) {
	for _, lc := range []time.Duration{0, time.Second} {
		ctl := ad3New(t, admission.Config{MaxInFlight: 1, MaxQueue: -1, LatencyCeiling: lc})
		p, _ := ctl.Acquire(context.Background(), 1)
		q, _ := ctl.Acquire(context.Background(), 1)
		q.Release() // the zero Permit
		p.Release()
		p.Release()
		p1, d1 := ctl.Acquire(context.Background(), 1)
		_, d2 := ctl.Acquire(context.Background(), 1)
		if d1.Outcome != admission.Admitted || d2.Outcome != admission.QueueFull {
			t.Errorf("ceiling %v: after a double Release: %v, %v; want admitted, queue-full", lc, d1.Outcome, d2.Outcome)
		}
		p1.Release()
		if s := ctl.Stats(); s.InFlight != 0 {
			t.Errorf("in flight %d", s.InFlight)
		}
	}
}

// Many goroutines, -race: mixed originals, retries, probes, deadlines and
// cancels through Wrap with an adaptive limit; the handlers never exceed
// MaxInFlight at once, each request has exactly one final decision, and
// nothing is left in flight or queued.
func TestAttackAdm3RaceStormAdaptive(t *testing.T) {
	const maxIn = 4
	obs := &ad3Obs{}
	ctl := ad3New(t, admission.Config{MaxInFlight: maxIn, MaxQueue: 6, LatencyCeiling: 20 * time.Millisecond,
		MaxQueueWait: 20 * time.Millisecond, Observer: obs})
	var cur, peakN atomic.Int64
	var runs atomic.Int64
	h := ctl.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := cur.Add(1)
		for {
			m := peakN.Load()
			if n <= m || peakN.CompareAndSwap(m, n) {
				break
			}
		}
		runs.Add(1)
		time.Sleep(time.Duration(rand.IntN(3000)) * time.Microsecond)
		cur.Add(-1)
	}))
	var wg sync.WaitGroup
	const n = 64
	const per = 40
	var codes [600]atomic.Int64
	for g := range n {
		wg.Go(func() {
			for i := range per {
				kv := []string{}
				switch (g + i) % 6 {
				case 1:
					kv = append(kv, wire.AttemptHeader, "2")
				case 2:
					kv = append(kv, wire.AttemptHeader, "3", wire.ProbeHeader, "1")
				case 3:
					kv = append(kv, wire.TimeoutHeader, strconv.Itoa(rand.IntN(10)))
				case 4:
					kv = append(kv, "Idempotency-Key", "k"+strconv.Itoa(rand.IntN(20)))
				}
				r := ad3Req(kv...)
				if (g+i)%6 == 5 {
					ctx, cancel := context.WithTimeout(context.Background(), time.Duration(rand.IntN(5000))*time.Microsecond)
					r = r.WithContext(ctx)
					codes[ad3Serve(h, r).Code].Add(1)
					cancel()
					continue
				}
				codes[ad3Serve(h, r).Code].Add(1)
			}
		})
	}
	wg.Wait()
	s := ctl.Stats()
	if p := peakN.Load(); p > maxIn {
		t.Errorf("peak handlers %d > MaxInFlight %d", p, maxIn)
	}
	if s.InFlight != 0 || s.Queued != 0 {
		t.Errorf("left: %+v", s)
	}
	if s.Originals+s.Retries != n*per || ad3Sum(s) != n*per {
		t.Errorf("stats %+v: seen %d, decided %d, want %d", s, s.Originals+s.Retries, ad3Sum(s), n*per)
	}
	if uint64(runs.Load()) != s.Outcomes[admission.Admitted] || codes[200].Load() != runs.Load() {
		t.Errorf("handler runs %d, 200s %d, admitted %d", runs.Load(), codes[200].Load(), s.Outcomes[admission.Admitted])
	}
	// Events: one per request plus one per queued.
	obs.mu.Lock()
	final, queued := 0, 0
	for _, e := range obs.events {
		if e.Outcome == "queued" {
			queued++
		} else {
			final++
		}
	}
	obs.mu.Unlock()
	if final != n*per {
		t.Errorf("final events %d, want %d (queued %d)", final, n*per, queued)
	}
	t.Logf("codes: 200=%d 503=%d; stats %+v; queued events %d", codes[200].Load(), codes[503].Load(), s, queued)
}

// A request whose context is already canceled (the caller left, no
// deadline) is dropped before anything runs, as step 1 of the package
// documentation says; observed: the don't-retry signal depends on it.
func TestAttackAdm3CanceledOnArrivalSignal(t *testing.T) {
	ctl := ad3New(t, admission.Config{})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, d := ctl.Acquire(ctx, 1)
	if d.Outcome != admission.Canceled {
		t.Fatalf("%v", d)
	}
	t.Logf("original, canceled context on arrival: DontRetry=%v", d.DontRetry)
	ctx2, cancel2 := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
	defer cancel2()
	_, d = ctl.Acquire(ctx2, 1)
	if d.Outcome != admission.Canceled || !d.DontRetry {
		t.Errorf("deadline passed on arrival: %+v, want canceled with don't-retry", d)
	}
	if !errors.Is(ctx2.Err(), context.DeadlineExceeded) {
		t.Fatal("setup")
	}
}

// Observer events: one final event per request with the documented
// Outcome and Reason, one "queued" more for a request that queued, Elapsed
// its wait, Delay its Retry-After; Stats agrees.
func TestAttackAdm3ObserverEventsPerPath(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		obs := &ad3Obs{}
		ctl := ad3New(t, admission.Config{MaxInFlight: 1, MaxQueue: 1, MaxQueueWait: 200 * time.Millisecond,
			RetryRatio: -1, MinRetriesPerSecond: 1, Window: time.Second, Observer: obs})
		p, _ := ctl.Acquire(context.Background(), 1) // admitted
		var wg sync.WaitGroup
		var dRetry, dOrig admission.Decision
		wg.Go(func() { _, dRetry = ctl.Acquire(context.Background(), 2) }) // queued retry (floor 1)
		synctest.Wait()
		wg.Go(func() { // an original takes its place, then times out
			var q admission.Permit
			q, dOrig = ctl.Acquire(context.Background(), 1)
			q.Release()
		})
		synctest.Wait()
		_, dRef := ctl.Acquire(context.Background(), 2)        // beyond the floor
		_, dProbe := ctl.AcquireProbe(context.Background(), 3) // busy, ratio spent
		wg.Wait()
		p.Release()
		if dRetry.Outcome != admission.QueueFull || !dRetry.DontRetry || dOrig.Outcome != admission.QueueTimeout || dOrig.DontRetry ||
			dRef.Outcome != admission.RetryRefused || !dRef.DontRetry || dProbe.Outcome != admission.QueueFull || dProbe.DontRetry || dProbe.RetryAfter != time.Second {
			t.Errorf("decisions: evicted %+v, timed out %+v, refused %+v, probe %+v", dRetry, dOrig, dRef, dProbe)
		}
		obs.mu.Lock()
		defer obs.mu.Unlock()
		type ev struct {
			outcome, reason string
			attempt         int
		}
		var got []ev
		for _, e := range obs.events {
			got = append(got, ev{e.Outcome, e.Reason, e.Attempt})
			if e.Outcome == "shed-busy" && e.Reason == "queue-timeout" && e.Elapsed != 200*time.Millisecond {
				t.Errorf("timeout event Elapsed %v, want 200ms", e.Elapsed)
			}
			if e.Outcome != "admitted" && e.Outcome != "queued" && e.Delay <= 0 {
				t.Errorf("refusal event without Delay: %+v", e)
			}
		}
		want := []ev{{"admitted", "", 1}, {"queued", "", 2}, {"queued", "", 1}, {"shed-busy", "queue-full", 2},
			{"shed-retry", "retry-refused", 2}, {"shed-busy", "queue-full", 3}, {"shed-busy", "queue-timeout", 1}}
		if len(got) != len(want) {
			t.Fatalf("events %+v, want %+v", got, want)
		}
		// The original's "queued" and the retry it evicted ("shed-busy")
		// are told from two goroutines: either may come first.
		if got[2] == want[3] && got[3] == want[2] {
			got[2], got[3] = got[3], got[2]
		}
		for i := range want {
			if got[i] != want[i] {
				t.Errorf("event %d: %+v, want %+v (all %+v)", i, got[i], want[i], got)
			}
		}
		s := ctl.Stats()
		if s.Outcomes != [5]uint64{1, 1, 2, 1, 0} || s.Originals != 2 || s.Retries != 3 {
			t.Errorf("stats %+v", s)
		}
	})
}

// Stats: "Outcomes counts the requests by their final decision". With an
// Observer that panics on "queued" (which the Config documents as
// handled: the request leaves the queue and does not run), the request is
// seen (Originals) but has no outcome at all.
func TestAttackAdm3ObserverPanicQueuedNoOutcome(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		obs := &ad3Obs{panicOn: "queued"}
		ctl := ad3New(t, admission.Config{MaxInFlight: 1, Observer: obs})
		p, _ := ctl.Acquire(context.Background(), 1)
		var wg sync.WaitGroup
		wg.Go(func() {
			defer func() { _ = recover() }()
			q, _ := ctl.Acquire(context.Background(), 1)
			q.Release()
		})
		wg.Wait()
		p.Release()
		s := ctl.Stats()
		if s.InFlight != 0 || s.Queued != 0 {
			t.Fatalf("left behind: %+v", s)
		}
		t.Logf("stats after a panic on queued: %+v (seen %d, decided %d)", s, s.Originals+s.Retries, ad3Sum(s))
	})
}
