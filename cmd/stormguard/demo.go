package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"text/tabwriter"
	"time"

	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/httpretry"
	"github.com/stormguard/stormguard/internal/sim/live"
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
}

// Limits of `demo`. The demo runs in real time, three runs of about
// duration + deadline each, so those two bound its length (about two
// minutes at most; 30 s with the defaults). The offered load and the calls
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
	var out output
	fs := newFlagSet("demo",
		"A real HTTP provider on loopback, with finite capacity and a queue, fails with 503 for a\n"+
			"few seconds while a real fleet of goroutine clients sends it a steady load, four times:\n"+
			"a naive client (a fixed-interval retry loop); stormguard's transport, one per client\n"+
			"(defaults: 3 attempts, full jitter, retry budget, circuit breaker); the same against 503s\n"+
			"that carry Retry-After; and one stormguard transport for the whole fleet (a gateway), whose\n"+
			"breaker opens, makes the calls wait instead of failing, probes about every second and\n"+
			"releases the waiting calls at the pace the provider served before the outage. Load is\n"+
			"measured at the server per window. About 40 s with the defaults.",
		fmt.Sprintf("clients / every at most %d requests per second; that rate x deadline at most %d calls in\n"+
			"flight. Four runs of about duration + deadline each: at most about three minutes.", maxDemoRate, maxDemoInFlight), e)
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
	fs.StringVar(&c.Metrics, "metrics", "", "serve the stormguard transports' metrics for Prometheus at ADDR/metrics while the demo runs (e.g. :9464)")
	out.register(fs)
	if err := fs.parse(args); err != nil {
		return nil, err
	}
	if err := out.validate(); err != nil {
		return nil, err
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
	var ln net.Listener
	if c.Metrics != "" {
		var err error
		if ln, err = net.Listen("tcp", c.Metrics); err != nil {
			return nil, usageError{fmt.Errorf("-metrics %s: %w", c.Metrics, err)}
		}
	}
	return func() error { return runDemo(c, out, opts, ln, e) }, nil
}

// runDemo runs the four runs of the demo and writes the result.
func runDemo(c demoConfig, out output, opts []httpretry.Option, metrics net.Listener, e *env) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if metrics != nil {
		opt, stopMetrics, err := serveMetrics(metrics)
		if err != nil {
			_ = metrics.Close()
			return err
		}
		defer stopMetrics()
		opts = append(opts, opt)
		fmt.Fprintf(e.stderr, "serving metrics at http://%s/metrics\n", metrics.Addr())
	}

	base := &http.Transport{MaxIdleConns: maxDemoConns, MaxIdleConnsPerHost: maxDemoConns, MaxConnsPerHost: maxDemoConns,
		IdleConnTimeout: 30 * time.Second}
	defer base.CloseIdleConnections()
	plain := &http.Client{Transport: base, Timeout: c.Timeout}
	naive := func(url string, _ int) live.Call { return live.Naive(plain, url, c.NaiveEvery, c.NaiveTries) }
	var shared *http.Client // the gateway's client, for the run that has one
	perClient := func(url string, _ int) live.Call {
		t, err := httpretry.NewTransport(base, opts...)
		if err != nil { // checked by prepareDemo
			return func(context.Context) error { return err }
		}
		return live.Get(&http.Client{Transport: t}, url)
	}
	gateway := func(url string, _ int) live.Call {
		if shared == nil {
			t, err := httpretry.NewTransport(base, opts...)
			if err != nil { // checked by prepareDemo
				return func(context.Context) error { return err }
			}
			shared = &http.Client{Transport: t}
		}
		return live.Get(shared, url)
	}
	fc := live.FleetConfig{Clients: c.Clients, Every: c.Every, Duration: c.Duration, Deadline: c.Deadline}
	pc := live.ProviderConfig{FailAt: c.FailAt, FailFor: c.FailFor, Window: c.Window, Horizon: c.Duration + c.Deadline,
		Capacity: c.Capacity, Queue: c.Queue, Work: c.Work}
	withRA := pc
	withRA.RetryAfter = c.RetryAfter
	runs := []struct {
		name string
		pc   live.ProviderConfig
		call func(string, int) live.Call
	}{
		{fmt.Sprintf("naive (every %v), 503", c.NaiveEvery), pc, naive},
		{"stormguard per client, 503", pc, perClient},
		{fmt.Sprintf("stormguard per client, 503 + Retry-After %v", c.RetryAfter), withRA, perClient},
		{"stormguard gateway (one transport), 503", pc, gateway},
	}
	progress := e.progress(out.quiet, "demo")
	res := demoResult{Config: c}
	for i, r := range runs {
		shared = nil
		if progress != nil {
			progress(i, len(runs))
		}
		lr, err := live.Run(ctx, r.name, r.pc, fc, r.call)
		if err != nil {
			return err
		}
		res.Runs = append(res.Runs, lr)
		base.CloseIdleConnections() // the next run starts with a fresh server
	}
	if progress != nil {
		progress(len(runs), len(runs))
	}
	return emit(e, out, &res, func(file string) error { return demoChart(&res, file) })
}

// WriteText writes the side-by-side table.
func (r *demoResult) WriteText(w io.Writer) error {
	c := r.Config
	fmt.Fprintf(w, "live on loopback: %d clients x 1 request every %v (%.0f req/s offered) for %v;\n",
		c.Clients, c.Every, float64(c.Clients)/c.Every.Seconds(), c.Duration)
	fmt.Fprintf(w, "the provider serves %d requests at once, %v each (%.0f req/s at most), queues %d more (served even\n"+
		"after their client timed out at %v), sheds the rest with 503,\n",
		c.Capacity, c.Work, float64(c.Capacity)/c.Work.Seconds(), c.Queue, c.Timeout)
	fmt.Fprintf(w, "and answers 503 to everything from %v to %v; attempts counted at the server per %v window;\n", c.FailAt, c.FailAt+c.FailFor, c.Window)
	fmt.Fprintf(w, "stormguard: default transport (3 attempts, full jitter, budget, breaker probing every %v),\n"+
		"one per client or one for the fleet; every request has a %v deadline\n\n", c.OpenFor, c.Deadline)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "client, provider\toffered\tattempts\tin outage / offered\tpeak per window\tgoodput\tstarted in outage: ok\tshed after\t")
	for _, run := range r.Runs {
		s := run.Summary
		fmt.Fprintf(tw, "%s\t%d\t%d\t%.2fx\t%d\t%.1f%%\t%.1f%%\t%d\t\n", run.Name, run.Stats.Offered, s.Attempts,
			s.OutageAmplification, s.Peak, 100*s.Goodput, 100*s.OutageGoodput, s.ShedAfter)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	_, err := fmt.Fprintf(w, "\nin outage / offered: attempts that reached the provider during the outage per request the\n"+
		"fleet offered in that time; goodput: requests that ended in success; started in outage: ok:\n"+
		"the same for the requests started during the outage; shed after: attempts the provider shed\n"+
		"once the outage was over.\n")
	return err
}

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
	p := panel{title: "attempts reaching the provider", xLabel: "time (s)", height: 12 * vg.Centimeter,
		yLabel: "attempts per " + fmtDuration(r.Config.Window*time.Duration(k))}
	for i, run := range r.Runs {
		p.lines = append(p.lines, windowSeries(run.Name, r.Config.Window, counts[i], k))
	}
	return drawPanels(file, fmt.Sprintf("live: %d clients, 503 from %v to %v, load at the server",
		r.Config.Clients, r.Config.FailAt, r.Config.FailAt+r.Config.FailFor), []panel{p})
}
