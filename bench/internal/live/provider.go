package live

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync/atomic"
	"time"
)

// ProviderConfig describes a provider that is healthy, then fails every
// request with 503 for FailFor starting FailAt after [Provider.Start], then
// is healthy again; or, with Trigger, hangs or slows down for that time
// instead.
type ProviderConfig struct {
	// FailAt is when the outage (the trigger) starts, measured from Start.
	FailAt time.Duration `json:"fail_at_ns"`
	// FailFor is how long the outage (the trigger) lasts.
	FailFor time.Duration `json:"fail_for_ns"`
	// Trigger is what happens from FailAt for FailFor: [Trigger503] (the
	// zero value) answers 503 to every request; [TriggerHang] and
	// [TriggerSlow] need a Capacity and change how its workers serve.
	Trigger Trigger `json:"trigger,omitempty"`
	// SlowBy is the factor [TriggerSlow] multiplies Work by; 0 means 5.
	SlowBy float64 `json:"slow_by,omitempty"`
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
	// the handler). Zero answers at once. With a Capacity, the work of a
	// request that waited for a worker is counted from when that worker
	// became free (it sleeps until then plus Work), so that scheduler lag
	// on a loaded machine does not lower the capacity below Capacity/Work.
	Work time.Duration `json:"work_ns"`
	// Window is the width of a counting window; it must be positive.
	Window time.Duration `json:"window_ns"`
	// Horizon is how long the provider counts; attempts after it are
	// counted in the last window. It must be positive.
	Horizon time.Duration `json:"horizon_ns"`
}

// Trigger names what a provider does during its trigger (see
// ProviderConfig.Trigger).
type Trigger string

// The triggers.
const (
	// Trigger503 answers 503 to every request that arrives during it.
	Trigger503 Trigger = ""
	// TriggerHang stalls the workers: a request that gets a worker during
	// the trigger (or holds one when it starts) is served only after the
	// trigger ends, so the queue fills and then sheds.
	TriggerHang Trigger = "hang"
	// TriggerSlow multiplies the service time (Work) by SlowBy for the
	// requests that get a worker during the trigger.
	TriggerSlow Trigger = "slow"
)

// ErrInvalidConfig is wrapped by the errors this package returns for
// settings it cannot run.
var ErrInvalidConfig = errors.New("live: invalid config")

// counts are the atomic counters of one window.
type counts struct {
	attempts, ok, failed, shed, refused atomic.Int64
	served, wasted                      atomic.Int64 // by the window the work ended in
}

// Provider is an [http.Handler] that fails on a schedule and counts the
// attempts that reach it per window. It is safe for concurrent use. Build it
// with [NewProvider], optionally put middleware in front of its work with
// [Provider.Wrap], serve it (e.g. with [Provider.Listen]) and call
// [Provider.Start] when the fleet starts.
type Provider struct {
	cfg     ProviderConfig
	start   atomic.Int64 // unix nanoseconds of Start; 0 before
	inside  atomic.Int64 // requests being served or waiting
	workers chan int64   // a free worker: when its last work ended (unix ns)
	windows []counts
	inner   http.Handler // the work, behind the middleware of Wrap
	wrapped bool         // Wrap was called
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
	case c.FailAt < 0 || c.FailFor < 0 || c.RetryAfter < 0 || c.Capacity < 0 || c.Queue < 0 || c.Work < 0 || c.SlowBy < 0:
		return nil, fmt.Errorf("%w: negative setting in %+v", ErrInvalidConfig, c)
	case c.Trigger != Trigger503 && c.Trigger != TriggerHang && c.Trigger != TriggerSlow:
		return nil, fmt.Errorf("%w: trigger %q is not one of \"\" (503), %q, %q", ErrInvalidConfig, c.Trigger, TriggerHang, TriggerSlow)
	case c.Trigger != Trigger503 && c.Capacity == 0:
		return nil, fmt.Errorf("%w: trigger %q needs a positive capacity", ErrInvalidConfig, c.Trigger)
	}
	if c.SlowBy == 0 {
		c.SlowBy = 5
	}
	n := int((c.Horizon + c.Window - 1) / c.Window)
	p := &Provider{cfg: c, windows: make([]counts, n), workers: make(chan int64, max(c.Capacity, 1))}
	for range c.Capacity {
		p.workers <- 0
	}
	return p, nil
}

// Config returns the configuration p was built from.
func (p *Provider) Config() ProviderConfig { return p.cfg }

// Wrap puts middleware in front of the provider's work (admission control,
// say): every attempt is still counted when it arrives, and one that the
// middleware answers without passing it on is counted as refused. Call it
// before serving; wrap(next) must call next at most once per request, on
// the request's goroutine.
func (p *Provider) Wrap(wrap func(next http.Handler) http.Handler) {
	p.inner, p.wrapped = wrap(http.HandlerFunc(p.work)), true
}

// Start starts the provider's clock: windows and the outage are measured
// from now. Requests before Start are served healthy and counted in window 0.
func (p *Provider) Start() { p.startAt(time.Now()) }

func (p *Provider) startAt(t time.Time) { p.start.Store(t.UnixNano()) }

// since returns the time since Start (0 before it).
func (p *Provider) since() time.Duration {
	s := p.start.Load()
	if s == 0 {
		return 0
	}
	return time.Duration(time.Now().UnixNano() - s)
}

// Failing reports whether the outage (503) is on at time t since Start:
// false at any time for the other triggers.
func (p *Provider) Failing(t time.Duration) bool {
	return p.cfg.Trigger == Trigger503 && p.triggered(t)
}

// triggered reports whether the trigger is on at time t since Start.
func (p *Provider) triggered(t time.Duration) bool {
	return t >= p.cfg.FailAt && t < p.cfg.FailAt+p.cfg.FailFor
}

// reachedKey is the context key of the flag the work sets for the front
// door: the attempt got past the middleware.
type reachedKey struct{}

// window returns the counters of the window holding t.
func (p *Provider) window(t time.Duration) *counts {
	return &p.windows[max(0, min(int(t/p.cfg.Window), len(p.windows)-1))]
}

// ServeHTTP answers one attempt: 503 during the outage or when over
// capacity, else 200 after Work; behind the middleware of [Provider.Wrap],
// if any.
func (p *Provider) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	t := p.since()
	win := p.window(t)
	win.attempts.Add(1)
	if !p.wrapped {
		p.serve(w, r, t, win) // no middleware: nothing can refuse it
		return
	}
	reached := new(bool)
	p.inner.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), reachedKey{}, reached)))
	if !*reached {
		win.refused.Add(1)
	}
}

// work is the provider proper behind middleware: it counts in the window
// the attempt reaches it in.
func (p *Provider) work(w http.ResponseWriter, r *http.Request) {
	if reached, ok := r.Context().Value(reachedKey{}).(*bool); ok {
		*reached = true
	}
	t := p.since()
	p.serve(w, r, t, p.window(t))
}

// serve answers an attempt that reached the provider at t, counting its
// outcome in win.
func (p *Provider) serve(w http.ResponseWriter, r *http.Request, t time.Duration, win *counts) {
	// Drain what the client sent so the connection can be reused.
	io.Copy(io.Discard, io.LimitReader(r.Body, 1<<20))
	if p.Failing(t) {
		win.failed.Add(1)
		if ra := p.cfg.RetryAfter; ra > 0 {
			w.Header().Set("Retry-After", strconv.FormatInt(int64((ra+time.Second-1)/time.Second), 10))
		}
		http.Error(w, "provider unavailable", http.StatusServiceUnavailable)
		return
	}
	begin := time.Now()
	if c := p.cfg.Capacity; c > 0 {
		if p.inside.Add(1) > int64(c+p.cfg.Queue) {
			p.inside.Add(-1)
			win.shed.Add(1)
			http.Error(w, "provider over capacity", http.StatusServiceUnavailable)
			return
		}
		// Wait for a worker, whether or not the client is still there.
		free := time.Unix(0, <-p.workers)
		var end time.Time
		defer func() {
			p.workers <- end.UnixNano()
			p.inside.Add(-1)
		}()
		// The work starts when the request arrived or when the worker
		// became free, whichever is later: not when the machine's
		// scheduler got round to it, so that the capacity is Capacity/Work
		// on a loaded machine too.
		if free.After(begin) {
			begin = free
		}
		end = p.serveFrom(begin)
	} else {
		p.serveFrom(begin)
	}
	win.ok.Add(1)
	done := p.window(p.since())
	done.served.Add(1)
	if r.Context().Err() != nil {
		done.wasted.Add(1) // the caller's attempt ended before its answer
	}
	io.WriteString(w, "ok\n")
}

// serveFrom does the work of a request that got its worker at begin: it
// sleeps until begin plus the service time (stalled by a hang) and returns
// when the work ended.
func (p *Provider) serveFrom(begin time.Time) time.Time {
	if p.stall() {
		begin = time.Now()
	}
	end := begin.Add(p.workFor(p.at(begin)))
	time.Sleep(time.Until(end))
	if p.stall() { // a worker busy when a hang began stalls too
		end = time.Now()
	}
	return end
}

// at returns the time since Start of t (0 before Start).
func (p *Provider) at(t time.Time) time.Duration {
	s := p.start.Load()
	if s == 0 {
		return 0
	}
	return time.Duration(t.UnixNano() - s)
}

// stall sleeps until the end of a hang, if one is on, and reports whether
// it did.
func (p *Provider) stall() bool {
	if p.cfg.Trigger != TriggerHang {
		return false
	}
	if t := p.since(); p.triggered(t) {
		time.Sleep(p.cfg.FailAt + p.cfg.FailFor - t)
		return true
	}
	return false
}

// workFor is the service time of a request that gets a worker at t.
func (p *Provider) workFor(t time.Duration) time.Duration {
	if p.cfg.Trigger == TriggerSlow && p.triggered(t) {
		return time.Duration(float64(p.cfg.Work) * p.cfg.SlowBy)
	}
	return p.cfg.Work
}

// Window is what the provider saw in one window.
type Window struct {
	// Start is the window's start since [Provider.Start].
	Start time.Duration `json:"start_ns"`
	// Attempts is every request that reached the provider.
	Attempts int64 `json:"attempts"`
	// OK were served, Failed got the outage's 503, Shed got the
	// over-capacity 503 (counted in the window they reached the work in),
	// Refused were answered by the middleware in front of the work (see
	// [Provider.Wrap]; counted in the window they arrived in).
	OK      int64 `json:"ok"`
	Failed  int64 `json:"failed"`
	Shed    int64 `json:"shed"`
	Refused int64 `json:"refused,omitempty"`
	// Served is the requests whose work ended in this window (OK counted
	// by when the work ended), Wasted those of them whose caller's attempt
	// had already ended (timed out, cancelled, connection closed): work
	// done for nobody.
	Served int64 `json:"served,omitempty"`
	Wasted int64 `json:"wasted,omitempty"`
}

// Windows returns the counts so far, one entry per window of the horizon.
func (p *Provider) Windows() []Window {
	out := make([]Window, len(p.windows))
	for i := range p.windows {
		c := &p.windows[i]
		out[i] = Window{
			Start:    time.Duration(i) * p.cfg.Window,
			Attempts: c.attempts.Load(), OK: c.ok.Load(), Failed: c.failed.Load(), Shed: c.shed.Load(), Refused: c.refused.Load(),
			Served: c.served.Load(), Wasted: c.wasted.Load(),
		}
	}
	return out
}

// StopGrace is how long the stop function of [Provider.Listen] waits for
// the requests in progress (work for callers who left included) before it
// closes their connections.
const StopGrace = 2 * time.Second

// Listen serves p on a new loopback listener (127.0.0.1, a free port) and
// returns its base URL and a function that stops the server, waiting at
// most StopGrace for the requests in progress.
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
		ctx, cancel := context.WithTimeout(context.Background(), StopGrace)
		defer cancel()
		if srv.Shutdown(ctx) != nil {
			srv.Close()
		}
		<-done
	}
	return "http://" + ln.Addr().String(), stop, nil
}
