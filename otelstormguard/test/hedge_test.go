package test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stormguard/stormguard/httpretry"
)

// slowFirst is a base whose first request hangs until canceled and whose
// others answer 200 after 10 ms.
type slowFirst struct{ n atomic.Int64 }

func (s *slowFirst) RoundTrip(r *http.Request) (*http.Response, error) {
	d := 10 * time.Millisecond
	if s.n.Add(1) == 1 {
		d = time.Hour
	}
	select {
	case <-time.After(d):
	case <-r.Context().Done():
		return nil, r.Context().Err()
	}
	rec := httptest.NewRecorder()
	_, _ = io.WriteString(rec, "ok")
	resp := rec.Result()
	resp.Request = r
	return resp, nil
}

// A hedged GET: two attempt spans, the hedge's marked stormguard.hedge
// with resend count 1, and the attempts counter counts it.
func TestHTTPHedge(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newSDK(t)
		rt, err := httpretry.NewTransport(&slowFirst{}, httpretry.WithHedging(50*time.Millisecond, 0, 1), httpretry.WithObserver(s.obs))
		if err != nil {
			t.Fatal(err)
		}
		if code, err := get(t, context.Background(), rt, "http://127.0.0.1:8080"); err != nil || code != 200 {
			t.Fatalf("GET = %d, %v", code, err)
		}
		synctest.Wait()
		var got []string
		for _, sp := range s.spans.Ended() {
			a := spanAttrs(sp.Attributes())
			got = append(got, sp.Name()+" attempt="+a["stormguard.attempt"]+" hedge="+a["stormguard.hedge"]+" resend="+a["http.request.resend_count"]+" outcome="+a["stormguard.outcome"])
		}
		slices.Sort(got)
		want := []string{
			"stormguard.attempt attempt=1 hedge= resend= outcome=success",
			"stormguard.attempt attempt=2 hedge=true resend=1 outcome=success",
		}
		if !slices.Equal(got, want) {
			t.Errorf("spans\n%q\nwant\n%q", got, want)
		}
	})
}
