package httpretry_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stormguard/stormguard/backoff"
	"github.com/stormguard/stormguard/httpretry"
	"github.com/stormguard/stormguard/retry"
	"github.com/stormguard/stormguard/wire"
)

type agBase struct{ n atomic.Int32 }

func (b *agBase) RoundTrip(r *http.Request) (*http.Response, error) {
	b.n.Add(1)
	return &http.Response{StatusCode: 503, Header: http.Header{}, Body: io.NopCloser(strings.NewReader("busy")), Request: r}, nil
}

type agWait struct {
	n    atomic.Int32
	wait func(ctx context.Context, n int32) error
}

func (w *agWait) Wait(ctx context.Context) error { return w.wait(ctx, w.n.Add(1)) }

// A limiter that refuses the retry: the last 503 comes back readable,
// marked as a give-up for the deadline; one canceled in Wait stops for the
// caller.
func TestAttackGapsHTTPRateLimitRefusesRetry(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b, _ := backoff.New(backoff.Config{Strategy: backoff.Constant, Base: time.Millisecond})
		lerr := errors.New("no tokens")
		w := &agWait{wait: func(ctx context.Context, n int32) error {
			if n == 2 {
				return lerr
			}
			return nil
		}}
		base := &agBase{}
		tr, err := httpretry.NewTransport(base, httpretry.WithRetry(retry.WithRateLimit(w), retry.WithBackoff(b)))
		if err != nil {
			t.Fatal(err)
		}
		req, _ := http.NewRequest("GET", "http://a.example/", nil)
		resp, err := tr.RoundTrip(req)
		if err != nil {
			t.Fatalf("RoundTrip: %v", err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		g, _ := wire.ParseGiveUp(resp.Header.Get(wire.GiveUpHeader))
		t.Logf("status %d body %q header %q parsed %+v", resp.StatusCode, body, resp.Header.Get(wire.GiveUpHeader), g)
		if resp.StatusCode != 503 || string(body) != "busy" || !strings.HasPrefix(resp.Header.Get(wire.GiveUpHeader), "deadline") || base.n.Load() != 1 {
			t.Errorf("status %d body %q header %q sends %d", resp.StatusCode, body, resp.Header.Get(wire.GiveUpHeader), base.n.Load())
		}

		// Canceled during Wait for the retry.
		w2 := &agWait{wait: func(ctx context.Context, n int32) error {
			if n == 2 {
				<-ctx.Done()
				return ctx.Err()
			}
			return nil
		}}
		base2 := &agBase{}
		tr2, _ := httpretry.NewTransport(base2, httpretry.WithRetry(retry.WithRateLimit(w2), retry.WithBackoff(b)))
		ctx, cancel := context.WithCancel(context.Background())
		time.AfterFunc(time.Second, cancel)
		req2, _ := http.NewRequestWithContext(ctx, "GET", "http://a.example/", nil)
		start := time.Now()
		resp2, err := tr2.RoundTrip(req2)
		if resp2 != nil {
			resp2.Body.Close()
		}
		if time.Since(start) != time.Second || base2.n.Load() != 1 {
			t.Errorf("cancel in Wait: after %v, sends %d", time.Since(start), base2.n.Load())
		}
		t.Logf("cancel in Wait: resp %v err %v", resp2 != nil, err)
		if err == nil || !errors.Is(err, context.Canceled) {
			t.Errorf("cancel in Wait: err %v", err)
		}
	})
}
