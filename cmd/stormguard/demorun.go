package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"time"

	"github.com/stormguard/stormguard/cmd/stormguard/internal/live"
	"github.com/stormguard/stormguard/httpretry"
	"github.com/stormguard/stormguard/limit"
)

// errInterrupted is what a command returns when Ctrl-C stopped its work:
// exit status 130 (128 + SIGINT, as a shell reports a process the signal
// ended), and no error line.
var errInterrupted = errors.New("interrupted")

// demoOutput is how the demo prints its result.
type demoOutput struct {
	output
	// wide adds the table of every figure after the headline.
	wide bool
}

// demoRun is one run of the demo: a client under test against a provider.
type demoRun struct {
	name     string
	provider live.ProviderConfig
	// newCall returns the call of client i to url. A stormguard client adds
	// the transports it makes to guards, so that the live page can show
	// their circuit breakers.
	newCall func(url string, client int, guards *guardWatch) live.Call
}

// demoRuns returns the runs of the demo, in order: a naive client, then
// stormguard's transports. Their clients send through base (the naive
// client through plainBase, if not nil).
func demoRuns(c demoConfig, opts []httpretry.Option, base, plainBase http.RoundTripper) []demoRun {
	if plainBase == nil {
		plainBase = base
	}
	plain := &http.Client{Transport: plainBase, Timeout: c.Timeout}
	naive := func(url string, _ int, _ *guardWatch) live.Call {
		return live.Naive(plain, url, c.NaiveEvery, c.NaiveTries)
	}
	transport := func(guards *guardWatch, more ...httpretry.Option) (*http.Client, error) {
		t, err := httpretry.NewTransport(base, append(opts[:len(opts):len(opts)], more...)...)
		if err != nil { // checked by prepareDemo
			return nil, err
		}
		guards.add(t)
		return &http.Client{Transport: t}, nil
	}
	perClient := func(url string, _ int, guards *guardWatch) live.Call {
		client, err := transport(guards)
		if err != nil {
			return func(context.Context) error { return err }
		}
		return live.Get(client, url)
	}
	// The gateway: one transport for the whole fleet, made by the first
	// client of each run (a run's clients are made one after another),
	// with a limiter per host asked for (package limit): one shared
	// transport is where a learned concurrency limit binds, and, asked
	// for, it paces the release of the calls that waited out the outage by
	// what the provider serves. (The per-client transports have the
	// default limiter each; with one request in flight each, it never
	// binds, and their breakers keep their paced release.)
	var shared *http.Client
	var sharedBy *guardWatch
	gateway := func(url string, _ int, guards *guardWatch) live.Call {
		if sharedBy != guards {
			client, err := transport(guards, httpretry.WithLimit(&limit.Config{}))
			if err != nil {
				return func(context.Context) error { return err }
			}
			shared, sharedBy = client, guards
		}
		return live.Get(shared, url)
	}
	pc := live.ProviderConfig{FailAt: c.FailAt, FailFor: c.FailFor, Window: c.Window, Horizon: c.Duration + c.Deadline,
		Capacity: c.Capacity, Queue: c.Queue, Work: c.Work}
	withRA := pc
	withRA.RetryAfter = c.RetryAfter
	return []demoRun{
		{fmt.Sprintf("naive (every %v), 503", c.NaiveEvery), pc, naive},
		{"stormguard per client, 503", pc, perClient},
		{fmt.Sprintf("stormguard per client, 503 + Retry-After %v", c.RetryAfter), withRA, perClient},
		{"stormguard gateway (one transport, limit), 503", pc, gateway},
	}
}

// runDemo runs the demo's runs one after another and writes the result,
// serving the metrics on metrics and the live page on page if they are not
// nil. Ctrl-C (or the end of e's context) stops it with errInterrupted;
// after the runs, with a page or metrics, it serves them until then and
// returns nil.
func runDemo(c demoConfig, out demoOutput, opts []httpretry.Option, metrics, page net.Listener, e *env) error {
	ctx, stop := signal.NotifyContext(e.context(), os.Interrupt)
	defer stop()
	base := &http.Transport{MaxIdleConns: maxDemoConns, MaxIdleConnsPerHost: maxDemoConns, MaxConnsPerHost: maxDemoConns,
		IdleConnTimeout: 30 * time.Second}
	defer base.CloseIdleConnections()
	var m *demoMetrics
	var plainBase http.RoundTripper
	if metrics != nil {
		m = serveMetrics(metrics)
		defer m.stop()
		opts = append(opts, httpretry.WithObserver(m.observer()))
		plainBase = m.observed(base)
	}
	runs := demoRuns(c, opts, base, plainBase)
	names := make([]string, len(runs))
	for i, r := range runs {
		names[i] = r.name
	}
	b := newBoard(c, names)
	var metricsURL string
	if m != nil {
		if err := m.setRuns(b); err != nil {
			return err
		}
		metricsURL = pageURL(metrics.Addr()) + "metrics"
		fmt.Fprintf(e.stderr, "serving metrics at %s, each run's series labelled stormguard_run, until Ctrl-C\n", metricsURL)
	}
	var url string
	if page != nil {
		defer servePage(page, b)()
		url = pageURL(page.Addr())
	}
	announce(e.stderr, c, names) // one line, not progress: --quiet keeps it
	if url != "" {
		fmt.Fprintf(e.stderr, "watch it at %s\n", url)
	}
	res, err := playDemo(ctx, c, runs, b, base, e.progressBar(out.quiet, "demo"))
	switch {
	case ctx.Err() != nil:
		return errInterrupted
	case err != nil:
		return err
	}
	b.done.Store(true)
	res.wide = out.wide
	if err := emit(e, out.output, res, func(file string) error { return demoChart(res, file) }); err != nil {
		return err
	}
	switch {
	case page != nil && m != nil:
		fmt.Fprintf(e.stderr, "the page stays up at %s and the metrics at %s until Ctrl-C\n", url, metricsURL)
	case page != nil:
		fmt.Fprintf(e.stderr, "the page stays up at %s until Ctrl-C\n", url)
	case m != nil:
		fmt.Fprintf(e.stderr, "the metrics stay up at %s until Ctrl-C\n", metricsURL)
	default:
		return nil
	}
	<-ctx.Done()
	return nil
}

// playDemo runs each run in turn, recording it on b.
func playDemo(ctx context.Context, c demoConfig, runs []demoRun, b *board, base *http.Transport, progress *progress) (*demoResult, error) {
	defer progress.clear()
	fc := live.FleetConfig{Clients: c.Clients, Every: c.Every, Duration: c.Duration, Deadline: c.Deadline}
	res := &demoResult{Config: c}
	for i, r := range runs {
		progress.set(i, len(runs))
		w := b.runs[i]
		w.guards = new(guardWatch)
		stop := make(chan struct{})
		lr, err := live.RunScenario(ctx, live.Scenario{
			Name: r.name, Provider: r.provider, Fleet: fc,
			NewCall: func(url string, client int) live.Call { return w.watchCall(r.newCall(url, client, w.guards)) },
			Started: func(p *live.Provider, start time.Time) { w.started(p, start, stop) },
		})
		close(stop)
		if err != nil {
			return nil, err
		}
		w.finished(lr)
		res.Runs = append(res.Runs, lr)
		base.CloseIdleConnections() // the next run starts with a fresh server
	}
	progress.set(len(runs), len(runs))
	return res, nil
}

// pageURL returns the address of a page served on addr: a listener on
// every interface (":8080") is reached at localhost.
func pageURL(addr net.Addr) string {
	host, port, err := net.SplitHostPort(addr.String())
	if err != nil {
		return "http://" + addr.String() + "/"
	}
	if ip := net.ParseIP(host); ip != nil && ip.IsUnspecified() {
		host = "localhost"
	}
	return "http://" + net.JoinHostPort(host, port) + "/"
}

// announce says what the demo will run and about how long it takes.
func announce(w io.Writer, c demoConfig, names []string) {
	n := time.Duration(len(names))
	// A run sends for Duration, then waits for its last calls. Their tail
	// is about the outage's length plus two attempt timeouts (the backlog
	// the outage leaves; 4-9 s with the defaults on the development
	// machine), and at most the deadline; then the provider stops, waiting
	// at most live.StopGrace for work still queued for callers who left.
	tail := min(c.Deadline, c.FailFor+2*max(c.Timeout, c.Work))
	about := (n * (c.Duration + tail)).Round(time.Second)
	most := (n * (c.Duration + c.Deadline + live.StopGrace)).Round(time.Second)
	text := fmt.Sprintf("stormguard demo: %d runs, one after another: %d clients send %.0f requests per second for %v to a "+
		"provider on loopback that answers 503 from %v to %v; each run ends when its last request does "+
		"(a %v deadline each): about %v in all, at most %v.",
		len(names), c.Clients, float64(c.Clients)/c.Every.Seconds(), fmtDuration(c.Duration),
		fmtDuration(c.FailAt), fmtDuration(c.FailAt+c.FailFor), fmtDuration(c.Deadline), fmtDuration(max(about, time.Second)),
		fmtDuration(most))
	for _, line := range wrap(text, maxColumns) {
		fmt.Fprintln(w, line)
	}
	for i, name := range names {
		fmt.Fprintln(w, clip(fmt.Sprintf("  %d %s", i+1, name), maxColumns))
	}
}

// wrap breaks text into lines of at most width columns at spaces.
func wrap(text string, width int) []string {
	var lines []string
	line := ""
	for _, word := range strings.Fields(text) {
		switch {
		case line == "":
			line = word
		case columns(line)+1+columns(word) <= width:
			line += " " + word
		default:
			lines = append(lines, clip(line, width))
			line = word
		}
	}
	if line != "" {
		lines = append(lines, clip(line, width))
	}
	return lines
}
