package sim

import (
	"bufio"
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"time"
)

// The outage experiment's results: the figures of a run and the tables.

// OutageResult is the outcome of [Outage].
type OutageResult struct {
	// Config is the configuration that ran, with defaults filled in.
	Config OutageConfig `json:"config"`
	// Policies holds one result per policy, in the config's order.
	Policies []OutagePolicyResult `json:"results"`
}

// OutagePolicyResult is what one policy's fleet did to the provider and
// what it got back. "Attempts" are tries that reached the provider; tries
// an open breaker rejected or a budget refused never do.
type OutagePolicyResult struct {
	// Policy is the policy that ran.
	Policy OutagePolicy `json:"policy"`

	// Offered is the number of original requests (not retries) sent over
	// the horizon; Attempts is the attempts that reached the provider.
	Offered  int `json:"offered"`
	Attempts int `json:"attempts"`
	// Amplification is Attempts/Offered.
	Amplification float64 `json:"amplification"`

	// OutageOffered and OutageAttempts count the same during the trigger,
	// [TriggerStart, TriggerEnd); OutageAmplification is their ratio.
	OutageOffered       int     `json:"outage_offered"`
	OutageAttempts      int     `json:"outage_attempts"`
	OutageAmplification float64 `json:"outage_amplification"`

	// Peak is the largest number of attempts in one Window, and PeakAt
	// the start of the first window that holds it.
	Peak   int           `json:"peak"`
	PeakAt time.Duration `json:"peak_at_ns"`

	// Succeeded is the original requests that succeeded (on any attempt);
	// Goodput is Succeeded/Offered. Requests still pending at the horizon
	// count as failed.
	Succeeded int     `json:"succeeded"`
	Goodput   float64 `json:"goodput"`
	// OutageSucceeded is the original requests made during the trigger
	// that succeeded (during it or after), and OutageGoodput their share
	// of OutageOffered: what patience buys.
	OutageSucceeded int     `json:"outage_succeeded"`
	OutageGoodput   float64 `json:"outage_goodput"`
	// AfterGoodput is the goodput of the original requests sent after the
	// trigger ended: near 1 if the provider recovered at once, near 0 if it
	// stayed down.
	AfterGoodput float64 `json:"after_goodput"`
	// P50 and P99 are the median and the 99th percentile of the time from
	// a request's arrival to its success, over the requests that
	// succeeded (0 if none did).
	P50 time.Duration `json:"p50_ns"`
	P99 time.Duration `json:"p99_ns"`

	// Recovered reports whether the provider recovered (see
	// OutageConfig.RecoveryWindow) within the horizon, and RecoverAfter
	// how long after TriggerEnd; RecoverAfter is 0 when Recovered is false.
	Recovered    bool          `json:"recovered"`
	RecoverAfter time.Duration `json:"recover_after_ns"`

	// Retries is the attempts that were retries (Attempts minus the first
	// attempts that were sent).
	Retries int `json:"retries"`
	// BudgetDenied is the retries a budget refused; BreakerRejected the
	// requests that ended because of the breaker (rejected at once, or
	// after waiting until their deadline); Waited the times a request
	// began to wait behind the breaker; DeadlineExceeded the requests that
	// ran out of deadline otherwise; Shed the attempts the provider shed
	// with a full queue; and TimedOut the attempts whose client stopped
	// waiting for the answer (Timeout).
	BudgetDenied     int `json:"budget_denied"`
	BreakerRejected  int `json:"breaker_rejected"`
	Waited           int `json:"waited"`
	DeadlineExceeded int `json:"deadline_exceeded"`
	Shed             int `json:"shed"`
	TimedOut         int `json:"timed_out"`
	// LimitWaited is the times an attempt waited for its client's
	// concurrency limiter (policies with Limit), and LimitRefused the
	// requests that ended because the limiter refused them (at once, or
	// while they waited, when they could not make their deadline).
	LimitWaited  int `json:"limit_waited,omitempty"`
	LimitRefused int `json:"limit_refused,omitempty"`

	// Phases are the figures of the metastability matrix ([Meta]).
	Phases Phases `json:"phases"`

	// Load is the attempts that reached the provider in each Window, from
	// t=0; Successes is, per window of arrival, the attempts that
	// succeeded.
	Load      []int `json:"load"`
	Successes []int `json:"successes"`
	// Arrivals is the original requests that arrived in each window, and
	// Done those that succeeded, per window of their success.
	Arrivals []int `json:"arrivals"`
	Done     []int `json:"done"`
}

// finish computes the summary figures from the counters.
func (r *outRun) finish() {
	c, res := r.c, &r.res
	ratio := func(a, b int) float64 {
		if b == 0 {
			return 0
		}
		return float64(a) / float64(b)
	}
	res.Amplification = ratio(res.Attempts, res.Offered)
	res.OutageAmplification = ratio(res.OutageAttempts, res.OutageOffered)
	res.Goodput = ratio(res.Succeeded, res.Offered)
	res.OutageGoodput = ratio(res.OutageSucceeded, res.OutageOffered)
	for w, n := range res.Load {
		if n > res.Peak {
			res.Peak, res.PeakAt = n, time.Duration(w)*c.Window
		}
	}
	if n := len(r.latency); n > 0 {
		slices.Sort(r.latency)
		res.P50 = r.latency[(n-1)/2]
		res.P99 = r.latency[int(math.Ceil(0.99*float64(n)))-1]
	}
	from := int((c.TriggerEnd + c.Window - 1) / c.Window)
	var after, afterOK int
	for w := from; w < len(r.offeredW); w++ {
		after += r.offeredW[w]
		afterOK += r.okW[w]
	}
	res.AfterGoodput = ratio(afterOK, after)
	// Recovered from the earliest window w >= from such that every
	// recovery window starting at w or later (and ending by the horizon)
	// meets the ratio: found scanning backwards from the last one.
	span := int(c.RecoveryWindow / c.Window)
	rec := -1
	for w := len(r.offeredW) - span; w >= from; w-- {
		var n, ok int
		for k := w; k < w+span; k++ {
			n += r.offeredW[k]
			ok += r.okW[k]
		}
		if float64(ok) < c.RecoveryRatio*float64(n) {
			break
		}
		if n > 0 {
			rec = w
		}
	}
	switch {
	case rec >= 0:
		res.Recovered = true
		res.RecoverAfter = time.Duration(rec)*c.Window - c.TriggerEnd
	case after == 0:
		// Nothing was asked after the trigger: nothing failed either (as
		// sim meta reports it), not the metastable failure "never" means.
		res.Recovered = true
	}
	r.phases()
	res.Arrivals, res.Done = r.offeredW, r.doneW
}

// WriteText writes the result as a table, one row per policy.
func (r *OutageResult) WriteText(w io.Writer) error {
	c := r.Config
	bw := bufio.NewWriter(w)
	fmt.Fprintf(bw, "fleet: %d clients x %g req/s = %g req/s offered, deadline %v; provider: %g req/s, queue %d, client timeout %v\n",
		c.Clients, c.RatePerClient, float64(c.Clients)*c.RatePerClient, c.Deadline, c.Capacity, c.Queue, c.Timeout)
	fmt.Fprintf(bw, "trigger: 503 (Retry-After %v) from %v to %v; horizon %v, windows of %v, fleet sync every %v, seed %d\n\n",
		c.RetryAfter, c.TriggerStart, c.TriggerEnd, c.Horizon, c.Window, c.SyncEvery, c.Seed)
	name := len("policy")
	for _, p := range r.Policies {
		name = max(name, len(p.Policy.Name))
	}
	fmt.Fprintf(bw, "%-*s %9s %13s %10s %8s %10s %8s %8s %10s\n", name, "policy", "peak/win", "attempts/off", "in outage",
		"goodput", "outage gp", "after", "p99", "recovered")
	for _, p := range r.Policies {
		rec := "never"
		if p.Recovered {
			rec = fmt.Sprintf("+%v", p.RecoverAfter)
		}
		fmt.Fprintf(bw, "%-*s %9d %12.2fx %9.2fx %7.1f%% %9.1f%% %7.1f%% %8s %10s\n", name, p.Policy.Name, p.Peak,
			p.Amplification, p.OutageAmplification, 100*p.Goodput, 100*p.OutageGoodput, 100*p.AfterGoodput, p99Text(p.Succeeded, p.P99), rec)
	}
	fmt.Fprintf(bw, "\n%s\nspan of %v (window-aligned, to the horizon) at least %g%% of the requests made in it succeed\n", strings.TrimSpace(`
peak/win: most attempts at the provider in one window; attempts/off: attempts per original request
over the horizon; in outage: the same during the trigger; goodput: original requests that succeeded;
outage gp: goodput of the requests made during the trigger; after: goodput of requests made after it;
p99: 99th percentile of the time to success ("-": none succeeded); recovered: time after the trigger from which, in every`), c.RecoveryWindow, 100*c.RecoveryRatio)
	fmt.Fprintf(bw, "\n%s\n", strings.TrimSpace(`
rows: fixed-1s retries every 1 s (a naive loop); exponential, full: backoff without, with jitter;
+budget, +breaker, +retry-after: each client's own retry budget, circuit breaker and the provider's
Retry-After; +wait: calls wait behind the open breaker and are released at the rate before the trip,
on top of the new load, so the provider's queue stays full after the trigger ("never"); fleet: one
budget and breaker for all clients; +limit (recommended): each client's concurrency limiter sends
what the provider serves, so the provider recovers and the outage's requests are served.`))
	return bw.Flush()
}

// WriteLoad writes the load over time as a table: one row per interval of
// length every (from t=0), one column per policy, each cell the attempts
// that reached the provider in that interval. every must be a positive
// multiple of the config's Window; otherwise WriteLoad writes nothing and
// returns an error wrapping [ErrInvalidConfig].
func (r *OutageResult) WriteLoad(w io.Writer, every time.Duration) error {
	c := r.Config
	if every <= 0 || every%c.Window != 0 {
		return fmt.Errorf("%w: interval %v must be a positive multiple of the window %v", ErrInvalidConfig, every, c.Window)
	}
	step := int(every / c.Window)
	bw := bufio.NewWriter(w)
	fmt.Fprintf(bw, "attempts at the provider per %v (trigger from %v to %v)\n%8s", every, c.TriggerStart, c.TriggerEnd, "t")
	width := make([]int, len(r.Policies))
	for i, p := range r.Policies {
		width[i] = max(len(p.Policy.Name), 7)
		fmt.Fprintf(bw, " %*s", width[i], p.Policy.Name)
	}
	fmt.Fprintln(bw)
	windows := 0
	for _, p := range r.Policies {
		windows = max(windows, len(p.Load))
	}
	for from := 0; from < windows; from += step {
		fmt.Fprintf(bw, "%8v", time.Duration(from)*c.Window)
		for i, p := range r.Policies {
			n := 0
			for k := from; k < from+step && k < len(p.Load); k++ {
				n += p.Load[k]
			}
			fmt.Fprintf(bw, " %*d", width[i], n)
		}
		fmt.Fprintln(bw)
	}
	return bw.Flush()
}

// p99Text is the p99 column's cell: the time in seconds, or "-" when no
// request succeeded (there is no time to success to rank).
func p99Text(succeeded int, p99 time.Duration) string {
	if succeeded == 0 {
		return "-"
	}
	return fmt.Sprintf("%.1fs", p99.Seconds())
}
