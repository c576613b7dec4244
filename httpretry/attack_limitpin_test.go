// The reproducer of a black-box attack: a limit held down by Config.Max
// stayed in slow start, and slow start turned the hopeless checks off.

package httpretry_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stormguard/stormguard/admission"
	"github.com/stormguard/stormguard/httpretry"
	"github.com/stormguard/stormguard/limit"
	"github.com/stormguard/stormguard/wire"
)

// pinSent is one request as it reached the in-memory wire.
type pinSent struct {
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

// pinNet is an in-memory network: it serves each request with h on a
// goroutine (server context without the client's deadline) and records it.
type pinNet struct {
	h     http.Handler
	start time.Time
	mu    sync.Mutex
	sent  []*pinSent
	inFl  atomic.Int64
	maxIn atomic.Int64
	wg    sync.WaitGroup // the server's goroutines: waited for, so that synctest's bubble ends empty
}

func (n *pinNet) RoundTrip(r *http.Request) (*http.Response, error) {
	s := &pinSent{at: time.Since(n.start), method: r.Method, attempt: r.Header.Get(wire.AttemptHeader),
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

// pinDo sends one request through tr.
func pinDo(t *testing.T, tr http.RoundTripper, ctx context.Context, method, tag string, body string) (*http.Response, error) {
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

// pinFailFastRun warms a limiter capped by Max against a provider answering in
// 1 s, then sends 30 calls at once with a 3 s deadline; it returns when each
// failing call failed and why.
func pinFailFastRun(t *testing.T, cfg *limit.Config, conc int, acfg admission.Config, opts ...httpretry.Option) (fails []time.Duration, reasons map[string]int, served int) {
	ctl, _ := admission.New(acfg)
	n := &pinNet{start: time.Now(), h: ctl.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
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
				resp, err := pinDo(t, tr, context.Background(), "GET", "warm", "")
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
			resp, err := pinDo(t, tr, ctx, "GET", "x", "")
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
