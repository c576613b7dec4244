// Package live runs a retry storm for real, on loopback: a [Provider] is an
// HTTP server that fails for a while and counts, per window, every attempt
// that reaches it; a fleet ([RunFleet]) is many goroutine clients sending a
// steady load through whatever HTTP client is under test, and records when
// each of its calls started, how long it took and whether it succeeded.
//
// It is what `stormguard demo` and the peer comparisons in the bench module
// (the outage of [Run], the POS scenario of [RunScenario] with [Payment]
// calls) are built on. It measures load at the server, so a client cannot
// under-report its own retries, and success at the client. Runs take real
// time (seconds); tests of this package only check its accounting, never
// its timing.
package live

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math"
	mrand "math/rand/v2"
	"net"
	"net/http"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
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
	attempts, ok, failed, shed, refused atomic.Int64
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
	workers chan struct{}
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
	case c.FailAt < 0 || c.FailFor < 0 || c.RetryAfter < 0 || c.Capacity < 0 || c.Queue < 0 || c.Work < 0:
		return nil, fmt.Errorf("%w: negative setting in %+v", ErrInvalidConfig, c)
	}
	n := int((c.Horizon + c.Window - 1) / c.Window)
	p := &Provider{cfg: c, windows: make([]counts, n), workers: make(chan struct{}, max(c.Capacity, 1))}
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

// Failing reports whether the outage is on at time t since Start.
func (p *Provider) Failing(t time.Duration) bool {
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
	// over-capacity 503 (counted in the window they reached the work in),
	// Refused were answered by the middleware in front of the work (see
	// [Provider.Wrap]; counted in the window they arrived in).
	OK      int64 `json:"ok"`
	Failed  int64 `json:"failed"`
	Shed    int64 `json:"shed"`
	Refused int64 `json:"refused,omitempty"`
}

// Windows returns the counts so far, one entry per window of the horizon.
func (p *Provider) Windows() []Window {
	out := make([]Window, len(p.windows))
	for i := range p.windows {
		c := &p.windows[i]
		out[i] = Window{
			Start:    time.Duration(i) * p.cfg.Window,
			Attempts: c.attempts.Load(), OK: c.ok.Load(), Failed: c.failed.Load(), Shed: c.shed.Load(), Refused: c.refused.Load(),
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
	// be positive. Clients start evenly spread over the first interval,
	// or at random points of it with RandomPhase.
	Every time.Duration `json:"every_ns"`
	// Duration is how long clients keep sending new requests; it must be
	// positive. RunFleet returns when the last request has finished.
	Duration time.Duration `json:"duration_ns"`
	// Deadline bounds each logical request, retries included (a context
	// deadline). Zero means none.
	Deadline time.Duration `json:"deadline_ns"`
	// RandomPhase starts each client at a point of [0, Every) drawn
	// uniformly from a generator seeded with Seed (math/rand/v2 PCG), as
	// independent terminals would, instead of spreading them evenly.
	RandomPhase bool   `json:"random_phase,omitempty"`
	Seed        uint64 `json:"seed,omitempty"`
}

// FleetStats counts the fleet's logical requests.
type FleetStats struct {
	// Offered is the number of logical requests started.
	Offered int64 `json:"offered"`
	// Succeeded ended with a nil error.
	Succeeded int64 `json:"succeeded"`
	// Failed ended with an error (or a panic).
	Failed int64 `json:"failed"`
	// Panics counts the calls that panicked (the client under test has a
	// bug); Panic is the first panic's value and stack. A panicking call
	// counts as failed, and the run goes on.
	Panics int64  `json:"panics,omitempty"`
	Panic  string `json:"panic,omitempty"`
	// Calls records every logical request, in no particular order (not
	// part of the JSON form).
	Calls []CallRecord `json:"-"`
}

// CallRecord is one logical request of a fleet.
type CallRecord struct {
	// Start is when the call was made, since the fleet started.
	Start time.Duration
	// Took is how long it ran, retries and waits included.
	Took time.Duration
	// Late is how much later than scheduled the call was made: the
	// fleet's own lag (a busy machine), which its figures cannot hide.
	Late time.Duration
	// OK reports whether it succeeded.
	OK bool
}

// Call performs one logical request (with whatever retries the client under
// test makes) and reports whether it succeeded.
type Call func(ctx context.Context) error

// RunFleet runs the fleet: every client calls call once per Every, each call
// in its own goroutine so that slow retry loops overlap as they do in real
// clients. Client i starts at i·Every/Clients (or at a random phase, see
// FleetConfig.RandomPhase) and sends at fixed times: the number of calls
// offered is exactly the number of scheduled times before Duration. It
// returns when every call has returned; ctx cancels the run.
func RunFleet(ctx context.Context, c FleetConfig, call Call) (FleetStats, error) {
	return runFleet(ctx, c, call, time.Now())
}

// offsets returns each client's first send time.
func (c FleetConfig) offsets() []time.Duration {
	out := make([]time.Duration, c.Clients)
	var rng *mrand.Rand
	if c.RandomPhase {
		rng = mrand.New(mrand.NewPCG(c.Seed, 0x5eed))
	}
	for i := range out {
		if rng != nil {
			out[i] = time.Duration(rng.Int64N(int64(c.Every)))
		} else {
			out[i] = time.Duration(int64(c.Every) * int64(i) / int64(c.Clients))
		}
	}
	return out
}

func runFleet(ctx context.Context, c FleetConfig, call Call, start time.Time) (FleetStats, error) {
	switch {
	case c.Clients <= 0:
		return FleetStats{}, fmt.Errorf("%w: clients %d must be positive", ErrInvalidConfig, c.Clients)
	case c.Every <= 0 || c.Duration <= 0 || c.Deadline < 0:
		return FleetStats{}, fmt.Errorf("%w: every %v and duration %v must be positive, deadline %v not negative",
			ErrInvalidConfig, c.Every, c.Duration, c.Deadline)
	}
	// Each client sends at offset + k·Every for every such time before
	// Duration: a fixed schedule, so the offered load does not depend on
	// how busy the machine is (a late request is sent late, not dropped).
	offsets := c.offsets()
	total := 0
	for _, offset := range offsets {
		if offset < c.Duration {
			total += int((c.Duration-offset-1)/c.Every) + 1
		}
	}
	var (
		calls      sync.WaitGroup
		clients    sync.WaitGroup
		ok, bad    atomic.Int64
		sent       atomic.Int64
		records    = make([]CallRecord, total)
		firstPanic panicLog
	)
	for _, offset := range offsets {
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
				rec := &records[sent.Add(1)-1]
				scheduled := start.Add(offset + time.Duration(k)*c.Every)
				calls.Add(1)
				go func() {
					defer calls.Done()
					cctx, cancel := ctx, context.CancelFunc(func() {})
					if c.Deadline > 0 {
						cctx, cancel = context.WithTimeout(ctx, c.Deadline)
					}
					defer cancel()
					began := time.Now()
					err := guard(cctx, call, &firstPanic)
					*rec = CallRecord{Start: began.Sub(start), Took: time.Since(began), Late: began.Sub(scheduled), OK: err == nil}
					if err == nil {
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
	st := FleetStats{Offered: sent.Load(), Succeeded: ok.Load(), Failed: bad.Load(), Calls: records[:sent.Load()]}
	st.Panics, st.Panic = firstPanic.n.Load(), firstPanic.first
	return st, ctx.Err()
}

// panicLog counts the calls that panicked and keeps the first panic.
type panicLog struct {
	n     atomic.Int64
	once  sync.Once
	first string
}

// errPanicked is what a call that panicked returns.
var errPanicked = errors.New("live: the call panicked")

// guard runs call, turning a panic into errPanicked logged in log.
func guard(ctx context.Context, call Call, log *panicLog) (err error) {
	defer func() {
		if v := recover(); v != nil {
			log.n.Add(1)
			log.once.Do(func() { log.first = fmt.Sprintf("%v\n%s", v, debug.Stack()) })
			err = errPanicked
		}
	}()
	return call(ctx)
}

// Get returns a [Call] that sends GET url with client and succeeds on a
// 2xx answer. It reads and closes the body.
func Get(client *http.Client, url string) Call {
	return func(ctx context.Context) error {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return err
		}
		return Do(client, req)
	}
}

// Do sends req with client and returns nil for a 2xx answer, an error
// otherwise. It reads (up to 1 MiB) and closes the body.
func Do(client *http.Client, req *http.Request) error {
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
	resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return &StatusError{Method: req.Method, URL: req.URL.String(), Code: resp.StatusCode,
			RetryAfter: resp.Header.Get("Retry-After"), Header: resp.Header.Clone()}
	}
	return nil
}

// StatusError is a non-2xx answer to a [Call]'s request.
type StatusError struct {
	Method, URL string
	// Code is the status code; RetryAfter the Retry-After header, if any.
	Code       int
	RetryAfter string
	// Header is the response's header (a copy), for what a client under
	// test wrote into it.
	Header http.Header
}

func (e *StatusError) Error() string {
	return fmt.Sprintf("live: %s %s: %d %s", e.Method, e.URL, e.Code, http.StatusText(e.Code))
}

// Counter is an [http.RoundTripper] that counts the requests it passes on
// to Base (nil: http.DefaultTransport): the attempts a client sent, to set
// against what the provider counted. It is safe for concurrent use.
type Counter struct {
	Base http.RoundTripper
	n    atomic.Int64
}

// RoundTrip counts r and sends it through Base.
func (c *Counter) RoundTrip(r *http.Request) (*http.Response, error) {
	c.n.Add(1)
	base := c.Base
	if base == nil {
		base = http.DefaultTransport
	}
	return base.RoundTrip(r)
}

// N returns the number of requests counted.
func (c *Counter) N() int64 { return c.n.Load() }

// PaymentBody is what a payment request sends.
const PaymentBody = `{"amount":1250,"currency":"IDR"}`

// NewPayment returns a payment: a POST of [PaymentBody] to url with
// Idempotency-Key key, whose body can be sent again (GetBody is set).
func NewPayment(ctx context.Context, url, key string) (*http.Request, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(PaymentBody))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", key)
	return req, nil
}

// Keys makes idempotency keys that are unique across runs: a random
// prefix and a counter. It is safe for concurrent use; the zero value is
// not usable (use [NewKeys]).
type Keys struct {
	prefix string
	n      atomic.Uint64
}

// NewKeys returns a new key source.
func NewKeys() *Keys {
	var b [8]byte
	rand.Read(b[:])
	return &Keys{prefix: hex.EncodeToString(b[:]) + "-"}
}

// Next returns a key not returned before.
func (k *Keys) Next() string { return k.prefix + strconv.FormatUint(k.n.Add(1), 10) }

// Payment returns a [Call] that makes one payment through client (whose
// transport does whatever retrying it does): a new key from keys, one
// client.Do of [NewPayment].
func Payment(client *http.Client, url string, keys *Keys) Call {
	return func(ctx context.Context) error {
		req, err := NewPayment(ctx, url, keys.Next())
		if err != nil {
			return err
		}
		return Do(client, req)
	}
}

// Loop returns a [Call] of a hand-rolled retry loop as many real clients
// have it: for each call, begin(ctx) returns the call's attempt (so that
// every attempt of one call can share state, such as an idempotency key);
// it runs, and on any failure the loop waits exactly every and runs it
// again, ignoring Retry-After, up to attempts tries in all (0: until ctx
// ends).
func Loop(begin func() func(ctx context.Context) error, every time.Duration, attempts int) Call {
	return func(ctx context.Context) error {
		attempt := begin()
		var err error
		for i := 0; attempts <= 0 || i < attempts; i++ {
			if i > 0 {
				t := time.NewTimer(every)
				select {
				case <-ctx.Done():
					t.Stop()
					return errors.Join(err, ctx.Err())
				case <-t.C:
				}
			}
			if err = attempt(ctx); err == nil {
				return nil
			}
			if ctx.Err() != nil {
				// The call ended during the attempt (or as the wait ended,
				// when the timer and the end come together): say so, with
				// what the attempt said.
				return errors.Join(err, ctx.Err())
			}
		}
		return err
	}
}

// Naive returns the [Call] of a hand-rolled retry loop as many real clients
// have it: GET url, and on any failure wait exactly every and try again, up
// to attempts tries in all, ignoring Retry-After. It is the thundering herd
// the demo compares against.
func Naive(client *http.Client, url string, every time.Duration, attempts int) Call {
	get := Get(client, url)
	return Loop(func() func(context.Context) error { return get }, every, attempts)
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
	// Failures counts the failed calls by cause, if the scenario
	// classified them (Scenario.Classify); calls that panicked are
	// counted in Stats only.
	Failures map[string]int64 `json:"failures,omitempty"`
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
	// OutageStarted is the logical requests started during the outage,
	// OutageSucceeded those of them that succeeded (during it or after),
	// OutageGoodput their ratio.
	OutageStarted   int64   `json:"outage_started"`
	OutageSucceeded int64   `json:"outage_succeeded"`
	OutageGoodput   float64 `json:"outage_goodput"`
	// P50 and P99 are the median and 99th percentile of the time the
	// successful logical requests took (0 if none succeeded).
	P50 time.Duration `json:"p50_ns"`
	P99 time.Duration `json:"p99_ns"`
	// LateP99 and LateMax are the 99th percentile and the maximum of how
	// late the fleet made its calls (CallRecord.Late): on a busy machine
	// the load the fleet offers is not the load it meant to.
	LateP99 time.Duration `json:"late_p99_ns"`
	LateMax time.Duration `json:"late_max_ns"`
	// ShedAfter is the attempts the provider shed (or its middleware
	// refused) from the end of the outage on.
	ShedAfter int64 `json:"shed_after"`
	// Normal reports whether the provider got back to normal after the
	// outage, and NormalAfter how long after its end: from then until
	// the fleet stopped sending, every second (in steps of one window) it
	// failed, shed and refused nothing and got at most 10% (and one) more
	// attempts than the fleet scheduled calls in that second.
	Normal      bool          `json:"normal"`
	NormalAfter time.Duration `json:"normal_after_ns"`
}

// Scenario is one run of [RunScenario]: a client under test, a provider
// and a fleet.
type Scenario struct {
	// Name labels the client under test.
	Name     string
	Provider ProviderConfig
	Fleet    FleetConfig
	// NewCall returns the call of client i, given the provider's URL; it
	// is called once per client before the run.
	NewCall func(url string, client int) Call
	// Wrap, if not nil, is put in front of the provider's work (see
	// [Provider.Wrap]).
	Wrap func(next http.Handler) http.Handler
	// Classify, if not nil, names the cause of each failed call's error
	// (e.g. the reason its retry loop gave up); Result.Failures counts
	// the failures by name. It must be safe for concurrent use.
	Classify func(err error) string
	// Started, if not nil, is called once the provider's clock has started
	// (at start), before the fleet's first call: to watch the run as it
	// happens, e.g. with [Provider.Windows], which may be read at any time
	// from any goroutine.
	Started func(p *Provider, start time.Time)
}

// Run starts a provider on loopback, runs the fleet through the calls that
// newCall makes (one per client, each given the provider's URL), and returns
// what the provider saw. It takes about Fleet.Duration plus the longest
// call's tail.
func Run(ctx context.Context, name string, pc ProviderConfig, fc FleetConfig, newCall func(url string, client int) Call) (*Result, error) {
	return RunScenario(ctx, Scenario{Name: name, Provider: pc, Fleet: fc, NewCall: newCall})
}

// RunScenario is [Run] with middleware at the provider, if s.Wrap is set.
// The provider's clock and the fleet's start at the same instant; the
// provider is shut down (finishing what it holds, for up to 2 s) before its
// windows are read.
func RunScenario(ctx context.Context, s Scenario) (*Result, error) {
	p, err := NewProvider(s.Provider)
	if err != nil {
		return nil, err
	}
	if s.Wrap != nil {
		p.Wrap(s.Wrap)
	}
	url, stop, err := p.Listen()
	if err != nil {
		return nil, err
	}
	stopped := false
	defer func() {
		if !stopped {
			stop()
		}
	}()
	calls := make([]Call, s.Fleet.Clients)
	for i := range calls {
		calls[i] = s.NewCall(url, i)
	}
	var next atomic.Int64
	var (
		mu       sync.Mutex
		failures map[string]int64
	)
	perClient := func(ctx context.Context) error {
		// Round-robin over the clients' calls: each client's requests are
		// spread evenly, as RunFleet sends them in turn.
		err := calls[int(next.Add(1)-1)%len(calls)](ctx)
		if err != nil && s.Classify != nil {
			why := s.Classify(err)
			mu.Lock()
			if failures == nil {
				failures = make(map[string]int64)
			}
			failures[why]++
			mu.Unlock()
		}
		return err
	}
	start := time.Now()
	p.startAt(start)
	if s.Started != nil {
		s.Started(p, start)
	}
	st, err := runFleet(ctx, s.Fleet, perClient, start)
	if err != nil {
		return nil, err
	}
	// A call that gave up at its deadline may have left its attempt in
	// the provider's queue: let the provider finish, so that every
	// attempt it counted has its outcome.
	stop()
	stopped = true
	r := &Result{Name: s.Name, Provider: s.Provider, Fleet: s.Fleet, Stats: st, Windows: p.Windows(), Failures: failures}
	r.Summary = summarize(r)
	return r, nil
}

func summarize(r *Result) Summary {
	var s Summary
	pc, fc := r.Provider, r.Fleet
	end := pc.FailAt + pc.FailFor
	for _, w := range r.Windows {
		s.Attempts += w.Attempts
		if w.Start >= pc.FailAt && w.Start < end {
			s.OutageAttempts += w.Attempts
		}
		if w.Start >= end {
			s.ShedAfter += w.Shed + w.Refused
		}
		if w.Attempts > s.Peak {
			s.Peak, s.PeakAt = w.Attempts, w.Start
		}
	}
	rate := float64(fc.Clients) / fc.Every.Seconds()
	s.OutageOffered = rate * min(pc.FailFor, max(0, fc.Duration-pc.FailAt)).Seconds()
	if s.OutageOffered > 0 {
		s.OutageAmplification = float64(s.OutageAttempts) / s.OutageOffered
	}
	if r.Stats.Offered > 0 {
		s.Amplification = float64(s.Attempts) / float64(r.Stats.Offered)
		s.Goodput = float64(r.Stats.Succeeded) / float64(r.Stats.Offered)
	}
	var took []time.Duration
	late := make([]time.Duration, 0, len(r.Stats.Calls))
	for _, c := range r.Stats.Calls {
		late = append(late, c.Late)
		during := c.Start >= pc.FailAt && c.Start < end
		if during {
			s.OutageStarted++
		}
		if c.OK {
			took = append(took, c.Took)
			if during {
				s.OutageSucceeded++
			}
		}
	}
	if s.OutageStarted > 0 {
		s.OutageGoodput = float64(s.OutageSucceeded) / float64(s.OutageStarted)
	}
	s.P50, s.P99 = Percentile(took, 0.5), Percentile(took, 0.99)
	s.LateP99, s.LateMax = Percentile(late, 0.99), Percentile(late, 1)
	offered := make([]int64, len(r.Windows))
	for _, c := range r.Stats.Calls {
		if i := int((c.Start - c.Late) / pc.Window); i >= 0 && i < len(offered) {
			offered[i]++
		}
	}
	s.NormalAfter, s.Normal = backToNormal(r.Windows, offered, pc.Window, end, fc.Duration)
	return s
}

// backToNormal returns how long after end the provider got back to normal
// for good, and whether it did before stop: the first window start t >= end
// such that every span of one second starting at a window start in [t,
// stop-1s] holds no failed, shed or refused attempt, and at most 10% (and
// one) more attempts than the fleet's calls scheduled in it (offered[i]:
// the calls scheduled in window i).
func backToNormal(ws []Window, offered []int64, window, end, stop time.Duration) (time.Duration, bool) {
	span := int(max(time.Second/window, 1))
	first := int((end + window - 1) / window)
	last := min(int(stop/window), len(ws), len(offered)) - span // the last span's first window
	normal := -1
	for i := last; i >= first; i-- {
		var n, bad, calls int64
		for k := i; k < i+span; k++ {
			n += ws[k].Attempts
			bad += ws[k].Failed + ws[k].Shed + ws[k].Refused
			calls += offered[k]
		}
		if bad > 0 || float64(n) > 1.1*float64(calls)+1 {
			break
		}
		normal = i
	}
	if normal < 0 {
		return 0, false
	}
	return time.Duration(normal)*window - end, true
}

// Percentile returns the q-quantile (0 < q <= 1, nearest rank) of xs, which
// it sorts; 0 if xs is empty.
func Percentile(xs []time.Duration, q float64) time.Duration {
	if len(xs) == 0 {
		return 0
	}
	slices.Sort(xs)
	i := int(math.Ceil(q*float64(len(xs)))) - 1
	return xs[min(max(i, 0), len(xs)-1)]
}
