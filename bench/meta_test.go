package bench

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	avast "github.com/avast/retry-go/v4"
	cenkalti "github.com/cenkalti/backoff/v5"
	"github.com/failsafe-go/failsafe-go"
	"github.com/failsafe-go/failsafe-go/adaptivelimiter"
	"github.com/failsafe-go/failsafe-go/adaptivethrottler"
	"github.com/failsafe-go/failsafe-go/failsafehttp"
	"github.com/failsafe-go/failsafe-go/timeout"
	"github.com/hashicorp/go-retryablehttp"

	"github.com/stormguard/stormguard/admission"
	"github.com/stormguard/stormguard/bench/internal/live"
	"github.com/stormguard/stormguard/httpretry"
	"github.com/stormguard/stormguard/limit"
	"github.com/stormguard/stormguard/observe"
)

// The live metastability scenario (issue 20, docs/metastability.md): a payment provider
// near its capacity (workers x service time = mu, a queue holding D seconds
// of work, served even for callers who left), 1000 terminals offering rho
// of mu with a 1 s attempt timeout and a 20 s deadline per payment, and a
// trigger of 10 s at 15 s of a 60 s run: 503 for everything, a hang (the
// workers stall, the queue fills) or the service time x5. The question is
// whether each client setup comes back once the trigger has ended, or
// stays in the bad state its own retries and the abandoned work sustain.
//
// TestLiveMeta is a measurement, not a test: it runs only when
// STORMGUARD_LIVE_META=1 is set, takes about 80 s per row and trigger,
// and prints its command, the machine's load and the table. Settings
// (environment, defaults in brackets): STORMGUARD_LIVE_META_RHO [0.9]
// and STORMGUARD_LIVE_META_TRIGGERS [503,slow,hang] as comma lists,
// STORMGUARD_LIVE_META_ROWS (run the rows whose names contain one of its
// |-separated parts, or that a part names exactly: see metaWanted), _TERMINALS [1000], _WORKERS [10], _WORK [20ms],
// _QUEUE [2s of work], _DURATION [60s], _AT [15s], _FOR [10s],
// _DEADLINE [20s], _MD (a file to write the report to), _ADMISSION (1:
// an admission controller in front of the provider's work), _TRACE (1:
// with _ADMISSION, the controller's decisions per second, from 2 s
// before the trigger to the run's end, in each row's note).

// metaSetup is one client setup of the metastability scenario.
type metaSetup struct {
	name, how string
	// prepare returns the call of terminal i over the run's base
	// transport, given the provider's URL.
	prepare func(base http.RoundTripper, url string) func(terminal int) live.Call
	// withDone, if set, is used instead of prepare: it also returns what
	// to do after the run (closing clients), which may return a note.
	withDone   func(base http.RoundTripper, url string) (func(terminal int) live.Call, func() string)
	stormguard bool
}

// The scenario's fixed settings.
const (
	metaAttemptTimeout = time.Second
)

// metaSetups lists the rows, the naive loop first.
//
//stormguard:long one literal row per library, each built as its docs show
func metaSetups() []metaSetup {
	keys := live.NewKeys()
	timed := func(base http.RoundTripper) *http.Client {
		return &http.Client{Transport: base, Timeout: metaAttemptTimeout}
	}
	shared := func(opts ...httpretry.Option) func(http.RoundTripper, string) func(int) live.Call {
		return func(base http.RoundTripper, url string) func(int) live.Call {
			t, err := httpretry.NewTransport(base, opts...)
			client := &http.Client{Transport: t}
			return func(int) live.Call {
				if err != nil {
					return failing(err)
				}
				return live.Payment(client, url, keys)
			}
		}
	}
	setups := []metaSetup{
		{
			name: "fixed 1 s loop",
			how:  "a hand-rolled loop: POST with http.Client.Timeout 1 s, on any failure sleep 1 s and POST again with the same key, until the deadline",
			prepare: func(base http.RoundTripper, url string) func(int) live.Call {
				client := timed(base)
				return func(int) live.Call {
					return live.Loop(func() func(context.Context) error {
						key := keys.Next()
						return func(ctx context.Context) error { return pay(ctx, client, url, key) }
					}, time.Second, 0)
				}
			},
		},
		{
			name: "go-retryablehttp v0.7.8",
			how:  "retryablehttp.NewClient() per terminal (4 retries, 1-30 s exponential), Logger nil, HTTPClient.Timeout 1 s (per attempt), HTTPClient.Transport the shared base",
			prepare: func(base http.RoundTripper, url string) func(int) live.Call {
				return func(int) live.Call {
					c := retryablehttp.NewClient()
					c.Logger = nil
					c.HTTPClient.Transport = base
					c.HTTPClient.Timeout = metaAttemptTimeout
					return func(ctx context.Context) error {
						req, err := retryablehttp.NewRequestWithContext(ctx, http.MethodPost, url, []byte(live.PaymentBody))
						if err != nil {
							return err
						}
						req.Header.Set("Content-Type", "application/json")
						req.Header.Set("Idempotency-Key", keys.Next())
						return answer(c.Do(req))
					}
				}
			},
		},
		{
			name: "cenkalti/backoff v5.0.3",
			how:  "backoff.Retry(ctx, op) with no options (500 ms x1.5 ±50%, the deadline ends it); op POSTs with http.Client.Timeout 1 s, Retry-After honoured",
			prepare: func(base http.RoundTripper, url string) func(int) live.Call {
				client := timed(base)
				return func(int) live.Call {
					return func(ctx context.Context) error {
						key := keys.Next()
						_, err := cenkalti.Retry(ctx, func() (struct{}, error) {
							return struct{}{}, cenkaltiOp(pay(ctx, client, url, key))
						})
						return err
					}
				}
			},
		},
		{
			name: "avast/retry-go v4.7.0",
			how:  "retry.Do(op, retry.Context(ctx)) with its defaults (10 attempts, 100 ms + up to 100 ms); op POSTs with http.Client.Timeout 1 s",
			prepare: func(base http.RoundTripper, url string) func(int) live.Call {
				client := timed(base)
				return func(int) live.Call {
					return func(ctx context.Context) error {
						key := keys.Next()
						return avast.Do(func() error { return pay(ctx, client, url, key) }, avast.Context(ctx))
					}
				}
			},
		},
		{
			name: "failsafe-go v0.9.8, retry",
			how:  "failsafehttp.NewRoundTripper(base, failsafehttp.NewRetryPolicyBuilder().Build(), timeout.New(1 s)) per terminal: 2 retries, no delay unless Retry-After",
			prepare: func(base http.RoundTripper, url string) func(int) live.Call {
				return func(int) live.Call {
					rp := failsafehttp.NewRetryPolicyBuilder().Build()
					rt := failsafehttp.NewRoundTripper(base, rp, timeout.New[*http.Response](metaAttemptTimeout))
					return live.Payment(&http.Client{Transport: rt}, url, keys)
				}
			},
		},
		{
			name: "failsafe-go v0.9.8, retry + adaptive limiter + throttler",
			how: "one failsafehttp.NewRoundTripper(base, retry, adaptivethrottler.NewWithDefaults(), adaptivelimiter.NewWithDefaults(), timeout.New(1 s)) " +
				"shared by every terminal (a gateway; a per-terminal limiter of min 1, initial 20 never binds one call at a time)",
			prepare: func(base http.RoundTripper, url string) func(int) live.Call {
				policies := []failsafe.Policy[*http.Response]{
					failsafehttp.NewRetryPolicyBuilder().Build(),
					adaptivethrottler.NewWithDefaults[*http.Response](),
					adaptivelimiter.NewWithDefaults[*http.Response](),
					timeout.New[*http.Response](metaAttemptTimeout),
				}
				client := &http.Client{Transport: failsafehttp.NewRoundTripper(base, policies...)}
				return func(int) live.Call { return live.Payment(client, url, keys) }
			},
		},
		{
			name: "stormguard, one shared transport",
			how: "one httpretry.NewTransport(base, WithAttemptTimeout(1 s)) for every terminal: the library's defaults otherwise, " +
				"the per-host limiter included (limit.Config{Max: 1 << 30}, Timeout from the attempt timeout, no throttle)",
			prepare:    shared(httpretry.WithAttemptTimeout(metaAttemptTimeout)),
			stormguard: true,
		},
		{
			name: "stormguard, one shared transport + limiter",
			how: "as the row above with WithLimit(&limit.Config{}): a limiter asked for (Max 1000), so the breaker the transport " +
				"builds releases its waiting calls at once and the limiter's slots pace them (ReleaseRate -1); " +
				"the default limiter leaves the breaker's release paced by the rate before the trip",
			prepare:    shared(httpretry.WithAttemptTimeout(metaAttemptTimeout), httpretry.WithLimit(&limit.Config{})),
			stormguard: true,
		},
		{
			name:       "stormguard, one shared transport, WithLimit(nil)",
			how:        "as the first shared row with WithLimit(nil): no limiter, the default before the limiter was",
			prepare:    shared(httpretry.WithAttemptTimeout(metaAttemptTimeout), httpretry.WithLimit(nil)),
			stormguard: true,
		},
		{
			name: "stormguard, per terminal",
			how:  "httpretry.NewTransport(base, WithAttemptTimeout(1 s)) per terminal: its own budget, breaker and limiter each",
			prepare: func(base http.RoundTripper, url string) func(int) live.Call {
				return func(int) live.Call {
					t, err := httpretry.NewTransport(base, httpretry.WithAttemptTimeout(metaAttemptTimeout))
					if err != nil {
						return failing(err)
					}
					return live.Payment(&http.Client{Transport: t}, url, keys)
				}
			},
			stormguard: true,
		},
	}
	// The POS scenario's fleet row (one fleet on Redis per terminal), with
	// the 1 s attempt timeout, without and with the fleet-wide limit.
	for _, lim := range []*limit.Config{nil, {}} {
		fl, ok := posFleetSetupLimit(keys, lim, httpretry.WithAttemptTimeout(metaAttemptTimeout))
		if !ok {
			break
		}
		name := "stormguard, per terminal + fleet (Redis)"
		if lim != nil {
			name = "stormguard, per terminal + fleet + limit (Redis)"
		}
		setups = append(setups, metaSetup{
			name: name,
			how:  fl.how + "; with WithAttemptTimeout(1 s)",
			withDone: func(base http.RoundTripper, url string) (func(int) live.Call, func() string) {
				return fl.prepare(base, url)
			},
			stormguard: true,
		})
	}
	return setups
}

// metaWanted reports whether the row named name is one that only
// (STORMGUARD_LIVE_META_ROWS) asks for: one of its |-separated parts is
// the name of a row of setups and is name itself, or names no row and is
// part of name. "stormguard, one shared transport" thus runs that row
// alone, not its " + limiter" and ", WithLimit(nil)" twins; "one shared
// transport" all three.
func metaWanted(only, name string, setups []metaSetup) bool {
	for _, part := range strings.Split(only, "|") {
		if part == "" {
			continue
		}
		if slices.ContainsFunc(setups, func(s metaSetup) bool { return s.name == part }) {
			if part == name {
				return true
			}
		} else if strings.Contains(name, part) {
			return true
		}
	}
	return false
}

// metaParams are the scenario's settings.
type metaParams struct {
	terminals, workers            int
	work, queue, duration, at, of time.Duration
	deadline                      time.Duration
}

func defaultMetaParams() metaParams {
	return metaParams{terminals: 1000, workers: 10, work: 20 * time.Millisecond, queue: 2 * time.Second,
		duration: 60 * time.Second, at: 15 * time.Second, of: 10 * time.Second, deadline: 20 * time.Second}
}

// metaScenario returns the provider and the fleet for load rho and trigger tr.
func metaScenario(p metaParams, rho float64, tr live.Trigger) (live.ProviderConfig, live.FleetConfig) {
	mu := float64(p.workers) / p.work.Seconds()
	every := time.Duration(float64(p.terminals) / (rho * mu) * float64(time.Second))
	fc := live.FleetConfig{Clients: p.terminals, Every: every, Duration: p.duration, Deadline: p.deadline, RandomPhase: true, Seed: 42}
	pc := live.ProviderConfig{
		FailAt: p.at, FailFor: p.of, Trigger: tr,
		Capacity: p.workers, Queue: int(math.Round(p.queue.Seconds() * mu)), Work: p.work,
		Window: 100 * time.Millisecond, Horizon: p.duration + p.deadline + 5*time.Second,
	}
	return pc, fc
}

// runMeta runs setup s through one scenario; note is what its done
// function said.
// With admit, an admission controller is put in front of the provider's
// work (metaAdmission).
func runMeta(ctx context.Context, s metaSetup, pc live.ProviderConfig, fc live.FleetConfig, base http.RoundTripper, admit bool) (r *live.Result, note string, err error) {
	var calls func(int) live.Call
	var done func() string
	var wrap func(http.Handler) http.Handler
	var start atomic.Int64 // the run's start, in Unix nanoseconds
	var trace *metaTrace
	if admit {
		var obs observe.Observer
		if os.Getenv("STORMGUARD_LIVE_META_TRACE") == "1" {
			trace = &metaTrace{start: &start, secs: make([]map[string]int, int((pc.Horizon+time.Second-1)/time.Second))}
			obs = trace
		}
		if wrap, err = metaAdmission(pc, obs); err != nil {
			return nil, "", err
		}
	}
	// A failure's cause, and when its payment started against the
	// trigger (the goodput columns count payments by their start).
	classify := func(err error) string {
		when := "?"
		if se := (*metaStarted)(nil); errors.As(err, &se) {
			when = "before the trigger"
			switch {
			case se.at >= pc.FailAt+pc.FailFor+10*time.Second:
				when = "from 10 s after the trigger"
			case se.at >= pc.FailAt+pc.FailFor:
				when = "in the 10 s after the trigger"
			case se.at >= pc.FailAt:
				when = "in the trigger"
			}
		}
		return posFailure(err) + " (started " + when + ")"
	}
	sc := live.Scenario{Name: s.name, Provider: pc, Fleet: fc, Classify: classify, Wrap: wrap,
		Started: func(_ *live.Provider, t time.Time) { start.Store(t.UnixNano()) },
		NewCall: func(url string, i int) live.Call {
			if calls == nil {
				if s.withDone != nil {
					calls, done = s.withDone(base, url)
				} else {
					calls = s.prepare(base, url)
				}
			}
			call := calls(i)
			return func(ctx context.Context) error {
				at := time.Duration(time.Now().UnixNano() - start.Load())
				if err := call(ctx); err != nil {
					return &metaStarted{at: at, err: err}
				}
				return nil
			}
		}}
	r, err = live.RunScenario(ctx, sc)
	if done != nil {
		note = done()
	}
	if trace != nil {
		note += trace.String(pc.FailAt-2*time.Second, fc.Duration)
	}
	return r, note, err
}

// metaTrace counts an admission controller's decisions per second of the
// run: outcome, reason, and original (attempt 1) or retry.
type metaTrace struct {
	start *atomic.Int64 // the run's start, Unix nanoseconds
	mu    sync.Mutex
	secs  []map[string]int
}

// Observe implements observe.Observer.
func (m *metaTrace) Observe(_ context.Context, e observe.Event) {
	if e.Kind != observe.Admission || e.Outcome == "queued" {
		return
	}
	sec := int((time.Now().UnixNano() - m.start.Load()) / int64(time.Second))
	key := e.Outcome
	if e.Reason != "" && e.Reason != e.Outcome {
		key += " " + e.Reason
	}
	if e.Attempt > 1 {
		key += " (retry)"
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if sec < 0 || sec >= len(m.secs) {
		return
	}
	if m.secs[sec] == nil {
		m.secs[sec] = make(map[string]int)
	}
	m.secs[sec][key]++
}

// String lists the decisions of each second from from to to.
func (m *metaTrace) String(from, to time.Duration) string {
	m.mu.Lock()
	defer m.mu.Unlock()
	var b strings.Builder
	b.WriteString("admission's decisions per second:\n")
	for s := int(from / time.Second); s < int(to/time.Second) && s < len(m.secs); s++ {
		if s < 0 {
			continue
		}
		keys := make([]string, 0, len(m.secs[s]))
		for k, n := range m.secs[s] {
			keys = append(keys, fmt.Sprintf("%s %d", k, n))
		}
		slices.Sort(keys)
		fmt.Fprintf(&b, "  %ds: %s\n", s, strings.Join(keys, ", "))
	}
	return b.String()
}

// metaStarted is a failed payment's error with when the payment started,
// since the run's start.
type metaStarted struct {
	at  time.Duration
	err error
}

func (e *metaStarted) Error() string { return e.err.Error() }
func (e *metaStarted) Unwrap() error { return e.err }

// metaAdmission returns the provider's admission controller: the package's
// defaults with the work in progress limited to the provider's workers,
// adaptive up to them with the clients' attempt timeout as the latency
// ceiling, and the queue as deep as the provider's.
func metaAdmission(pc live.ProviderConfig, obs observe.Observer) (func(http.Handler) http.Handler, error) {
	ctl, err := admission.New(admission.Config{MaxInFlight: pc.Capacity, MaxQueue: pc.Queue, LatencyCeiling: metaAttemptTimeout, Observer: obs})
	if err != nil {
		return nil, err
	}
	return ctl.Wrap, nil
}

// TestLiveMetaSmoke runs every setup through a tiny scenario (the setups
// take the three triggers in turn, so that each setup and each trigger is
// run, every other one with admission at the provider) and checks the accounting only: every payment recorded, the
// provider's served work at least the payments that succeeded, its wasted
// work within its served work.
func TestLiveMetaSmoke(t *testing.T) {
	triggers := []live.Trigger{live.Trigger503, live.TriggerHang, live.TriggerSlow}
	for i, s := range metaSetups() {
		{
			tr := triggers[i%len(triggers)]
			t.Run(s.name+"/"+string(tr), func(t *testing.T) {
				t.Parallel()
				p := metaParams{terminals: 20, workers: 4, work: time.Millisecond, queue: 10 * time.Millisecond,
					duration: time.Second, at: 300 * time.Millisecond, of: 200 * time.Millisecond, deadline: 1500 * time.Millisecond}
				pc, fc := metaScenario(p, 0.5, tr)
				base := newLiveBase()
				defer base.CloseIdleConnections()
				r, _, err := runMeta(context.Background(), s, pc, fc, base, i%2 == 1)
				if err != nil {
					t.Fatal(err)
				}
				st := r.Stats
				var served, wasted int64
				for _, w := range r.Windows {
					served += w.Served
					wasted += w.Wasted
				}
				if int64(len(st.Calls)) != st.Offered || st.Succeeded+st.Failed != st.Offered || st.Offered == 0 {
					t.Errorf("%d offered, %d recorded, %d succeeded + %d failed", st.Offered, len(st.Calls), st.Succeeded, st.Failed)
				}
				if served < st.Succeeded || wasted > served || st.Panics > 0 {
					t.Errorf("served %d, wasted %d, %d payments succeeded, %d panicked (%s)", served, wasted, st.Succeeded, st.Panics, st.Panic)
				}
			})
		}
	}
}

// TestLiveMeta runs the metastability scenario; see the comment at the top
// of this file.
//
//	cd bench && STORMGUARD_LIVE_META=1 go test -run='^TestLiveMeta$' -v -timeout=3h .
func TestLiveMeta(t *testing.T) {
	if os.Getenv("STORMGUARD_LIVE_META") != "1" {
		t.Skip("live metastability scenario: about 80 s per row and trigger; set STORMGUARD_LIVE_META=1 to run it")
	}
	p, rhos, triggers, err := metaEnv()
	if err != nil {
		t.Fatal(err)
	}
	admit := os.Getenv("STORMGUARD_LIVE_META_ADMISSION") == "1"
	setups := metaSetups()
	if only := os.Getenv("STORMGUARD_LIVE_META_ROWS"); only != "" {
		setups = slices.DeleteFunc(setups, func(s metaSetup) bool { return !metaWanted(only, s.name, setups) })
	}
	start := time.Now().UTC()
	var md strings.Builder
	fmt.Fprintf(&md, "Command: `cd bench && %s go test -run='^TestLiveMeta$' -v -timeout=3h .`\n\n", metaEnvLine())
	fmt.Fprintf(&md, "Run %s on %s/%s, %d CPUs, %s, library at %s; load average before: %s\n\n",
		start.Format(time.RFC3339), runtime.GOOS, runtime.GOARCH, runtime.NumCPU(), runtime.Version(), gitRevision(), loadavg())
	t.Log(md.String())
	for _, rho := range rhos {
		for _, tr := range triggers {
			pc, fc := metaScenario(p, rho, tr)
			var rows []metaRow
			for _, s := range setups {
				base := newLiveBase()
				r, note, err := runMeta(context.Background(), s, pc, fc, base, admit)
				base.CloseIdleConnections()
				if err != nil {
					t.Fatalf("%s: %v", s.name, err)
				}
				row := metaRow{setup: s, result: r, meta: live.MetaOf(r), load: loadavg(), note: note}
				rows = append(rows, row)
				t.Logf("rho %.2f, %s: %s", rho, triggerName(pc), metaLine(row))
			}
			table := metaTable(rho, pc, fc, rows, admit)
			t.Log("\n" + table)
			md.WriteString(table + "\n")
		}
	}
	fmt.Fprintf(&md, "Took %v; load average after: %s\n\nSetups:\n\n", time.Since(start).Round(time.Second), loadavg())
	for _, s := range setups {
		fmt.Fprintf(&md, "- **%s**: %s\n", s.name, s.how)
	}
	if f := os.Getenv("STORMGUARD_LIVE_META_MD"); f != "" {
		if err := os.WriteFile(f, []byte(md.String()), 0o644); err != nil {
			t.Errorf("writing %s: %v", f, err)
		}
	}
}

// metaEnvNames are the settings TestLiveMeta reads, for its command line.
var metaEnvNames = []string{"RHO", "TRIGGERS", "ROWS", "TERMINALS", "WORKERS", "WORK", "QUEUE", "DURATION", "AT", "FOR", "DEADLINE", "MD", "ADMISSION", "TRACE"}

// metaEnvLine is the environment of the run, as a command prefix.
func metaEnvLine() string {
	parts := []string{"STORMGUARD_LIVE_META=1"}
	for _, n := range metaEnvNames {
		if v, ok := os.LookupEnv("STORMGUARD_LIVE_META_" + n); ok {
			parts = append(parts, fmt.Sprintf("STORMGUARD_LIVE_META_%s=%s", n, strconv.Quote(v)))
		}
	}
	return strings.Join(parts, " ")
}

// metaEnv reads the settings from the environment.
func metaEnv() (metaParams, []float64, []live.Trigger, error) {
	p := defaultMetaParams()
	rhos := []float64{0.9}
	triggers := []live.Trigger{live.Trigger503, live.TriggerSlow, live.TriggerHang}
	get := func(n string) string { return os.Getenv("STORMGUARD_LIVE_META_" + n) }
	if v := get("RHO"); v != "" {
		rhos = nil
		for _, f := range strings.Split(v, ",") {
			rho, err := strconv.ParseFloat(strings.TrimSpace(f), 64)
			if err != nil || !(rho > 0 && rho < 1) {
				return p, nil, nil, fmt.Errorf("STORMGUARD_LIVE_META_RHO=%q: want numbers in (0, 1)", v)
			}
			rhos = append(rhos, rho)
		}
	}
	if v := get("TRIGGERS"); v != "" {
		triggers = nil
		for _, f := range strings.Split(v, ",") {
			switch strings.TrimSpace(f) {
			case "503":
				triggers = append(triggers, live.Trigger503)
			case "hang":
				triggers = append(triggers, live.TriggerHang)
			case "slow", "x5":
				triggers = append(triggers, live.TriggerSlow)
			default:
				return p, nil, nil, fmt.Errorf("STORMGUARD_LIVE_META_TRIGGERS=%q: want 503, slow or hang", v)
			}
		}
	}
	for _, n := range []struct {
		name string
		into *int
	}{{"TERMINALS", &p.terminals}, {"WORKERS", &p.workers}} {
		if v := get(n.name); v != "" {
			i, err := strconv.Atoi(v)
			if err != nil || i <= 0 {
				return p, nil, nil, fmt.Errorf("STORMGUARD_LIVE_META_%s=%q: want a positive integer", n.name, v)
			}
			*n.into = i
		}
	}
	for _, d := range []struct {
		name string
		into *time.Duration
	}{{"WORK", &p.work}, {"QUEUE", &p.queue}, {"DURATION", &p.duration}, {"AT", &p.at}, {"FOR", &p.of}, {"DEADLINE", &p.deadline}} {
		if v := get(d.name); v != "" {
			x, err := time.ParseDuration(v)
			if err != nil || x <= 0 {
				return p, nil, nil, fmt.Errorf("STORMGUARD_LIVE_META_%s=%q: want a positive duration", d.name, v)
			}
			*d.into = x
		}
	}
	return p, rhos, triggers, nil
}

// metaRow is one measured row.
type metaRow struct {
	setup  metaSetup
	result *live.Result
	meta   live.Meta
	load   string
	note   string // what the setup said after the run
}

// triggerName says what the trigger was.
func triggerName(pc live.ProviderConfig) string {
	switch pc.Trigger {
	case live.TriggerHang:
		return fmt.Sprintf("hang from %v to %v", pc.FailAt, pc.FailAt+pc.FailFor)
	case live.TriggerSlow:
		by := pc.SlowBy
		if by == 0 {
			by = 5 // the provider's default
		}
		return fmt.Sprintf("service time x%g from %v to %v", by, pc.FailAt, pc.FailAt+pc.FailFor)
	}
	return fmt.Sprintf("503 from %v to %v", pc.FailAt, pc.FailAt+pc.FailFor)
}

// recoverText is the recovery column.
func recoverText(m live.Meta) string {
	switch {
	case m.NoData:
		return "no data"
	case !m.Recovered:
		return "stuck"
	}
	return fmt.Sprintf("%.0f s", m.RecoverAfter.Seconds())
}

// pct formats a share as a percentage, "-" for NaN.
func pct(x float64) string {
	if math.IsNaN(x) {
		return "-"
	}
	return fmt.Sprintf("%.1f%%", 100*x)
}

// metaLine is one row in a line, for the log as the run goes.
func metaLine(row metaRow) string {
	m := row.meta
	return fmt.Sprintf("%s: goodput %s / %s / %s / %s, attempts per call %.2f during, %.2f after, wasted %s, recover %s, load %s",
		row.setup.name, pct(m.GoodBefore), pct(m.GoodDuring), pct(m.GoodAfter), pct(m.GoodRest),
		m.AttemptsDuring, m.AttemptsAfter, pct(m.Wasted), recoverText(m), row.load)
}

// spark draws per-second goodput as one character per second.
func spark(xs []float64) string {
	const levels = "▁▂▃▄▅▆▇█"
	var b strings.Builder
	r := []rune(levels)
	for _, x := range xs {
		if x < 0 {
			b.WriteString(" ")
			continue
		}
		b.WriteRune(r[min(int(x*float64(len(r))), len(r)-1)])
	}
	return b.String()
}

// metaTable formats one scenario's rows as Markdown, with the targets of
// the stormguard rows checked.
func metaTable(rho float64, pc live.ProviderConfig, fc live.FleetConfig, rows []metaRow, admit bool) string {
	var b strings.Builder
	mu := float64(pc.Capacity) / pc.Work.Seconds()
	with := "without admission"
	if admit {
		with = "with admission (metaAdmission)"
	}
	fmt.Fprintf(&b, "#### rho %.2f, %s; provider %s, %d workers x %v (mu %.0f/s), queue %d (%.1f s of work); %d terminals x 1 payment every %v (%.0f/s), attempt timeout %v, deadline %v, run %v\n\n",
		rho, triggerName(pc), with, pc.Capacity, pc.Work, mu, pc.Queue, float64(pc.Queue)/mu, fc.Clients, fc.Every.Round(time.Millisecond),
		float64(fc.Clients)/fc.Every.Seconds(), metaAttemptTimeout, fc.Deadline, fc.Duration)
	b.WriteString("| client | goodput before | during | first 10 s after | rest | attempts / payment during | after | wasted after | recovered after the trigger | shed after end+5 s | p99 | load avg | late p99 |\n")
	b.WriteString("|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|\n")
	for _, row := range rows {
		m, s := row.meta, row.result.Summary
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %.2f | %.2f | %s | %s | %d | %s | %s | %s |\n",
			row.setup.name, pct(m.GoodBefore), pct(m.GoodDuring), pct(m.GoodAfter), pct(m.GoodRest),
			m.AttemptsDuring, m.AttemptsAfter, pct(m.Wasted), recoverText(m), m.ShedLate, fmtLatency(s.P99), row.load, fmtLatency(s.LateP99))
	}
	b.WriteString("\nGoodput of the payments started in each second (one character per second, ▁ 0-12% … █ 88-100%):\n\n```\n")
	for _, row := range rows {
		fmt.Fprintf(&b, "%-58s %s\n", row.setup.name, spark(row.meta.PerSecond))
	}
	b.WriteString("```\n\nTargets (issue 20's must-hold, for the stormguard rows):\n\n")
	mark := func(ok bool) string {
		if ok {
			return "met"
		}
		return "MISSED"
	}
	within := 5 * time.Second
	if rho > 0.9 {
		within = 10 * time.Second
	}
	for _, row := range rows {
		if !row.setup.stormguard {
			continue
		}
		m := row.meta
		fmt.Fprintf(&b, "- %s: <= 1.1 attempts per payment during %s (%.2f); recovered within %v and held %s (%s); wasted <= 1%% %s (%s); "+
			"nothing shed from end+5 s %s (%d); served >= 90%% of the bound %.2f of the trigger's payments %s (%s)\n",
			row.setup.name, mark(m.AttemptsDuring <= 1.1), m.AttemptsDuring, within, mark(m.Recovered && m.RecoverAfter <= within), recoverText(m),
			mark(m.Wasted <= 0.01), pct(m.Wasted), mark(m.ShedLate == 0), m.ShedLate, m.Bound, mark(m.GoodDuring >= 0.9*m.Bound), pct(m.GoodDuring))
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
	return b.String()
}
