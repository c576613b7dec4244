package httpretry_test

import (
	"context"
	"io"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stormguard/stormguard/admission"
	"github.com/stormguard/stormguard/httpretry"
	"github.com/stormguard/stormguard/limit"
	"github.com/stormguard/stormguard/retry"
	"github.com/stormguard/stormguard/wire"
)

// hintProvider is a provider behind admission, in memory: until grow, a
// controller that runs small requests at once and queues none (an
// overload is shed at once with 503 and the capacity hint); from grow on,
// one that runs large. Each request takes 10 ms. It counts the requests
// that reach it in flight at once (admitted or being shed) and the
// shed answers, and can strip the hint from its answers.
type hintProvider struct {
	grow        time.Time
	before, now *admission.Controller
	strip       bool

	inFlight, peak atomic.Int64
	arrived, shed  atomic.Int64
	peakAfter      atomic.Int64 // the peak in flight since grow
}

func newHintProvider(t *testing.T, grow time.Time, small, large int, strip bool) *hintProvider {
	t.Helper()
	mk := func(n int) *admission.Controller {
		c, err := admission.New(admission.Config{MaxInFlight: n, MaxQueue: -1, RetryAfterSpread: -1, RetryRatio: 1})
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	return &hintProvider{grow: grow, before: mk(small), now: mk(large), strip: strip}
}

func (p *hintProvider) RoundTrip(r *http.Request) (*http.Response, error) {
	in := p.inFlight.Add(1)
	defer p.inFlight.Add(-1)
	p.arrived.Add(1)
	ctl := p.before
	if !time.Now().Before(p.grow) {
		ctl = p.now
		for v := p.peakAfter.Load(); in > v && !p.peakAfter.CompareAndSwap(v, in); v = p.peakAfter.Load() {
		}
	}
	for v := p.peak.Load(); in > v && !p.peak.CompareAndSwap(v, in); v = p.peak.Load() {
	}
	h := ctl.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { time.Sleep(10 * time.Millisecond) }))
	resp, err := memTransport{h}.RoundTrip(r)
	if err == nil && resp.StatusCode == http.StatusServiceUnavailable {
		p.shed.Add(1)
		if p.strip {
			delete(resp.Header, wire.CapacityHeader)
		}
	}
	return resp, err
}

// TestCapacityHintCapsSharedTransport: 60 callers in a loop share one
// transport with a limiter (WithLimit) to a provider whose admission runs
// 8 requests at once and sheds the rest at once with "Stormguard-Capacity:
// 8". From the first shed answer on, the transport's limit is capped at 8
// while the provider sheds: measured at the middle of the first hold, and
// the provider sheds at most a few of the requests that reach it (the
// bursts the cap's relaxation sends to find out whether the provider has
// grown). Without the hint (the provider strips it), the limiter alone
// learns from the drops and the provider sheds more. At 3 s the provider
// grows to 64 at once and sheds no more: the cap relaxes (it doubles once
// the hold is over) and is gone within 2 s, and more than 8 requests reach
// the provider at once. Run on synctest's clock.
func TestCapacityHintCapsSharedTransport(t *testing.T) {
	type result struct {
		limitAt500ms, capAfter    int
		arrivedBefore, shedBefore int64
		peakBefore, peakAfter     int64
		servedBefore, servedAfter int64
	}
	run := func(t *testing.T, strip bool) (r result) {
		synctest.Test(t, func(t *testing.T) {
			start := time.Now()
			grow := start.Add(3 * time.Second)
			p := newHintProvider(t, grow, 8, 64, strip)
			tr, _ := newTransport(t, p, httpretry.WithLimit(&limit.Config{}), httpretry.WithBudget(nil))
			var served [2]atomic.Int64
			var wg sync.WaitGroup
			for range 60 {
				wg.Go(func() {
					for time.Since(start) < 6*time.Second {
						ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
						req, _ := http.NewRequestWithContext(ctx, "GET", "http://dependency.test/", nil)
						resp, err := tr.RoundTrip(req)
						if err == nil {
							_, _ = io.Copy(io.Discard, resp.Body)
							_ = resp.Body.Close()
							if resp.StatusCode == 200 {
								served[boolIndex(!time.Now().Before(grow))].Add(1)
							}
						} else {
							time.Sleep(10 * time.Millisecond)
						}
						cancel()
					}
				})
			}
			time.Sleep(500 * time.Millisecond)
			lim := tr.Hosts()["dependency.test"].Limiter
			r.limitAt500ms = lim.Limit()
			time.Sleep(time.Until(grow))
			r.arrivedBefore, r.shedBefore, r.peakBefore = p.arrived.Load(), p.shed.Load(), p.peak.Load()
			time.Sleep(2 * time.Second)
			r.capAfter = lim.Limit()
			wg.Wait()
			r.peakAfter = p.peakAfter.Load()
			r.servedBefore, r.servedAfter = served[0].Load(), served[1].Load()
		})
		return r
	}
	with := run(t, false)
	without := run(t, true)
	for _, x := range []struct {
		name string
		r    result
	}{{"with the hint:   ", with}, {"without the hint:", without}} {
		t.Logf("%s limit at 0.5 s %d; before 3 s: %d shed of %d arrived, peak in flight %d, %d served; after: peak in flight %d, limit at 5 s %d, %d served",
			x.name, x.r.limitAt500ms, x.r.shedBefore, x.r.arrivedBefore, x.r.peakBefore, x.r.servedBefore, x.r.peakAfter, x.r.capAfter, x.r.servedAfter)
	}
	if with.limitAt500ms != 8 {
		t.Errorf("limit at 0.5 s = %d, want the hint, 8", with.limitAt500ms)
	}
	if with.peakBefore > 16 {
		t.Errorf("%d requests reached the provider at once before it grew, want at most 16 (twice the hint, the cap's relaxation)", with.peakBefore)
	}
	if with.shedBefore*50 > with.arrivedBefore || with.shedBefore >= without.shedBefore {
		t.Errorf("%d of %d requests shed before the provider grew (%d without the hint), want at most 2%% and fewer than without",
			with.shedBefore, with.arrivedBefore, without.shedBefore)
	}
	if with.servedBefore < 2160 || with.servedBefore <= without.servedBefore {
		t.Errorf("%d served in the 3 s at 8 at once (2400 at most; %d without the hint), want at least 90%% and more than without",
			with.servedBefore, without.servedBefore)
	}
	if with.capAfter <= 64 || with.peakAfter <= 8 {
		t.Errorf("after the provider grew to 64: limit at 5 s %d, peak in flight %d; want the cap gone (limit above 64) and more than 8 in flight",
			with.capAfter, with.peakAfter)
	}
}

func boolIndex(b bool) int {
	if b {
		return 1
	}
	return 0
}

// onceHinted is a provider that answers its first request 503 with
// "Stormguard-Capacity: 1" and serves every later one in 10 ms, counting
// the peak of requests in flight after the first.
type onceHinted struct {
	n, inFlight, peak atomic.Int64
}

func (p *onceHinted) RoundTrip(r *http.Request) (*http.Response, error) {
	resp := &http.Response{StatusCode: 200, Header: http.Header{}, Body: http.NoBody, Request: r}
	if p.n.Add(1) == 1 {
		resp.StatusCode = 503
		resp.Header.Set(wire.CapacityHeader, "1")
		return resp, nil
	}
	in := p.inFlight.Add(1)
	defer p.inFlight.Add(-1)
	for v := p.peak.Load(); in > v && !p.peak.CompareAndSwap(v, in); v = p.peak.Load() {
	}
	time.Sleep(10 * time.Millisecond)
	return resp, nil
}

// TestCapacityHintLeavesSuppliedLimiter: the hint caps the limiter the
// transport built (WithLimit), not one the guards supply (WithGuards, as a
// fleet's is, capped by its owner at a share of a fleet-wide limit, 5
// here): after one answer with "Stormguard-Capacity: 1", 20 requests at
// once go out one at a time through the transport's own limiter, and up
// to the owner's cap through a supplied one, whose cap stays its owner's.
// Run on synctest's clock.
func TestCapacityHintLeavesSuppliedLimiter(t *testing.T) {
	for _, supplied := range []bool{false, true} {
		synctest.Test(t, func(t *testing.T) {
			p := &onceHinted{}
			opts := []httpretry.Option{httpretry.WithLimit(&limit.Config{}), httpretry.WithBudget(nil)}
			if supplied {
				lim, err := limit.New(limit.Config{})
				if err != nil {
					t.Fatal(err)
				}
				lim.SetCap(5) // the owner's cap
				opts = append(opts, httpretry.WithGuards(func(string) (retry.Guards, error) { return retry.Guards{Limiter: lim}, nil }))
			}
			tr, _ := newTransport(t, p, opts...)
			get := func() {
				ctx, cancel := context.WithTimeout(context.Background(), time.Second)
				defer cancel()
				req, _ := http.NewRequestWithContext(ctx, "GET", "http://dependency.test/", nil)
				if resp, err := tr.RoundTrip(req); err != nil {
					t.Errorf("request: %v", err)
				} else {
					_ = resp.Body.Close()
				}
			}
			get() // the hinted answer, then a success
			var wg sync.WaitGroup
			for range 20 {
				wg.Go(get)
			}
			wg.Wait()
			want, peak := int64(1), p.peak.Load()
			if supplied {
				want = 5
			}
			if peak != want {
				t.Errorf("supplied limiter %v: %d requests in flight at once after the hint of 1, want %d", supplied, peak, want)
			}
		})
	}
}
