package main

import (
	"context"
	"fmt"
	"io"
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
	Shared     bool          `json:"shared_transport"`
	OpenFor    time.Duration `json:"breaker_open_for_ns"`
	Capacity   int           `json:"capacity"`
	Queue      int           `json:"queue"`
	Timeout    time.Duration `json:"attempt_timeout_ns"`
	Work       time.Duration `json:"work_ns"`
}

// demoResult is what `stormguard demo --json` prints.
type demoResult struct {
	Config demoConfig     `json:"config"`
	Runs   []*live.Result `json:"runs"`
}

func runDemo(args []string, e *env) error {
	c := demoConfig{
		Clients: 200, Every: 200 * time.Millisecond, Duration: 7 * time.Second,
		FailAt: 2 * time.Second, FailFor: 2 * time.Second, RetryAfter: 2 * time.Second,
		Window: 50 * time.Millisecond, NaiveEvery: time.Second, NaiveTries: 5, Deadline: 15 * time.Second,
		OpenFor: 2 * time.Second, Capacity: 25, Queue: 2500, Work: 20 * time.Millisecond, Timeout: time.Second,
	}
	var out output
	fs := newFlagSet("demo",
		"A real HTTP provider on loopback, with finite capacity and a queue, fails with 503 for a\n"+
			"few seconds while a real fleet of goroutine clients sends it a steady load, three times:\n"+
			"a naive client (a fixed-interval retry loop), stormguard's transport (defaults: 3 attempts,\n"+
			"full jitter, retry budget, circuit breaker), and stormguard's transport against 503s that\n"+
			"carry Retry-After. Load is measured at the server per window. About 30 s with the defaults.", e)
	fs.IntVar(&c.Clients, "clients", c.Clients, "clients in the fleet")
	fs.DurationVar(&c.Every, "every", c.Every, "interval between a client's requests")
	fs.DurationVar(&c.Duration, "duration", c.Duration, "how long each run sends new requests")
	fs.DurationVar(&c.FailAt, "fail-at", c.FailAt, "when the provider starts failing, from the run's start")
	fs.DurationVar(&c.FailFor, "fail-for", c.FailFor, "how long it fails")
	fs.DurationVar(&c.RetryAfter, "retry-after", c.RetryAfter, "Retry-After sent in the runs that send one")
	fs.DurationVar(&c.Window, "window", c.Window, "width of a counting window at the server")
	fs.DurationVar(&c.NaiveEvery, "naive-every", c.NaiveEvery, "the naive client's fixed retry interval")
	fs.IntVar(&c.NaiveTries, "naive-tries", c.NaiveTries, "the naive client's tries per request")
	fs.DurationVar(&c.Deadline, "deadline", c.Deadline, "deadline of each request, retries included")
	fs.DurationVar(&c.OpenFor, "open-for", c.OpenFor, "the stormguard breaker's open period (the library's default is 30s,\nwhich would outlast this demo's outage: every request after it would fail fast)")
	fs.IntVar(&c.Capacity, "capacity", c.Capacity, "requests the provider works on at once; more are shed with 503 (0: unlimited)")
	fs.IntVar(&c.Queue, "queue", c.Queue, "requests that may wait for the provider; it serves them even if their client gave up")
	fs.DurationVar(&c.Work, "work", c.Work, "time the provider spends on a request")
	fs.DurationVar(&c.Timeout, "attempt-timeout", c.Timeout, "how long a client waits for one attempt's answer (both clients)")
	fs.BoolVar(&c.Shared, "shared", false, "one stormguard transport (one budget and breaker) for the whole fleet instead of one per client")
	out.register(fs)
	if err := fs.parse(args); err != nil {
		return err
	}
	if err := out.validate(); err != nil {
		return err
	}
	switch {
	case c.Clients <= 0 || c.Clients > 5000:
		return usageError{fmt.Errorf("-clients %d must be in [1, 5000]", c.Clients)}
	case c.Every <= 0 || c.Duration <= 0 || c.Window <= 0 || c.NaiveEvery <= 0 || c.Deadline <= 0 || c.OpenFor <= 0:
		return usageError{fmt.Errorf("-every, -duration, -window, -naive-every, -deadline and -open-for must be positive")}
	case c.Duration > 10*time.Minute:
		return usageError{fmt.Errorf("-duration %v is above 10m", c.Duration)}
	case c.NaiveTries < 1 || c.FailAt < 0 || c.FailFor < 0 || c.RetryAfter < 0 || c.Capacity < 0 || c.Queue < 0 || c.Work < 0 || c.Timeout < 0:
		return usageError{fmt.Errorf("-naive-tries must be positive and -fail-at, -fail-for, -retry-after, -capacity, -queue, -work, -attempt-timeout not negative")}
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()

	base := &http.Transport{MaxIdleConns: 4096, MaxIdleConnsPerHost: 4096, IdleConnTimeout: 30 * time.Second}
	defer base.CloseIdleConnections()
	plain := &http.Client{Transport: base, Timeout: c.Timeout}
	naive := func(url string, _ int) live.Call { return live.Naive(plain, url, c.NaiveEvery, c.NaiveTries) }
	var shared *http.Client
	guarded := func(url string, _ int) live.Call {
		if c.Shared && shared != nil {
			return live.Get(shared, url)
		}
		bc := breaker.DefaultConfig()
		bc.OpenFor = c.OpenFor
		opts := []httpretry.Option{httpretry.WithBreaker(bc)}
		if c.Timeout > 0 {
			opts = append(opts, httpretry.WithAttemptTimeout(c.Timeout))
		}
		t, err := httpretry.NewTransport(base, opts...)
		if err != nil {
			panic(err) // validated above
		}
		cl := &http.Client{Transport: t}
		if c.Shared {
			shared = cl
		}
		return live.Get(cl, url)
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
		{"stormguard, 503", pc, guarded},
		{fmt.Sprintf("stormguard, 503 + Retry-After %v", c.RetryAfter), withRA, guarded},
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
	scope := "per client"
	if c.Shared {
		scope = "one for the fleet"
	}
	fmt.Fprintf(w, "stormguard: default transport (3 attempts, full jitter, budget, breaker) %s, breaker open for %v\n\n", scope, c.OpenFor)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "client, provider\toffered\tattempts\tin outage / offered\tpeak per window\tgoodput\t")
	for _, run := range r.Runs {
		s := run.Summary
		fmt.Fprintf(tw, "%s\t%d\t%d\t%.2fx\t%d\t%.1f%%\t\n", run.Name, run.Stats.Offered, s.Attempts,
			s.OutageAmplification, s.Peak, 100*s.Goodput)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	_, err := fmt.Fprintf(w, "\nin outage / offered: attempts that reached the provider during the outage per request the\n"+
		"fleet offered in that time; goodput: requests that ended in success.\n")
	return err
}

func demoChart(r *demoResult, file string) error {
	p := panel{title: "attempts reaching the provider", xLabel: "time (s)", yLabel: "attempts per " + r.Config.Window.String(),
		height: 12 * vg.Centimeter}
	for _, run := range r.Runs {
		s := series{name: run.Name}
		last := 0
		for j, w := range run.Windows {
			if w.Attempts > 0 {
				last = j
			}
		}
		for _, w := range run.Windows[:last+1] {
			s.x = append(s.x, w.Start.Seconds())
			s.y = append(s.y, float64(w.Attempts))
		}
		p.lines = append(p.lines, s)
	}
	return drawPanels(file, fmt.Sprintf("live: %d clients, 503 from %v to %v, load at the server",
		r.Config.Clients, r.Config.FailAt, r.Config.FailAt+r.Config.FailFor), []panel{p})
}
