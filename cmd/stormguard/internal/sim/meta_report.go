package sim

import (
	"bufio"
	"fmt"
	"io"
	"strings"
	"time"
)

// The metastability matrix's tables.

// triggerWords describes trigger t of length d for a table's heading.
func triggerWords(t Trigger, d time.Duration) string {
	switch t {
	case TriggerError:
		return fmt.Sprintf("503 for %v", d)
	case TriggerHang:
		return fmt.Sprintf("hang for %v (workers stall, the queue fills)", d)
	case TriggerSlow:
		return fmt.Sprintf("service time x%d for %v", slowFactor, d)
	case TriggerCut:
		return fmt.Sprintf("capacity cut by 80%% for %v", d)
	}
	return t.String()
}

// recoveredText is a Phases' recovery as a table shows it.
func recoveredText(p Phases) string {
	if !p.Recovered {
		return "stuck"
	}
	return fmt.Sprintf("%.1fs", p.RecoverAfter.Seconds())
}

// pct formats a share as a whole percentage.
func pct(x float64) string { return fmt.Sprintf("%.0f%%", 100*x) }

// WriteText writes the matrix in at most 100 columns: the setup, then one
// block per trigger with a row per policy, then what the columns mean.
func (r *MetaResult) WriteText(w io.Writer) error { return r.write(w, false) }

// WriteWide writes the matrix with more columns per row (about 140): the
// p99 time to success, the attempts per offered request during the
// trigger, and the attempts shed, timed out and refused by the limiter.
func (r *MetaResult) WriteWide(w io.Writer) error { return r.write(w, true) }

func (r *MetaResult) write(w io.Writer, wide bool) error {
	c := r.Config
	bw := bufio.NewWriter(w)
	fmt.Fprintf(bw, "provider: %g req/s (%d workers, %v each), queue %g s of work, serves work for callers who left\n",
		c.Capacity, max(c.Workers, 1), time.Duration(float64(max(c.Workers, 1))*float64(time.Second)/c.Capacity), c.QueueSeconds)
	fmt.Fprintf(bw, "load: rho %g (%g req/s from %d clients), attempt timeout %v, deadline %v; seed %d\n",
		c.Rho, c.Rho*c.Capacity, c.Clients, c.Timeout, c.Deadline, c.Seed)
	fmt.Fprintf(bw, "trigger at %v of a %v run; bound: min(1, (1-rho)*D/(rho*O)) = %s of the trigger's requests\n",
		c.TriggerStart, c.Horizon, pct(PhysicalBound(c.Rho, c.Deadline, c.TriggerFor)))
	name := len("policy")
	for _, p := range c.Policies {
		name = max(name, len(p.Name))
	}
	for _, run := range r.Runs {
		fmt.Fprintf(bw, "\n%s\n", triggerWords(run.Trigger, c.TriggerFor))
		fmt.Fprintf(bw, "%-*s %7s %7s %9s %6s %8s %7s %9s %7s", name, "policy", "before", "during", "10s after", "rest",
			"att/off", "wasted", "recovers", "served")
		if wide {
			fmt.Fprintf(bw, " %8s %8s %7s %8s %8s %8s", "goodput", "p99", "in trig", "shed", "timedout", "limited")
		}
		fmt.Fprintln(bw)
		for _, p := range run.Policies {
			ph := p.Phases
			fmt.Fprintf(bw, "%-*s %7s %7s %9s %6s %7.2fx %7s %9s %7s", name, p.Policy.Name, pct(ph.Before), pct(ph.During),
				pct(ph.After10), pct(ph.Rest), ph.AfterAttempts, pct(ph.Wasted), recoveredText(ph), pct(ph.Served))
			if wide {
				fmt.Fprintf(bw, " %8s %8s %6.2fx %8d %8d %8d", pct(p.Goodput), p99Text(p.Succeeded, p.P99), p.OutageAmplification,
					p.Shed, p.TimedOut, p.LimitRefused)
			}
			fmt.Fprintln(bw)
		}
	}
	fmt.Fprintf(bw, "\n%s\n", strings.TrimSpace(fmt.Sprintf(`
before, during, 10s after, rest: goodput, requests that succeeded in the phase per request offered
in it (above 100%% while a backlog drains); att/off: attempts at the provider per offered request
after the trigger; wasted: share of the provider's work after the trigger done for callers who had
left; recovers: seconds after the trigger from which every 1 s span holds %g%% goodput to the end,
at least 10 s (half the time after the trigger if less; "stuck": never); served: share of the
requests made during the trigger that succeed.
fixed-1s: every 1 s until the deadline; backoff: full jitter, 10 attempts; stormguard: budget and
breaker, no waiting (an open breaker fails the call); +wait: calls wait and are released at the
rate before the trip (a breaker, no limiter); +limit: the concurrency limiter's slots pace them.`,
		100*c.RecoveryRatio)))
	return bw.Flush()
}
