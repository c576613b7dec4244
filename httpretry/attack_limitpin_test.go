// The reproducer of a black-box attack: a limit held down by Config.Max
// stayed in slow start, and slow start turned the hopeless checks off.

package httpretry_test

import (
	"context"
	"net/http"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stormguard/stormguard/admission"
	"github.com/stormguard/stormguard/httpretry"
	"github.com/stormguard/stormguard/limit"
)

// pinFailFastRun warms a limiter capped by Max against a provider answering in
// 1 s, then sends 30 calls at once with a 3 s deadline; it returns when each
// failing call failed and why.
func pinFailFastRun(t *testing.T, cfg *limit.Config, conc int, acfg admission.Config, opts ...httpretry.Option) (fails []time.Duration, reasons map[string]int, served int) {
	ctl, _ := admission.New(acfg)
	n := &e2eNet{start: time.Now(), h: ctl.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		time.Sleep(time.Second)
		w.WriteHeader(200)
	}))}
	defer n.wg.Wait() // its server goroutines end inside the bubble
	tr, err := httpretry.NewTransport(n, append([]httpretry.Option{httpretry.WithLimit(cfg)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	for range 10 { // learn the latency and the rate: conc calls at a time, 10 rounds
		var wg sync.WaitGroup
		for range conc {
			wg.Go(func() {
				resp, err := e2eDo(t, tr, context.Background(), "GET", "warm", "")
				if err != nil {
					return
				}
				resp.Body.Close()
			})
		}
		wg.Wait()
	}
	lim := tr.Hosts()["provider.test"].Limiter
	t.Logf("limit after warm-up: %d", lim.Limit())
	var mu sync.Mutex
	reasons = map[string]int{}
	var wg sync.WaitGroup
	for range 30 {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
			defer cancel()
			start := time.Now()
			resp, err := e2eDo(t, tr, ctx, "GET", "x", "")
			took := time.Since(start)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				fails = append(fails, took)
				msg := err.Error()
				if i := strings.Index(msg, "limit: refused"); i >= 0 {
					msg = msg[i:]
				}
				reasons[msg]++
				return
			}
			if resp.StatusCode == 200 {
				served++
			}
			resp.Body.Close()
		})
	}
	wg.Wait()
	return fails, reasons, served
}

// TestAttackLimitPinnedFailsAtOnce: limit doc: "Calls that cannot make their
// deadline fail fast with ErrLimited and the reason, not at their deadline:
// at once when more calls with a deadline wait ahead than twice the limit's
// measured rate serves before the deadline". A limit of 2 on a provider
// answering in 1 s serves 2 calls/s; of 30 calls with 3 s to live, those with
// more than 2*2*3 = 12 ahead cannot make it even at twice the rate and should
// fail at once.
func TestAttackLimitPinnedFailsAtOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		fails, reasons, served := pinFailFastRun(t, &limit.Config{Max: 2}, 2, admission.Config{})
		atOnce := 0
		for _, d := range fails {
			if d < 100*time.Millisecond {
				atOnce++
			}
		}
		t.Logf("served %d, failed %d (at once: %d), fail times %v, reasons %v", served, len(fails), atOnce, fails, reasons)
		if atOnce < 30-12-2 {
			t.Errorf("%d of 30 calls failed at once, want at least %d (more than 12 calls ahead of them at 2 calls/s and 3 s deadlines)", atOnce, 30-12-2)
		}
	})
}
