package httpretry_test

import (
	"context"
	"errors"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/budget"
	"github.com/stormguard/stormguard/httpretry"
	"github.com/stormguard/stormguard/retry"
)

func hostOf(t *testing.T, rawURL string) string {
	t.Helper()
	u, err := url.Parse(rawURL)
	if err != nil {
		t.Fatal(err)
	}
	return strings.ToLower(u.Host)
}

// TestZeroTransport: a Transport{} works like NewTransport(nil): it
// retries a 503 and keeps a budget and a breaker for the host.
func TestZeroTransport(t *testing.T) {
	srv, obs := serve(t, failThenOK(1))
	var tr httpretry.Transport
	if hs := tr.Hosts(); len(hs) != 0 {
		t.Errorf("Hosts() of an unused Transport = %+v, want none", hs)
	}
	client := &http.Client{Transport: &tr}
	resp, err := client.Get(srv.URL)
	if err != nil {
		t.Fatalf("Get through a zero Transport: %v", err)
	}
	if got := readClose(t, resp); resp.StatusCode != 200 || got != "ok" {
		t.Errorf("Get = %d %q, want 200 \"ok\"", resp.StatusCode, got)
	}
	if attempts, _, _ := obs.snapshot(); len(attempts) != 2 || attempts[0] != "" || attempts[1] != "2" {
		t.Errorf("server saw attempt headers %q, want [\"\" 2]", attempts)
	}
	hs := tr.Hosts()
	g, ok := hs[hostOf(t, srv.URL)]
	if len(hs) != 1 || !ok || g.Budget == nil || g.Breaker == nil {
		t.Fatalf("Hosts() = %+v, want the server's host with a budget and a breaker", hs)
	}
	if b := g.Budget.(*budget.Budget).Stats(); b.Requests != 1 || b.Retries != 1 {
		t.Errorf("budget window = %+v, want 1 request and 1 retry", b)
	}
	if s := g.Breaker.Snapshot(); s.State != breaker.Closed || s.Calls != 2 || s.Failures != 1 {
		t.Errorf("breaker = %+v, want closed with 2 calls, 1 failure", s)
	}
}

// TestHosts reports each host's budget and breaker.
func TestHosts(t *testing.T) {
	bad, _ := serve(t, func(w http.ResponseWriter, r *http.Request, n int) { w.WriteHeader(503) })
	good, _ := serve(t, func(w http.ResponseWriter, r *http.Request, n int) {})
	t.Run("defaults", func(t *testing.T) {
		tr, _ := newTransport(t, nil, httpretry.WithBreaker(tripFast()))
		_, _ = getClose(t, tr, bad.URL)
		_, _ = getClose(t, tr, bad.URL) // rejected by the open breaker: deposits, sends nothing
		_, _ = getClose(t, tr, good.URL)
		_, _ = getClose(t, tr, good.URL)
		_, _ = getClose(t, tr, good.URL)
		hs := tr.Hosts()
		if len(hs) != 2 {
			t.Fatalf("Hosts() = %+v, want 2 hosts", hs)
		}
		want := map[string]struct {
			requests, calls int
			state           breaker.State
		}{
			hostOf(t, bad.URL):  {1, 0, breaker.Open}, // the breaker rejected the second call before its first attempt
			hostOf(t, good.URL): {3, 3, breaker.Closed},
		}
		for host, g := range hs {
			w, ok := want[host]
			if !ok || g.Budget == nil || g.Breaker == nil {
				t.Errorf("Hosts() holds %s: %+v, want one of %v with budget and breaker", host, g, want)
				continue
			}
			if b := g.Budget.(*budget.Budget).Stats(); b.Requests != w.requests || b.Retries != 0 {
				t.Errorf("host %s budget = %+v, want %d requests, no retries", host, b, w.requests)
			}
			if s := g.Breaker.Snapshot(); s.State != w.state || s.Calls != w.calls {
				t.Errorf("host %s breaker = %+v, want %v with %d calls", host, s, w.state, w.calls)
			}
		}
	})
	t.Run("without budget, breaker and limiter", func(t *testing.T) {
		tr, _ := newTransport(t, nil, httpretry.WithBudget(nil), httpretry.WithBreaker(nil), httpretry.WithLimit(nil))
		_, _ = getClose(t, tr, good.URL)
		hs := tr.Hosts()
		if g, ok := hs[hostOf(t, good.URL)]; len(hs) != 1 || !ok || g != (retry.Guards{}) {
			t.Errorf("Hosts() = %+v, want the host without budget, breaker or limiter", hs)
		}
	})
	t.Run("default limiter", func(t *testing.T) {
		tr, _ := newTransport(t, nil, httpretry.WithBudget(nil), httpretry.WithBreaker(nil))
		_, _ = getClose(t, tr, good.URL)
		g := tr.Hosts()[hostOf(t, good.URL)]
		if g.Limiter == nil || g.Budget != nil || g.Breaker != nil {
			t.Errorf("Hosts() holds %+v, want the default limiter alone", g)
		}
	})
	t.Run("bounded", func(t *testing.T) {
		tr, _ := newTransport(t, nil, httpretry.WithMaxHosts(1))
		_, _ = getClose(t, tr, bad.URL)
		_, _ = getClose(t, tr, good.URL)
		if hs := tr.Hosts(); len(hs) != 1 || hs[hostOf(t, good.URL)] == (retry.Guards{}) {
			t.Errorf("Hosts() = %+v, want only the host seen last", hs)
		}
	})
}

// TestWithGuards: the guards come from outside, once per host; an error
// fails that host's requests.
func TestWithGuards(t *testing.T) {
	srvA, obsA := serve(t, func(w http.ResponseWriter, r *http.Request, n int) { w.WriteHeader(503) })
	srvB, _ := serve(t, func(w http.ResponseWriter, r *http.Request, n int) {})
	shared, err := breaker.New(breaker.Config{MinCalls: 1, OpenFor: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	asked := map[string]int{}
	denied := errors.New("no guards for this host")
	guards := func(host string) (retry.Guards, error) {
		mu.Lock()
		asked[host]++
		mu.Unlock()
		if host == "denied.example" {
			return retry.Guards{}, denied
		}
		b, err := budget.New(budget.Config{Ratio: -1, MinPerSecond: -1}) // no retries
		if err != nil {
			return retry.Guards{}, err
		}
		return retry.Guards{Budget: b, Breaker: shared}, nil
	}
	tr, _ := newTransport(t, nil, httpretry.WithGuards(guards))
	resp, err := tr.RoundTrip(newRequest(t, context.Background(), "GET", srvA.URL, nil))
	if err != nil {
		t.Fatalf("RoundTrip(A): %v", err)
	}
	readClose(t, resp)
	if g, _ := gaveUp(resp); obsA.count() != 1 || g.Reason != "circuit-open" {
		t.Errorf("A: %d attempts, gave up %+v; want 1, circuit open (the shared breaker tripped)", obsA.count(), g)
	}
	// B shares the breaker the guards handed out: it is open for B too.
	_, err = tr.RoundTrip(newRequest(t, context.Background(), "GET", srvB.URL, nil))
	if !errors.Is(err, breaker.ErrOpen) {
		t.Errorf("RoundTrip(B) = %v, want the shared breaker's rejection", err)
	}
	body := &closeRecorder{r: strings.NewReader("x")}
	_, err = tr.RoundTrip(newRequest(t, context.Background(), "PUT", "http://denied.example/", body))
	if !errors.Is(err, denied) {
		t.Errorf("RoundTrip(denied host) = %v, want the guards' error", err)
	}
	if body.closed.Load() == 0 {
		t.Errorf("the request body of a refused host was not closed")
	}
	_, _ = tr.RoundTrip(newRequest(t, context.Background(), "GET", srvA.URL, nil))
	mu.Lock()
	defer mu.Unlock()
	if asked[hostOf(t, srvA.URL)] != 1 || asked[hostOf(t, srvB.URL)] != 1 {
		t.Errorf("guards asked %v, want once per host", asked)
	}
	hs := tr.Hosts()
	if len(hs) != 2 {
		t.Fatalf("Hosts() = %+v, want A and B", hs)
	}
	for host, g := range hs {
		if g.Budget == nil || g.Breaker != shared || shared.State() != breaker.Open {
			t.Errorf("Hosts() holds %s: %+v, want the guards' budget and the open shared breaker", host, g)
		}
	}
}
