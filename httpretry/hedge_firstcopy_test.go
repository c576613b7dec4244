package httpretry_test

import (
	"context"
	"maps"
	"net/http"
	"slices"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stormguard/stormguard/httpretry"
	"github.com/stormguard/stormguard/wire"
)

// TestHedgeFirstCopyAsSent: a race's first copy goes as the same attempt
// goes without hedging: the same header (wire.TimeoutHeader included when
// the attempt has a deadline) and the same deadline.
func TestHedgeFirstCopyAsSent(t *testing.T) {
	tests := []struct {
		name     string
		opts     []httpretry.Option
		deadline time.Duration // the caller's, 0 for none
		wantTO   string        // the wire.TimeoutHeader expected, "" for none
	}{
		{"plain", nil, 0, ""},
		{"caller's deadline", nil, 300 * time.Millisecond, ""}, // the caller's request goes as it is
		{"attempt timeout", []httpretry.Option{httpretry.WithAttemptTimeout(200 * time.Millisecond)}, 0, "200"},
		{"attempt timeout under the caller's deadline", []httpretry.Option{httpretry.WithAttemptTimeout(200 * time.Millisecond)}, 150 * time.Millisecond, "150"},
		{"transport timeout", []httpretry.Option{httpretry.WithTimeout(time.Second)}, 0, "1000"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// first sends one GET, answered in 10 ms, and returns the
			// request the base got and its deadline from the call's start.
			first := func(t *testing.T, opts ...httpretry.Option) (*http.Request, time.Duration, bool) {
				var r *http.Request
				var dl time.Duration
				var ok bool
				synctest.Test(t, func(t *testing.T) {
					base := &legBase{answer: delays(10 * time.Millisecond)}
					tr, err := httpretry.NewTransport(base, opts...)
					if err != nil {
						t.Fatal(err)
					}
					ctx := context.Background()
					if tt.deadline > 0 {
						var cancel context.CancelFunc
						ctx, cancel = context.WithTimeout(ctx, tt.deadline)
						defer cancel()
					}
					start := time.Now()
					if _, _, err := hedgeGet(t, tr, ctx); err != nil {
						t.Fatal(err)
					}
					sent := base.sent()
					if len(sent) != 1 {
						t.Fatalf("%d requests sent, want 1", len(sent))
					}
					r = sent[0]
					var d time.Time
					d, ok = r.Context().Deadline()
					dl = d.Sub(start)
					base.settle(t)
				})
				return r, dl, ok
			}
			plain, pdl, pok := first(t, tt.opts...)
			hedged, hdl, hok := first(t, append([]httpretry.Option{httpretry.WithHedging(50*time.Millisecond, 0, 1)}, tt.opts...)...)
			if got := hedged.Header.Get(wire.TimeoutHeader); got != tt.wantTO {
				t.Errorf("first copy's %s = %q, want %q", wire.TimeoutHeader, got, tt.wantTO)
			}
			if !maps.EqualFunc(hedged.Header, plain.Header, slices.Equal) {
				t.Errorf("first copy's header %v, without hedging %v", hedged.Header, plain.Header)
			}
			if hdl != pdl || hok != pok {
				t.Errorf("first copy's deadline %v (%v), without hedging %v (%v)", hdl, hok, pdl, pok)
			}
		})
	}
}

// TestHedgeAttemptTimeoutPerCopy: with an attempt timeout, every copy of a
// race is capped from its own start. The first copy (never answering) is
// cut off 200 ms after the race starts; the hedge, sent at 50 ms, answers
// 180 ms later, after the first copy's cap but within its own, and wins.
func TestHedgeAttemptTimeoutPerCopy(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		base := &legBase{answer: delays(time.Hour, 180*time.Millisecond)}
		tr, err := httpretry.NewTransport(base, httpretry.WithHedging(50*time.Millisecond, 0, 1),
			httpretry.WithAttemptTimeout(200*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		body, took, err := hedgeGet(t, tr, context.Background())
		if err != nil || body != "leg1" || took != 230*time.Millisecond {
			t.Errorf("GET = %q after %v, %v; want \"leg1\" after 230ms", body, took, err)
		}
		sent := base.sent()
		if len(sent) != 2 {
			t.Fatalf("%d requests sent, want 2", len(sent))
		}
		for i, want := range []time.Duration{200 * time.Millisecond, 250 * time.Millisecond} {
			dl, ok := sent[i].Context().Deadline()
			if !ok || dl.Sub(start) != want {
				t.Errorf("copy %d: deadline %v after the start (%v), want %v", i, dl.Sub(start), ok, want)
			}
			if got := sent[i].Header.Get(wire.TimeoutHeader); got != "200" {
				t.Errorf("copy %d: %s = %q, want \"200\"", i, wire.TimeoutHeader, got)
			}
		}
		if err := sent[0].Context().Err(); err != context.DeadlineExceeded {
			t.Errorf("first copy's context ended with %v, want its own deadline", err)
		}
		base.settle(t)
	})
}

// TestHedgeFirstCopyReleased: the context of a race's first copy that
// answered before the delay is released when its body is closed (a
// cancelable parent would otherwise keep it in its list of children, an
// attempt timeout its timer), except on a parent that never ends and
// without an attempt timeout, where it holds nothing to release and is
// left to the collector.
func TestHedgeFirstCopyReleased(t *testing.T) {
	tests := []struct {
		name       string
		cancelable bool
		opts       []httpretry.Option
		want       error // the first copy's context's error once the body is closed
	}{
		{"cancelable parent", true, nil, context.Canceled},
		{"attempt timeout", false, []httpretry.Option{httpretry.WithAttemptTimeout(time.Second)}, context.Canceled},
		{"parent that never ends", false, nil, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				base := &legBase{answer: delays(10 * time.Millisecond)}
				tr, err := httpretry.NewTransport(base, append([]httpretry.Option{httpretry.WithHedging(50*time.Millisecond, 0, 1)}, tt.opts...)...)
				if err != nil {
					t.Fatal(err)
				}
				ctx := context.Background()
				if tt.cancelable {
					var cancel context.CancelFunc
					ctx, cancel = context.WithCancel(ctx)
					defer cancel()
				}
				req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://example.test/x", nil)
				resp, err := tr.RoundTrip(req)
				if err != nil {
					t.Fatal(err)
				}
				lctx := resp.Request.Context()
				if lctx == ctx || lctx.Err() != nil {
					t.Fatalf("first copy on the caller's context, or one already ended (%v): no race", lctx.Err())
				}
				resp.Body.Close()
				if err := lctx.Err(); err != tt.want {
					t.Errorf("first copy's context after the body's close: %v, want %v", err, tt.want)
				}
				base.settle(t)
			})
		})
	}
}
