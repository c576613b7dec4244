package bench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	avast "github.com/avast/retry-go/v4"
	cenkalti "github.com/cenkalti/backoff/v5"
	"github.com/failsafe-go/failsafe-go/adaptivelimiter"
	"github.com/failsafe-go/failsafe-go/adaptivethrottler"
	"github.com/failsafe-go/failsafe-go/failsafehttp"
	"github.com/failsafe-go/failsafe-go/retrypolicy"
	"github.com/failsafe-go/failsafe-go/timeout"
	"github.com/hashicorp/go-retryablehttp"

	"github.com/stormguard/stormguard/admission"
	"github.com/stormguard/stormguard/bench/internal/live"
	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/httpretry"
	"github.com/stormguard/stormguard/limit"
	"github.com/stormguard/stormguard/retry"
	"github.com/stormguard/stormguard/wire"
)

// The POS scenario: 1000 payment terminals, each making one payment (a POST
// with an Idempotency-Key) every 2 s at a random phase, every payment with a
// 20 s deadline, against a payment provider of finite capacity (30 workers
// x 20 ms of work = 1500 payments per second, a queue of 1500, 503 beyond)
// that answers 503 to everything for 10 s in the middle of a 40 s run:
// once without Retry-After, once with Retry-After: 2. Each row is one
// retry setup, built the way its documentation shows, one client object
// per terminal (as separate devices would have) over one shared
// *http.Transport per run; load and sheds are counted at the provider,
// success and latency at the terminals.
//
// TestLivePOS takes real time (about 15 minutes) and runs only when
// STORMGUARD_LIVE_POS=1 is set. TestLivePOSSmoke, always on, runs every
// setup through a tiny version of the scenario and checks the accounting
// only: every payment recorded, every attempt a client sent counted by the
// provider with an outcome, and a retry seen (so no row measures a
// pass-through).

// posSetup is one retry setup of the POS scenario.
type posSetup struct {
	name string
	// how says how the library is set up, for the report.
	how string
	// prepare is called once per run with the run's shared base transport
	// and the provider's URL; it returns the call of terminal i, and what
	// to do after the run (nil: nothing), which may return a note for the
	// report.
	prepare func(base http.RoundTripper, url string) (call func(terminal int) live.Call, done func() string)
	// admission, if true, puts an admission controller in front of the
	// provider's work.
	admission bool
	// stormguard marks the rows the targets are about.
	stormguard bool
}

// posStormguardOptions are stormguard's options in every stormguard row: the
// library defaults except the breaker's window, 2 s instead of 10 s, so
// that a total outage trips it within about a second instead of after
// about five (a window of 50% failures needs the successes of the last
// window outnumbered). Payments carry the 20 s deadline in their context,
// which lets a call wait behind the open breaker.
func posStormguardOptions() []httpretry.Option {
	return []httpretry.Option{httpretry.WithBreaker(&breaker.Config{Window: 2 * time.Second})}
}

// POS provider and fleet.
const (
	posTerminals = 1000
	posEvery     = 2 * time.Second
	posDeadline  = 20 * time.Second
	posDuration  = 40 * time.Second
	posFailAt    = 15 * time.Second
	posFailFor   = 10 * time.Second
	posWorkers   = 30
	posWork      = 20 * time.Millisecond
	posQueue     = 1500
)

// posScenario returns the provider and the fleet of the POS scenario, with
// the provider sending Retry-After retryAfter during the outage (0: none)
// and holding queue requests in its queue (posQueue is the scenario's),
// scaled by scale: the terminals, the provider's workers and its queue
// (1 is the scenario itself; 0.1 has the same shape with a tenth of the
// load, for a machine that cannot run a thousand terminals on time).
func posScenario(retryAfter time.Duration, queue int, scale float64) (live.ProviderConfig, live.FleetConfig) {
	scaled := func(n int) int { return max(int(math.Round(float64(n)*scale)), 1) }
	fc := live.FleetConfig{Clients: scaled(posTerminals), Every: posEvery, Duration: posDuration, Deadline: posDeadline, RandomPhase: true, Seed: 42}
	pc := live.ProviderConfig{
		FailAt: posFailAt, FailFor: posFailFor, RetryAfter: retryAfter,
		Capacity: scaled(posWorkers), Queue: scaled(queue), Work: posWork,
		Window: 100 * time.Millisecond, Horizon: fc.Duration + fc.Deadline + 5*time.Second,
	}
	return pc, fc
}

// posAdmission returns the provider's admission controller: the package's
// defaults (10% retries plus 1 per second over 10 s, a 500 ms queue wait,
// Retry-After 1 s + up to 10 s when refusing) with the work in progress
// limited to the provider's workers and the queue to its queue.
func posAdmission(pc live.ProviderConfig) (func(http.Handler) http.Handler, error) {
	ctl, err := admission.New(admission.Config{MaxInFlight: pc.Capacity, MaxQueue: pc.Queue})
	if err != nil {
		return nil, err
	}
	return ctl.Wrap, nil
}

// posSetups lists the rows of the POS table, the naive reference first.
func posSetups() []posSetup {
	keys := live.NewKeys()
	sgOpts := posStormguardOptions()
	perTerminal := func(opts []httpretry.Option) func(http.RoundTripper, string) (func(int) live.Call, func() string) {
		return func(base http.RoundTripper, url string) (func(int) live.Call, func() string) {
			return func(int) live.Call {
				t, err := httpretry.NewTransport(base, opts...)
				if err != nil {
					return failing(err)
				}
				return live.Payment(&http.Client{Transport: t}, url, keys)
			}, nil
		}
	}
	shared := func(opts []httpretry.Option) func(http.RoundTripper, string) (func(int) live.Call, func() string) {
		return func(base http.RoundTripper, url string) (func(int) live.Call, func() string) {
			t, err := httpretry.NewTransport(base, opts...)
			client := &http.Client{Transport: t}
			return func(int) live.Call {
				if err != nil {
					return failing(err)
				}
				return live.Payment(client, url, keys)
			}, nil
		}
	}
	setups := []posSetup{
		{
			name: "fixed 1 s loop",
			how:  "a hand-rolled loop: POST, on any failure sleep exactly 1 s and POST again with the same key, until the deadline",
			prepare: func(base http.RoundTripper, url string) (func(int) live.Call, func() string) {
				client := &http.Client{Transport: base}
				return func(int) live.Call {
					return live.Loop(func() func(context.Context) error {
						key := keys.Next()
						return func(ctx context.Context) error { return pay(ctx, client, url, key) }
					}, time.Second, 0)
				}, nil
			},
		},
		{
			name: "go-retryablehttp v0.7.8",
			how: "retryablehttp.NewClient() per terminal (4 retries, 1 s to 30 s exponential, Retry-After honoured on 503), " +
				"Logger nil, HTTPClient.Transport = the shared base; Do of a retryablehttp.Request",
			prepare: func(base http.RoundTripper, url string) (func(int) live.Call, func() string) {
				return func(int) live.Call {
					c := retryablehttp.NewClient()
					c.Logger = nil
					c.HTTPClient.Transport = base
					return func(ctx context.Context) error {
						req, err := retryablehttp.NewRequestWithContext(ctx, http.MethodPost, url, []byte(live.PaymentBody))
						if err != nil {
							return err
						}
						req.Header.Set("Content-Type", "application/json")
						req.Header.Set("Idempotency-Key", keys.Next())
						resp, err := c.Do(req)
						return answer(resp, err)
					}
				}, nil
			},
		},
		{
			name: "cenkalti/backoff v5.0.3",
			how: "backoff.Retry(ctx, op) with no options (exponential from 500 ms, x1.5, ±50%, no try limit; the deadline ends it); " +
				"op returns backoff.RetryAfter(n) on a 503 with Retry-After: n",
			prepare: func(base http.RoundTripper, url string) (func(int) live.Call, func() string) {
				client := &http.Client{Transport: base}
				return func(int) live.Call {
					return func(ctx context.Context) error {
						key := keys.Next()
						_, err := cenkalti.Retry(ctx, func() (struct{}, error) {
							return struct{}{}, cenkaltiOp(pay(ctx, client, url, key))
						})
						return err
					}
				}, nil
			},
		},
		{
			name: "avast/retry-go v4.7.0",
			how:  "retry.Do(op, retry.Context(ctx)) with its defaults: 10 attempts, 100 ms backoff plus up to 100 ms random, Retry-After ignored",
			prepare: func(base http.RoundTripper, url string) (func(int) live.Call, func() string) {
				client := &http.Client{Transport: base}
				return func(int) live.Call {
					return func(ctx context.Context) error {
						key := keys.Next()
						return avast.Do(func() error { return pay(ctx, client, url, key) }, avast.Context(ctx))
					}
				}, nil
			},
		},
		{
			name: "failsafe-go v0.9.8",
			how: "failsafehttp.NewRoundTripper(base, failsafehttp.NewRetryPolicyBuilder().Build()) per terminal: " +
				"2 retries, no delay unless Retry-After (integer seconds), no jitter",
			prepare: func(base http.RoundTripper, url string) (func(int) live.Call, func() string) {
				return func(int) live.Call {
					rp := failsafehttp.NewRetryPolicyBuilder().Build()
					return live.Payment(&http.Client{Transport: failsafehttp.NewRoundTripper(base, rp)}, url, keys)
				}, nil
			},
		},
		{
			name:       "stormguard, per terminal",
			how:        "httpretry.NewTransport(base, options) per terminal: its own budget, breaker and limiter each",
			prepare:    perTerminal(sgOpts),
			stormguard: true,
		},
		{
			name: "stormguard, one shared transport",
			how: "one httpretry.NewTransport(base, options) for all terminals (a gateway): one budget, one breaker " +
				"and the default per-host limiter (limit.Config{Max: 1 << 30})",
			prepare:    shared(sgOpts),
			stormguard: true,
		},
		{
			name: "stormguard, one shared transport + limiter",
			how: "as the row above with WithLimit(&limit.Config{}): a limiter asked for (Max 1000), so the breaker the transport " +
				"builds releases its waiting calls at once and the limiter's slots pace them (ReleaseRate -1)",
			prepare:    shared(append(posStormguardOptions(), httpretry.WithLimit(&limit.Config{}))),
			stormguard: true,
		},
		{
			name:       "stormguard, one shared transport, WithLimit(nil)",
			how:        "as the first shared row with WithLimit(nil): no limiter, the default before the limiter was",
			prepare:    shared(append(posStormguardOptions(), httpretry.WithLimit(nil))),
			stormguard: true,
		},
		{
			name:       "stormguard, one shared transport, library defaults",
			how:        "as the first shared row with no options at all (breaker window 10 s): for comparison",
			prepare:    shared(nil),
			stormguard: true,
		},
		{
			name: "stormguard per terminal + admission",
			how: "the per-terminal row, with admission.Controller.Wrap in front of the provider's work " +
				"(defaults; work in progress limited to the 30 workers, queue 1500)",
			prepare:    perTerminal(sgOpts),
			admission:  true,
			stormguard: true,
		},
	}
	if fl, ok := posFleetSetup(keys); ok {
		setups = append(setups, fl)
	}
	if fl, ok := posFleetSetupLimit(keys, &limit.Config{}); ok {
		setups = append(setups, fl)
	}
	return setups
}

// posWanted reports whether the row named name is one that only
// (STORMGUARD_LIVE_POS_ROWS) asks for: one of its |-separated parts is
// the name of a row of setups and is name itself, or names no row and
// contains name. "stormguard, one shared transport, WithLimit(nil)" thus
// runs that row alone, and "stormguard, one shared transport + limiter"
// that row alone.
func posWanted(only, name string, setups []posSetup) bool {
	for _, part := range strings.Split(only, "|") {
		if part == "" {
			continue
		}
		if slices.ContainsFunc(setups, func(s posSetup) bool { return s.name == part }) {
			if part == name {
				return true
			}
		} else if strings.Contains(part, name) {
			return true
		}
	}
	return false
}

// failing is the call of a terminal whose client could not be built.
func failing(err error) live.Call {
	return func(context.Context) error { return err }
}

// pay makes one payment attempt with key.
func pay(ctx context.Context, client *http.Client, url, key string) error {
	req, err := live.NewPayment(ctx, url, key)
	if err != nil {
		return err
	}
	return live.Do(client, req)
}

// answer turns a response into a payment's outcome: nil for a 2xx.
func answer(resp *http.Response, err error) error {
	if err != nil {
		return err
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
	_ = resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return &live.StatusError{Method: http.MethodPost, Code: resp.StatusCode, RetryAfter: resp.Header.Get("Retry-After")}
	}
	return nil
}

// cenkaltiOp maps an attempt's error for cenkalti/backoff: a 503 or 429
// with Retry-After: n becomes backoff.RetryAfter(n), as the library's own
// example does for 429.
func cenkaltiOp(err error) error {
	var se *live.StatusError
	if errors.As(err, &se) && (se.Code == http.StatusServiceUnavailable || se.Code == http.StatusTooManyRequests) {
		if s, perr := strconv.Atoi(se.RetryAfter); perr == nil && s >= 0 {
			return cenkalti.RetryAfter(s)
		}
	}
	return err
}

// runPOS runs setup s through one scenario.
func runPOS(ctx context.Context, s posSetup, pc live.ProviderConfig, fc live.FleetConfig, base http.RoundTripper) (*live.Result, string, error) {
	sc := live.Scenario{Name: s.name, Provider: pc, Fleet: fc, Classify: posFailure}
	if s.admission {
		wrap, err := posAdmission(pc)
		if err != nil {
			return nil, "", err
		}
		sc.Wrap = wrap
	}
	var calls func(int) live.Call
	var done func() string
	sc.NewCall = func(url string, i int) live.Call {
		if calls == nil {
			calls, done = s.prepare(base, url)
		}
		return calls(i)
	}
	r, err := live.RunScenario(ctx, sc)
	note := ""
	if done != nil {
		note = done()
	}
	return r, note, err
}

// posFailure names why a payment failed: the reason stormguard's loop gave
// up (from its error, or from the Stormguard-Gave-Up header of the response
// it returned), the deadline, the status the client returned, or the
// failsafe-go policy that refused its last attempt (its throttler, its
// limiter, its timeout; a retry policy's error wraps its last attempt's).
func posFailure(err error) string {
	var re *retry.Error
	var se *live.StatusError
	var fe retrypolicy.ExceededError
	switch {
	case errors.Is(err, adaptivethrottler.ErrExceeded):
		return "failsafe-go: throttler refused"
	case errors.Is(err, adaptivelimiter.ErrExceeded):
		return "failsafe-go: limiter refused"
	case errors.Is(err, timeout.ErrExceeded):
		return "failsafe-go: attempt timeout"
	case errors.As(err, &fe):
		if r, ok := fe.LastResult.(*http.Response); ok && r != nil {
			return fmt.Sprintf("failsafe-go: retries exceeded, last answer HTTP %d", r.StatusCode)
		}
		return "failsafe-go: retries exceeded"
	case errors.As(err, &re):
		return "stormguard: " + strings.TrimPrefix(re.Reason.Error(), "retry: ") // the reason in words
	case errors.As(err, &se):
		if g, ok := wire.ParseGiveUp(se.Header.Get(wire.GiveUpHeader)); ok {
			return fmt.Sprintf("stormguard: %s (HTTP %d)", strings.ReplaceAll(g.Reason, "-", " "), se.Code)
		}
		if wire.DontRetry(se.Header) {
			return fmt.Sprintf("HTTP %d, Stormguard-Retry: no", se.Code)
		}
		return fmt.Sprintf("HTTP %d", se.Code)
	case errors.Is(err, context.DeadlineExceeded):
		return "deadline"
	}
	return "other"
}

// TestLivePOSSmoke runs every setup through a tiny POS scenario (20
// terminals, one payment every 100 ms each, a 300 ms outage) and checks the
// accounting only: every payment is recorded once as a success or a
// failure, every attempt the provider counted has an outcome there, no
// more attempts reached it than the terminals sent, and every payment that
// succeeded was served by it. Timing-dependent figures are not checked
// (TestLivePOSRetries checks that each setup retries).
func TestLivePOSSmoke(t *testing.T) {
	for _, s := range posSetups() {
		t.Run(s.name, func(t *testing.T) {
			t.Parallel()
			fc := live.FleetConfig{Clients: 20, Every: 100 * time.Millisecond, Duration: time.Second, Deadline: 1500 * time.Millisecond, RandomPhase: true, Seed: 1}
			pc := live.ProviderConfig{FailAt: 300 * time.Millisecond, FailFor: 300 * time.Millisecond, Capacity: 4, Queue: 8, Work: time.Millisecond,
				Window: 10 * time.Millisecond, Horizon: 5 * time.Second}
			base := newLiveBase()
			defer base.CloseIdleConnections()
			sent := &live.Counter{Base: base}
			r, _, err := runPOS(context.Background(), s, pc, fc, sent)
			if err != nil {
				t.Fatal(err)
			}
			st := r.Stats
			if st.Offered != 200 || int64(len(st.Calls)) != st.Offered || st.Succeeded+st.Failed != st.Offered {
				t.Errorf("%s: %d offered, %d recorded, %d succeeded + %d failed; want 200 of each total", s.name, st.Offered, len(st.Calls), st.Succeeded, st.Failed)
			}
			var ok int64
			for _, c := range st.Calls {
				if c.OK {
					ok++
				}
			}
			var attempts, outcomes, served int64
			for _, w := range r.Windows {
				attempts += w.Attempts
				outcomes += w.OK + w.Failed + w.Shed + w.Refused
				served += w.OK
			}
			if st.Panics > 0 {
				t.Errorf("%s: %d payments panicked in the client; the first:\n%s", s.name, st.Panics, st.Panic)
			}
			if ok != st.Succeeded || attempts == 0 || outcomes != attempts || attempts > sent.N() || served < st.Succeeded {
				t.Errorf("%s: %d payments recorded OK of %d succeeded; the provider counted %d attempts with %d outcomes, %d served; the terminals sent %d",
					s.name, ok, st.Succeeded, attempts, outcomes, served, sent.N())
			}
		})
	}
}

// TestLivePOSRetries checks, against a provider that answers 503 for its
// first second, that one payment through each setup reaches the provider
// more than once: every row really retries a POST with an Idempotency-Key.
func TestLivePOSRetries(t *testing.T) {
	for _, s := range posSetups() {
		t.Run(s.name, func(t *testing.T) {
			t.Parallel()
			pc := live.ProviderConfig{FailFor: time.Second, Window: time.Minute, Horizon: time.Minute}
			fc := live.FleetConfig{Clients: 1, Every: time.Minute, Duration: time.Millisecond, Deadline: 30 * time.Second}
			base := newLiveBase()
			defer base.CloseIdleConnections()
			r, _, err := runPOS(context.Background(), s, pc, fc, base)
			if err != nil {
				t.Fatal(err)
			}
			if w := r.Windows[0]; w.Attempts < 2 || w.Failed < 1 {
				t.Errorf("%s: one payment made %d attempts, %d failed; want a retry after a 503", s.name, w.Attempts, w.Failed)
			}
		})
	}
}

// TestLivePOS runs the POS scenario for every setup, without and with
// Retry-After, and reports the tables (and writes them as Markdown to the
// file named by STORMGUARD_LIVE_POS_MD, if set). STORMGUARD_LIVE_POS_ROWS,
// if set, runs only the rows whose names it contains (see posWanted);
// STORMGUARD_LIVE_POS_SCALE (in (0, 1], default 1) scales the terminals and
// the provider; STORMGUARD_LIVE_POS_QUEUE (a comma list of positive
// integers, default 1500) runs both scenarios with each provider queue in
// turn (the queue at scale 1, scaled like the workers).
//
//	cd bench && STORMGUARD_LIVE_POS=1 go test -run='^TestLivePOS$' -v -timeout=40m .
func TestLivePOS(t *testing.T) {
	if os.Getenv("STORMGUARD_LIVE_POS") != "1" {
		t.Skip("live POS scenario: about 15 minutes of real time on loopback; set STORMGUARD_LIVE_POS=1 to run it")
	}
	start := time.Now().UTC()
	var md strings.Builder
	fmt.Fprintf(&md, "Command: `cd bench && %s go test -run='^TestLivePOS$' -v -timeout=40m .`\n\n", posEnvLine())
	fmt.Fprintf(&md, "Run %s on %s/%s, %d CPUs, %s, library at %s; load average before: %s\n\n",
		start.Format(time.RFC3339), runtime.GOOS, runtime.GOARCH, runtime.NumCPU(), runtime.Version(), gitRevision(), loadavg())
	t.Log(md.String())
	setups := posSetups()
	scale := 1.0
	if v := os.Getenv("STORMGUARD_LIVE_POS_SCALE"); v != "" {
		var err error
		if scale, err = strconv.ParseFloat(v, 64); err != nil || !(scale > 0 && scale <= 1) {
			t.Fatalf("STORMGUARD_LIVE_POS_SCALE=%q: want a number in (0, 1]", v)
		}
	}
	queues, err := posQueues(os.Getenv("STORMGUARD_LIVE_POS_QUEUE"))
	if err != nil {
		t.Fatal(err)
	}
	if only := os.Getenv("STORMGUARD_LIVE_POS_ROWS"); only != "" {
		setups = slices.DeleteFunc(setups, func(s posSetup) bool { return !posWanted(only, s.name, setups) })
	}
	type run struct {
		ra    time.Duration
		queue int
	}
	var runs []run
	for _, q := range queues {
		for _, ra := range []time.Duration{0, 2 * time.Second} {
			runs = append(runs, run{ra, q})
		}
	}
	for _, sc := range runs {
		ra := sc.ra
		pc, fc := posScenario(ra, sc.queue, scale)
		var rows []posRow
		for _, s := range setups {
			base := newLiveBase()
			r, note, err := runPOS(context.Background(), s, pc, fc, base)
			base.CloseIdleConnections()
			if err != nil {
				t.Fatalf("%s: %v", s.name, err)
			}
			rows = append(rows, posRow{setup: s, result: r, load: loadavg(), note: note})
			if r.Stats.Panics > 0 {
				t.Errorf("%s, Retry-After %v: %d payments panicked in the client; the first:\n%s", s.name, ra, r.Stats.Panics, r.Stats.Panic)
			}
			t.Logf("%s, Retry-After %v: %.2fx in the outage, %.1f%% of its payments OK, load %s", s.name, ra,
				r.Summary.OutageAmplification, 100*r.Summary.OutageGoodput, rows[len(rows)-1].load)
		}
		table := posTable(pc, fc, rows)
		t.Log("\n" + table)
		md.WriteString(table)
		md.WriteString("\n")
	}
	fmt.Fprintf(&md, "Took %v; load average after: %s\n\nSetups:\n\n", time.Since(start).Round(time.Second), loadavg())
	for _, s := range setups {
		fmt.Fprintf(&md, "- **%s**: %s\n", s.name, s.how)
	}
	if f := os.Getenv("STORMGUARD_LIVE_POS_MD"); f != "" {
		if err := os.WriteFile(f, []byte(md.String()), 0o644); err != nil {
			t.Errorf("writing %s: %v", f, err)
		}
	}
}

// posEnvLine is the environment of a TestLivePOS run, as a command prefix.
func posEnvLine() string {
	parts := []string{"STORMGUARD_LIVE_POS=1"}
	for _, n := range []string{"ROWS", "SCALE", "QUEUE", "MD"} {
		if v, ok := os.LookupEnv("STORMGUARD_LIVE_POS_" + n); ok {
			parts = append(parts, fmt.Sprintf("STORMGUARD_LIVE_POS_%s=%s", n, strconv.Quote(v)))
		}
	}
	if v, ok := os.LookupEnv("STORMGUARD_REDIS_ADDR"); ok {
		parts = append(parts, "STORMGUARD_REDIS_ADDR="+strconv.Quote(v))
	}
	return strings.Join(parts, " ")
}

// posQueues reads STORMGUARD_LIVE_POS_QUEUE: "" is the scenario's queue
// (posQueue), otherwise a comma list of positive integers (at most
// 1,000,000 each), spaces around them allowed.
func posQueues(v string) ([]int, error) {
	if strings.TrimSpace(v) == "" {
		return []int{posQueue}, nil
	}
	var out []int
	for _, f := range strings.Split(v, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 || n > 1_000_000 {
			return nil, fmt.Errorf("STORMGUARD_LIVE_POS_QUEUE=%q: want a comma list of integers from 1 to 1000000", v)
		}
		out = append(out, n)
	}
	return out, nil
}

// gitRevision describes the checkout the test runs in: the commit, and
// whether files of the stormguard modules were modified; "unknown" without
// git.
func gitRevision() string {
	rev, err := exec.Command("git", "rev-parse", "--short", "HEAD").Output()
	if err != nil {
		return "unknown"
	}
	out := "commit " + strings.TrimSpace(string(rev))
	if st, err := exec.Command("git", "status", "--porcelain", "--untracked-files=no", "--", "..").Output(); err == nil && len(st) > 0 {
		out += " with local changes"
	}
	return out
}

// posRow is one measured row.
type posRow struct {
	setup  posSetup
	result *live.Result
	load   string // load average right after the row's run
	note   string // what the setup reported after the run
}

// posTable formats one scenario's rows as Markdown: the figures, the
// targets, and the attempts per second around the outage.
func posTable(pc live.ProviderConfig, fc live.FleetConfig, rows []posRow) string {
	var b strings.Builder
	hint := "no Retry-After"
	if pc.RetryAfter > 0 {
		hint = fmt.Sprintf("Retry-After: %d", int64((pc.RetryAfter+time.Second-1)/time.Second))
	}
	end := pc.FailAt + pc.FailFor
	fmt.Fprintf(&b, "#### 503 from %v to %v, %s; %d terminals x 1 payment every %v (%.0f/s offered) for %v, deadline %v; provider %d workers x %v (%.0f/s), queue %d\n\n",
		pc.FailAt, end, hint, fc.Clients, fc.Every, float64(fc.Clients)/fc.Every.Seconds(), fc.Duration, fc.Deadline,
		pc.Capacity, pc.Work, float64(pc.Capacity)/pc.Work.Seconds(), pc.Queue)
	b.WriteString("| client | attempts in outage / offered | peak per 100 ms (at) | back to normal after the outage | payments OK | started in outage OK | p50 | p99 | shed after the outage | load avg | payments late, p99 / max |\n")
	b.WriteString("|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|\n")
	for _, row := range rows {
		s := row.result.Summary
		normal := "not within the run"
		if s.Normal {
			normal = fmt.Sprintf("%.1f s", s.NormalAfter.Seconds())
		}
		fmt.Fprintf(&b, "| %s | %.2fx | %d (%.1f s) | %s | %.1f%% | %.1f%% | %s | %s | %d | %s | %s / %s |\n",
			row.setup.name, s.OutageAmplification, s.Peak, s.PeakAt.Seconds(), normal,
			100*s.Goodput, 100*s.OutageGoodput, fmtLatency(s.P50), fmtLatency(s.P99), s.ShedAfter, row.load,
			fmtLatency(s.LateP99), fmtLatency(s.LateMax))
	}
	for _, row := range rows {
		if f := row.result.Failures; len(f) > 0 {
			causes := make([]string, 0, len(f))
			for why, n := range f {
				causes = append(causes, fmt.Sprintf("%s %d", why, n))
			}
			slices.Sort(causes)
			fmt.Fprintf(&b, "\n%s, failed payments by cause: %s\n", row.setup.name, strings.Join(causes, ", "))
		}
		if row.note != "" {
			fmt.Fprintf(&b, "\n%s: %s\n", row.setup.name, row.note)
		}
		if st := row.result.Stats; st.Panics > 0 {
			first, _, _ := strings.Cut(st.Panic, "\n")
			fmt.Fprintf(&b, "\n**%s: %d payments panicked in the client** (counted as failed): %s\n", row.setup.name, st.Panics, first)
		}
	}
	b.WriteString("\nTargets:\n\n")
	b.WriteString(posTargets(rows))
	b.WriteString("\nAttempts at the provider per second:\n\n| client |")
	from, to := int((pc.FailAt-3*time.Second)/time.Second), int((end+10*time.Second)/time.Second)
	for i := from; i < to; i++ {
		fmt.Fprintf(&b, " %d s |", i)
	}
	b.WriteString("\n|---|" + strings.Repeat("--:|", to-from) + "\n")
	for _, row := range rows {
		fmt.Fprintf(&b, "| %s |", row.setup.name)
		for i := from; i < to; i++ {
			at := time.Duration(i) * time.Second
			fmt.Fprintf(&b, " %d |", attemptsIn(row.result.Windows, at, at+time.Second))
		}
		b.WriteString("\n")
	}
	return b.String()
}

// posTargets checks the targets of the stormguard rows against the rows
// measured: at most 1.1x the offered load during the outage, at least 99%
// of the payments started during the outage served, nothing shed after
// it, and less amplification than every other library's row.
func posTargets(rows []posRow) string {
	var b bytes.Buffer
	peerMin, peers := 0.0, false
	for _, row := range rows {
		if !row.setup.stormguard {
			if a := row.result.Summary.OutageAmplification; !peers || a < peerMin {
				peerMin, peers = a, true
			}
		}
	}
	mark := func(ok bool) string {
		if ok {
			return "met"
		}
		return "MISSED"
	}
	for _, row := range rows {
		if !row.setup.stormguard {
			continue
		}
		s := row.result.Summary
		fmt.Fprintf(&b, "- %s: <= 1.1x during the outage %s (%.2fx); >= 99%% of the payments started during the outage %s (%.1f%%); "+
			"nothing shed after the outage %s (%d)",
			row.setup.name, mark(s.OutageAmplification <= 1.1), s.OutageAmplification, mark(s.OutageGoodput >= 0.99), 100*s.OutageGoodput,
			mark(s.ShedAfter == 0), s.ShedAfter)
		if peers {
			fmt.Fprintf(&b, "; below every peer row (%.2fx) %s", peerMin, mark(s.OutageAmplification < peerMin))
		} else {
			b.WriteString("; no peer row in this run to compare with")
		}
		b.WriteString("\n")
	}
	return b.String()
}

// fmtLatency formats a latency in seconds, or "-" for none.
func fmtLatency(d time.Duration) string {
	if d == 0 {
		return "-"
	}
	return fmt.Sprintf("%.2f s", d.Seconds())
}

func TestPOSFailure(t *testing.T) {
	gaveUp := http.Header{}
	gaveUp.Set(wire.GiveUpHeader, "attempts-exhausted;attempts=3")
	noRetry := http.Header{}
	wire.SetDontRetry(noRetry)
	for _, tt := range []struct {
		err  error
		want string
	}{
		{fmt.Errorf("post: %w", &retry.Error{Reason: retry.BudgetExhausted, Attempts: 1}), "stormguard: budget exhausted"},
		{&live.StatusError{Code: 503, Header: gaveUp}, "stormguard: attempts exhausted (HTTP 503)"},
		{&live.StatusError{Code: 503, Header: noRetry}, "HTTP 503, Stormguard-Retry: no"},
		{&live.StatusError{Code: 503}, "HTTP 503"},
		{fmt.Errorf("post: %w", context.DeadlineExceeded), "deadline"},
		{errors.New("connection reset"), "other"},
		{fmt.Errorf("post: %w", adaptivethrottler.ErrExceeded), "failsafe-go: throttler refused"},
		{fmt.Errorf("post: %w", retrypolicy.ExceededError{LastError: adaptivelimiter.ErrExceeded}), "failsafe-go: limiter refused"},
		{fmt.Errorf("post: %w", timeout.ErrExceeded), "failsafe-go: attempt timeout"},
		{fmt.Errorf("post: %w", retrypolicy.ExceededError{LastResult: &http.Response{StatusCode: 503}}), "failsafe-go: retries exceeded, last answer HTTP 503"},
	} {
		if got := posFailure(tt.err); got != tt.want {
			t.Errorf("posFailure(%v) = %q, want %q", tt.err, got, tt.want)
		}
	}
}
