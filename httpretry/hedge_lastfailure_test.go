package httpretry_test

import (
	"net/http"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stormguard/stormguard/httpretry"
)

// TestHedgeLastFailureInTime: when every copy of a race fails, the retry
// loop gets the failure that came last (docs/hedging.md), not a hedge's
// that came before the first copy's: here the hedge's 500 comes at 60 ms
// (the method's one retry of a 500 would then be spent), the first copy's
// 503 at 200 ms, so the call is retried (and the third request answers),
// as for the first copy's failure alone. (Found against grpcretry;
// httpretry kept the hedge's failure the same way.) An earlier failure
// with more of the server's word (a don't-retry signal, a longer
// Retry-After) stands instead: TestAttackRAHTTPHedgedRaceKeeps*.
func TestHedgeLastFailureInTime(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		base := &atkhBase{fn: func(i int, r *http.Request) (time.Duration, int, http.Header, string) {
			switch i {
			case 0:
				return 0, 200, nil, "seen" // the host is first seen
			case 1:
				return 200 * time.Millisecond, 503, nil, "first copy"
			case 2:
				return 10 * time.Millisecond, 500, nil, "hedge"
			}
			return 0, 200, nil, "retried"
		}}
		tr, err := httpretry.NewTransport(base, httpretry.WithHedging(50*time.Millisecond, 0, 1))
		if err != nil {
			t.Fatal(err)
		}
		if _, _, err := atkhDo(t, tr, "GET", "http://h.example/a", nil); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Second)
		resp, body, err := atkhDo(t, tr, "GET", "http://h.example/a", nil)
		synctest.Wait()
		if err != nil || resp.StatusCode != 200 || body != "retried" || len(base.sent()) != 4 {
			code := 0
			if resp != nil {
				code = resp.StatusCode
			}
			t.Errorf("got %d %q (err %v) after %d requests; want the retry's 200 after 4 (the first copy's plain 503 came last)", code, body, err, len(base.sent()))
		}
		if n := base.open.Load(); n != 0 {
			t.Errorf("%d bodies left open", n)
		}
	})
}
