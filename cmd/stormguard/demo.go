package main

import (
	"fmt"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/cmd/stormguard/internal/live"
	"github.com/stormguard/stormguard/httpretry"
	"gonum.org/v1/plot/vg"
)

// demoConfig is the live demo's settings.
type demoConfig struct {
	Clients    int           `json:"clients"`
	Every      time.Duration `json:"every_ns"`
	Duration   time.Duration `json:"duration_ns"`
	FailAt     time.Duration `json:"fail_at_ns"`
	FailFor    time.Duration `json:"fail_for_ns"`
	RetryAfter time.Duration `json:"retry_after_ns"`
	Window     time.Duration `json:"window_ns"`
	NaiveEvery time.Duration `json:"naive_every_ns"`
	NaiveTries int           `json:"naive_tries"`
	Deadline   time.Duration `json:"deadline_ns"`
	OpenFor    time.Duration `json:"breaker_open_for_ns"`
	Capacity   int           `json:"capacity"`
	Queue      int           `json:"queue"`
	Timeout    time.Duration `json:"attempt_timeout_ns"`
	Work       time.Duration `json:"work_ns"`
	Metrics    string        `json:"metrics,omitempty"`
}

// demoResult is what `stormguard demo --json` prints.
type demoResult struct {
	Config demoConfig     `json:"config"`
	Runs   []*live.Result `json:"runs"`
	// wide prints the details after the headline (--wide).
	wide bool
}

// Limits of `demo`. The demo runs in real time, four runs of about
// duration + deadline each, so those two bound its length (2 min 40 s at
// most; about 45 s with the defaults). The offered load and the calls
// it can have in flight bound its goroutines and memory (a few hundred MB
// at the limit), and the connections to the provider are capped so that
// the two ends of them stay well within a process's open files.
const (
	maxDemoClients  = 5000
	maxDemoRun      = 20 * time.Second // duration, deadline, fail-at, fail-for
	maxDemoRate     = 2000             // requests per second offered: clients / every
	maxDemoInFlight = 20_000           // rate x deadline: calls that may be under way at once
	maxDemoConns    = 4096             // connections to the provider
)

func prepareDemo(args []string, e *env) (func() error, error) {
	c := demoConfig{
		Clients: 200, Every: 200 * time.Millisecond, Duration: 7 * time.Second,
		FailAt: 2 * time.Second, FailFor: 2 * time.Second, RetryAfter: 2 * time.Second,
		Window: 50 * time.Millisecond, NaiveEvery: time.Second, NaiveTries: 5, Deadline: 15 * time.Second,
		OpenFor: time.Second, Capacity: 25, Queue: 2500, Work: 20 * time.Millisecond, Timeout: time.Second,
	}
	var (
		out  output
		wide bool
		page string
	)
	fs := newFlagSet("demo",
		"A real HTTP provider on loopback, with finite capacity and a queue, fails with 503 for a\n"+
			"few seconds while a real fleet of goroutine clients sends it a steady load, four times:\n"+
			"a naive client (a fixed-interval retry loop); stormguard's transport, one per client\n"+
			"(defaults: 3 attempts, full jitter, retry budget, circuit breaker); the same against 503s\n"+
			"that carry Retry-After; and one stormguard transport for the whole fleet (a gateway) with\n"+
			"a learned concurrency limit per host: its breaker opens, makes the calls wait instead of\n"+
			"failing, probes about every second and releases the waiting calls at once, for the limit\n"+
			"to pace. Load is measured at the server per window. About 45 s with the defaults; it says\n"+
			"how long at the start. It prints a headline per run (the load on the provider during the\n"+
			"outage, the share of requests served) and the attempts per window as a sparkline; --wide\n"+
			"adds the table of every figure. --serve ADDR draws the runs as they happen on a page at\n"+
			"http://ADDR/ (its data at /data.json), which stays up after the runs until Ctrl-C. Ctrl-C\n"+
			"during the runs stops them, prints nothing more and exits with status 130.",
		fmt.Sprintf("clients / every at most %d requests per second; that rate x deadline at most %d calls in\n"+
			"flight; fail-at before duration. Four runs of about duration + deadline each: at most about three minutes.", maxDemoRate, maxDemoInFlight), e)
	fs.intVar(&c.Clients, "clients", 1, maxDemoClients, "clients in the fleet")
	fs.durationVar(&c.Every, "every", time.Millisecond, time.Minute, "interval between a client's requests")
	fs.durationVar(&c.Duration, "duration", time.Millisecond, maxDemoRun, "how long each run sends new requests")
	fs.durationVar(&c.FailAt, "fail-at", 0, maxDemoRun, "when the provider starts failing, from the run's start")
	fs.durationVar(&c.FailFor, "fail-for", 0, maxDemoRun, "how long it fails")
	fs.durationVar(&c.RetryAfter, "retry-after", 0, time.Minute, "Retry-After sent in the runs that send one")
	fs.durationVar(&c.Window, "window", time.Millisecond, 10*time.Second, "width of a counting window at the server")
	fs.durationVar(&c.NaiveEvery, "naive-every", time.Millisecond, time.Minute, "the naive client's fixed retry interval")
	fs.intVar(&c.NaiveTries, "naive-tries", 1, 100, "the naive client's tries per request")
	fs.durationVar(&c.Deadline, "deadline", time.Millisecond, maxDemoRun, "deadline of each request, retries included")
	fs.durationVar(&c.OpenFor, "open-for", time.Millisecond, time.Hour, "the stormguard breaker's probe interval: how long it stays open before it probes again")
	fs.intVar(&c.Capacity, "capacity", 0, 10_000, "requests the provider works on at once; more are shed with 503 (0: unlimited)")
	fs.intVar(&c.Queue, "queue", 0, 100_000, "requests that may wait for the provider; it serves them even if their client gave up")
	fs.durationVar(&c.Work, "work", 0, 10*time.Second, "time the provider spends on a request")
	fs.durationVar(&c.Timeout, "attempt-timeout", 0, time.Minute, "how long a client waits for one attempt's answer, both clients (0: no limit)")
	fs.StringVar(&c.Metrics, "metrics", "", "serve the demo's metrics for Prometheus at http://`ADDR`/metrics from the start, and after the runs until Ctrl-C (e.g. :9464)")
	fs.StringVar(&page, "serve", "", "serve a page that draws the runs as they happen at http://`ADDR`/ (e.g. localhost:8080)")
	fs.BoolVar(&wide, "wide", false, "print every figure as a table after the headline (wider than 100 columns)")
	out.register(fs)
	if err := fs.parse(args); err != nil {
		return nil, err
	}
	if err := out.validate(); err != nil {
		return nil, err
	}
	if c.FailAt >= c.Duration {
		return nil, usageError{fmt.Errorf("-fail-at %v must come before the end of the requests, -duration %v (an outage after them shows nothing)", fmtDuration(c.FailAt), fmtDuration(c.Duration))}
	}
	rate := float64(c.Clients) / c.Every.Seconds()
	if rate > maxDemoRate {
		return nil, usageError{fmt.Errorf("-clients %d / -every %v is %.0f requests per second, at most %d", c.Clients, fmtDuration(c.Every), rate, maxDemoRate)}
	}
	if n := rate * c.Deadline.Seconds(); n > maxDemoInFlight {
		return nil, usageError{fmt.Errorf("-clients %d / -every %v x -deadline %v is %.0f calls in flight, at most %d",
			c.Clients, fmtDuration(c.Every), fmtDuration(c.Deadline), n, maxDemoInFlight)}
	}
	opts := []httpretry.Option{httpretry.WithBreaker(&breaker.Config{OpenFor: c.OpenFor})}
	if c.Timeout > 0 {
		opts = append(opts, httpretry.WithAttemptTimeout(c.Timeout))
	}
	if _, err := httpretry.NewTransport(http.DefaultTransport, opts...); err != nil {
		return nil, usageError{err}
	}
	var ln, pageLn net.Listener
	if c.Metrics != "" {
		var err error
		if ln, err = net.Listen("tcp", c.Metrics); err != nil {
			return nil, usageError{fmt.Errorf("-metrics %s: %w", c.Metrics, err)}
		}
	}
	if page != "" {
		var err error
		if pageLn, err = net.Listen("tcp", page); err != nil {
			if ln != nil {
				ln.Close()
			}
			return nil, usageError{fmt.Errorf("-serve %s: %w", page, err)}
		}
	}
	return func() error { return runDemo(c, demoOutput{output: out, wide: wide}, opts, ln, pageLn, e) }, nil
}

// demoChart draws the attempts per window of every run, the outage
// shaded, the legend under the chart, stormguard's runs (those whose name
// starts with "stormguard") bold.
func demoChart(r *demoResult, file string) error {
	counts := make([][]int64, len(r.Runs))
	k := 1
	for i, run := range r.Runs {
		last := 0
		for j, w := range run.Windows {
			counts[i] = append(counts[i], w.Attempts)
			if w.Attempts > 0 {
				last = j
			}
		}
		counts[i] = counts[i][:min(last+1, len(counts[i]))]
		k = max(k, mergeFactor(len(counts[i])))
	}
	c := r.Config
	p := panel{title: "attempts reaching the provider", xLabel: "time (s)", height: 12 * vg.Centimeter,
		yLabel: "attempts per " + fmtDuration(c.Window*time.Duration(k)), legendBelow: true,
		shade: []span{{name: fmt.Sprintf("the outage: 503 to everything, %v to %v", fmtDuration(c.FailAt), fmtDuration(c.FailAt+c.FailFor)),
			from: c.FailAt.Seconds(), to: (c.FailAt + c.FailFor).Seconds()}}}
	for i, run := range r.Runs {
		s := windowSeries(run.Name, c.Window, counts[i], k)
		s.bold = strings.HasPrefix(run.Name, "stormguard")
		p.lines = append(p.lines, s)
	}
	return drawPanels(file, fmt.Sprintf("live: %d clients, 503 from %v to %v, load at the server",
		c.Clients, fmtDuration(c.FailAt), fmtDuration(c.FailAt+c.FailFor)), []panel{p})
}
