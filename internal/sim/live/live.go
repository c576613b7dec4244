// Package live runs a retry storm for real, on loopback: a [Provider] is an
// HTTP server that fails for a while and counts, per window, every attempt
// that reaches it; a fleet ([RunFleet]) is many goroutine clients sending a
// steady load through whatever HTTP client is under test.
//
// It is what `stormguard demo` and the peer comparison in the bench module
// are built on. It measures at the server, so a client cannot under-report
// its own retries. Runs take real time (seconds); tests of this package only
// check its accounting, never its timing.
package live

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// ProviderConfig describes a provider that is healthy, then fails every
// request with 503 for FailFor starting FailAt after [Provider.Start], then
// is healthy again.
type ProviderConfig struct {
	// FailAt is when the outage starts, measured from Start.
	FailAt time.Duration `json:"fail_at_ns"`
	// FailFor is how long the outage lasts.
	FailFor time.Duration `json:"fail_for_ns"`
	// RetryAfter, if positive, is sent as a Retry-After header (whole
	// seconds, rounded up) on every 503 of the outage. Zero sends none.
	RetryAfter time.Duration `json:"retry_after_ns"`
	// Capacity, if positive, is the most requests the provider works on at
	// once; a request beyond it waits in the queue (see Queue) or, when the
	// queue is full, is answered 503 at once (shed), outage or not. Zero
	// means unlimited.
	Capacity int `json:"capacity"`
	// Queue is how many requests may wait for a worker when all Capacity
	// are busy. A queued request is served even if its client has given up
	// meanwhile: that wasted work is what keeps an overloaded server down
	// after the trigger has gone (a metastable failure). Zero sheds at once.
	Queue int `json:"queue"`
	// Work is how long a healthy request takes to serve (a real sleep in
	// the handler). Zero answers at once.
	Work time.Duration `json:"work_ns"`
	// Window is the width of a counting window; it must be positive.
	Window time.Duration `json:"window_ns"`
	// Horizon is how long the provider counts; attempts after it are
	// counted in the last window. It must be positive.
	Horizon time.Duration `json:"horizon_ns"`
}

// ErrInvalidConfig is wrapped by the errors this package returns for
// settings it cannot run.
var ErrInvalidConfig = errors.New("live: invalid config")

// counts are the atomic counters of one window.
type counts struct {
	attempts, ok, failed, shed atomic.Int64
}

// Provider is an [http.Handler] that fails on a schedule and counts the
// attempts that reach it per window. It is safe for concurrent use. Build it
// with [NewProvider], serve it (e.g. with [Provider.Listen]) and call
// [Provider.Start] when the fleet starts.
type Provider struct {
	cfg     ProviderConfig
	start   atomic.Int64 // unix nanoseconds of Start; 0 before
	inside  atomic.Int64 // requests being served or waiting
	workers chan struct{}
	windows []counts
}

// NewProvider validates c and returns a provider.
func NewProvider(c ProviderConfig) (*Provider, error) {
	switch {
	case c.Window <= 0:
		return nil, fmt.Errorf("%w: window %v must be positive", ErrInvalidConfig, c.Window)
	case c.Horizon <= 0:
		return nil, fmt.Errorf("%w: horizon %v must be positive", ErrInvalidConfig, c.Horizon)
	case c.Horizon/c.Window > 1_000_000:
		return nil, fmt.Errorf("%w: horizon/window above a million windows", ErrInvalidConfig)
	case c.FailAt < 0 || c.FailFor < 0 || c.RetryAfter < 0 || c.Capacity < 0 || c.Queue < 0 || c.Work < 0:
		return nil, fmt.Errorf("%w: negative setting in %+v", ErrInvalidConfig, c)
	}
	n := int((c.Horizon + c.Window - 1) / c.Window)
	return &Provider{cfg: c, windows: make([]counts, n), workers: make(chan struct{}, max(c.Capacity, 1))}, nil
}

// Start starts the provider's clock: windows and the outage are measured
// from now. Requests before Start are served healthy and counted in window 0.
func (p *Provider) Start() { p.start.Store(time.Now().UnixNano()) }

// since returns the time since Start (0 before it).
func (p *Provider) since() time.Duration {
	s := p.start.Load()
	if s == 0 {
		return 0
	}
	return time.Duration(time.Now().UnixNano() - s)
}

// Failing reports whether the outage is on at time t since Start.
func (p *Provider) Failing(t time.Duration) bool {
	return t >= p.cfg.FailAt && t < p.cfg.FailAt+p.cfg.FailFor
}

// ServeHTTP answers one attempt: 503 during the outage or when over
// capacity, else 200 after Work.
func (p *Provider) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	// Drain what the client sent so the connection can be reused.
	io.Copy(io.Discard, io.LimitReader(r.Body, 1<<20))
	t := p.since()
	win := &p.windows[min(int(t/p.cfg.Window), len(p.windows)-1)]
	win.attempts.Add(1)
	if p.Failing(t) {
		win.failed.Add(1)
		if ra := p.cfg.RetryAfter; ra > 0 {
			w.Header().Set("Retry-After", strconv.FormatInt(int64((ra+time.Second-1)/time.Second), 10))
		}
		http.Error(w, "provider unavailable", http.StatusServiceUnavailable)
		return
	}
	if c := p.cfg.Capacity; c > 0 {
		if p.inside.Add(1) > int64(c+p.cfg.Queue) {
			p.inside.Add(-1)
			win.shed.Add(1)
			http.Error(w, "provider over capacity", http.StatusServiceUnavailable)
			return
		}
		// Wait for a worker, whether or not the client is still there.
		p.workers <- struct{}{}
		defer func() {
			<-p.workers
			p.inside.Add(-1)
		}()
	}
	if p.cfg.Work > 0 {
		time.Sleep(p.cfg.Work)
	}
	win.ok.Add(1)
	io.WriteString(w, "ok\n")
}

// Window is what the provider saw in one window.
type Window struct {
	// Start is the window's start since [Provider.Start].
	Start time.Duration `json:"start_ns"`
	// Attempts is every request that reached the provider.
	Attempts int64 `json:"attempts"`
	// OK were served, Failed got the outage's 503, Shed got the
	// over-capacity 503.
	OK     int64 `json:"ok"`
	Failed int64 `json:"failed"`
	Shed   int64 `json:"shed"`
}

// Windows returns the counts so far, one entry per window of the horizon.
func (p *Provider) Windows() []Window {
	out := make([]Window, len(p.windows))
	for i := range p.windows {
		c := &p.windows[i]
		out[i] = Window{
			Start:    time.Duration(i) * p.cfg.Window,
			Attempts: c.attempts.Load(), OK: c.ok.Load(), Failed: c.failed.Load(), Shed: c.shed.Load(),
		}
	}
	return out
}

// Listen serves p on a new loopback listener (127.0.0.1, a free port) and
// returns its base URL and a function that stops the server.
func (p *Provider) Listen() (url string, stop func(), err error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, fmt.Errorf("live: listen on loopback: %w", err)
	}
	srv := &http.Server{Handler: p, ReadHeaderTimeout: 10 * time.Second}
	done := make(chan struct{})
	go func() {
		defer close(done)
		srv.Serve(ln)
	}()
	stop = func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		if srv.Shutdown(ctx) != nil {
			srv.Close()
		}
		<-done
	}
	return "http://" + ln.Addr().String(), stop, nil
}

// FleetConfig describes a fleet of clients each sending one logical request
// every Every, for Duration.
type FleetConfig struct {
	// Clients is the number of clients; it must be positive.
	Clients int `json:"clients"`
	// Every is the interval between a client's logical requests; it must
	// be positive. Clients start evenly spread over the first interval.
	Every time.Duration `json:"every_ns"`
	// Duration is how long clients keep sending new requests; it must be
	// positive. RunFleet returns when the last request has finished.
	Duration time.Duration `json:"duration_ns"`
	// Deadline bounds each logical request, retries included (a context
	// deadline). Zero means none.
	Deadline time.Duration `json:"deadline_ns"`
}

// FleetStats counts the fleet's logical requests.
type FleetStats struct {
	// Offered is the number of logical requests started.
	Offered int64 `json:"offered"`
	// Succeeded ended with a nil error.
	Succeeded int64 `json:"succeeded"`
	// Failed ended with an error.
	Failed int64 `json:"failed"`
}

// Call performs one logical request (with whatever retries the client under
// test makes) and reports whether it succeeded.
type Call func(ctx context.Context) error

// RunFleet runs the fleet: every client calls call once per Every, each call
// in its own goroutine so that slow retry loops overlap as they do in real
// clients. Client i starts at i·Every/Clients, so the fleet's load is even,
// and sends at fixed times: the number of calls offered is exactly the
// number of scheduled times before Duration. It returns when every call has
// returned; ctx cancels the run.
func RunFleet(ctx context.Context, c FleetConfig, call Call) (FleetStats, error) {
	switch {
	case c.Clients <= 0:
		return FleetStats{}, fmt.Errorf("%w: clients %d must be positive", ErrInvalidConfig, c.Clients)
	case c.Every <= 0 || c.Duration <= 0 || c.Deadline < 0:
		return FleetStats{}, fmt.Errorf("%w: every %v and duration %v must be positive, deadline %v not negative",
			ErrInvalidConfig, c.Every, c.Duration, c.Deadline)
	}
	var (
		st    FleetStats
		calls sync.WaitGroup
		ok    atomic.Int64
		bad   atomic.Int64
		sent  atomic.Int64
	)
	// Each client sends at offset + k·Every for every such time before
	// Duration: a fixed schedule, so the offered load does not depend on
	// how busy the machine is (a late request is sent late, not dropped).
	start := time.Now()
	var clients sync.WaitGroup
	for i := range c.Clients {
		offset := time.Duration(int64(c.Every) * int64(i) / int64(c.Clients))
		if offset >= c.Duration {
			continue
		}
		n := int((c.Duration-offset-1)/c.Every) + 1
		clients.Add(1)
		go func() {
			defer clients.Done()
			t := time.NewTimer(time.Until(start.Add(offset)))
			defer t.Stop()
			for k := range n {
				select {
				case <-ctx.Done():
					return
				case <-t.C:
				}
				sent.Add(1)
				calls.Add(1)
				go func() {
					defer calls.Done()
					cctx, cancel := ctx, context.CancelFunc(func() {})
					if c.Deadline > 0 {
						cctx, cancel = context.WithTimeout(ctx, c.Deadline)
					}
					defer cancel()
					if call(cctx) == nil {
						ok.Add(1)
					} else {
						bad.Add(1)
					}
				}()
				t.Reset(time.Until(start.Add(offset + time.Duration(k+1)*c.Every)))
			}
		}()
	}
	clients.Wait()
	calls.Wait()
	st.Offered, st.Succeeded, st.Failed = sent.Load(), ok.Load(), bad.Load()
	return st, ctx.Err()
}

// Get returns a [Call] that sends GET url with client and succeeds on a
// 2xx answer. It reads and closes the body.
func Get(client *http.Client, url string) Call {
	return func(ctx context.Context) error {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return err
		}
		resp, err := client.Do(req)
		if err != nil {
			return err
		}
		io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
		resp.Body.Close()
		if resp.StatusCode/100 != 2 {
			return fmt.Errorf("live: GET %s: %s", url, resp.Status)
		}
		return nil
	}
}

// Result is one client's run against one provider.
type Result struct {
	// Name labels the client under test.
	Name     string         `json:"name"`
	Provider ProviderConfig `json:"provider"`
	Fleet    FleetConfig    `json:"fleet"`
	// Stats counts logical requests as the clients saw them.
	Stats FleetStats `json:"stats"`
	// Windows is what the provider saw, per window.
	Windows []Window `json:"windows"`
	// Summary is derived from Windows and Stats.
	Summary Summary `json:"summary"`
}

// Summary condenses a run.
type Summary struct {
	// Attempts is every attempt the provider saw.
	Attempts int64 `json:"attempts"`
	// OutageAttempts is the attempts that arrived during the outage.
	OutageAttempts int64 `json:"outage_attempts"`
	// OutageOffered is the logical requests the fleet offered during the
	// outage (its steady rate times the outage's length).
	OutageOffered float64 `json:"outage_offered"`
	// OutageAmplification is OutageAttempts / OutageOffered.
	OutageAmplification float64 `json:"outage_amplification"`
	// Amplification is Attempts / Stats.Offered over the whole run.
	Amplification float64 `json:"amplification"`
	// Peak is the most attempts in one window, at PeakAt.
	Peak   int64         `json:"peak"`
	PeakAt time.Duration `json:"peak_at_ns"`
	// Goodput is Stats.Succeeded / Stats.Offered.
	Goodput float64 `json:"goodput"`
}

// Run starts a provider on loopback, runs the fleet through the calls that
// newCall makes (one per client, each given the provider's URL), and returns
// what the provider saw. It takes about Fleet.Duration plus the longest
// call's tail.
func Run(ctx context.Context, name string, pc ProviderConfig, fc FleetConfig, newCall func(url string, client int) Call) (*Result, error) {
	p, err := NewProvider(pc)
	if err != nil {
		return nil, err
	}
	url, stop, err := p.Listen()
	if err != nil {
		return nil, err
	}
	defer stop()
	calls := make([]Call, fc.Clients)
	for i := range calls {
		calls[i] = newCall(url, i)
	}
	var next atomic.Int64
	perClient := func(ctx context.Context) error {
		// Round-robin over the clients' calls: each client's requests are
		// spread evenly, as RunFleet sends them in turn.
		return calls[int(next.Add(1)-1)%len(calls)](ctx)
	}
	p.Start()
	st, err := RunFleet(ctx, fc, perClient)
	if err != nil {
		return nil, err
	}
	r := &Result{Name: name, Provider: pc, Fleet: fc, Stats: st, Windows: p.Windows()}
	r.Summary = summarize(r)
	return r, nil
}

func summarize(r *Result) Summary {
	var s Summary
	pc := r.Provider
	for _, w := range r.Windows {
		s.Attempts += w.Attempts
		if w.Start >= pc.FailAt && w.Start < pc.FailAt+pc.FailFor {
			s.OutageAttempts += w.Attempts
		}
		if w.Attempts > s.Peak {
			s.Peak, s.PeakAt = w.Attempts, w.Start
		}
	}
	rate := float64(r.Fleet.Clients) / r.Fleet.Every.Seconds()
	s.OutageOffered = rate * min(pc.FailFor, max(0, r.Fleet.Duration-pc.FailAt)).Seconds()
	if s.OutageOffered > 0 {
		s.OutageAmplification = float64(s.OutageAttempts) / s.OutageOffered
	}
	if r.Stats.Offered > 0 {
		s.Amplification = float64(s.Attempts) / float64(r.Stats.Offered)
		s.Goodput = float64(r.Stats.Succeeded) / float64(r.Stats.Offered)
	}
	return s
}

// Naive returns the [Call] of a hand-rolled retry loop as many real clients
// have it: GET url, and on any failure wait exactly every and try again, up
// to attempts tries in all, ignoring Retry-After. It is the thundering herd
// the demo compares against.
func Naive(client *http.Client, url string, every time.Duration, attempts int) Call {
	get := Get(client, url)
	return func(ctx context.Context) error {
		var err error
		for i := range attempts {
			if i > 0 {
				t := time.NewTimer(every)
				select {
				case <-ctx.Done():
					t.Stop()
					return errors.Join(err, ctx.Err())
				case <-t.C:
				}
			}
			if err = get(ctx); err == nil {
				return nil
			}
		}
		return err
	}
}
