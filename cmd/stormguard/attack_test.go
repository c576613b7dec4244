// Black-box tests of the command against its documentation and help,
// from attacks on it from outside: each names the sentence it checks.

package main

import (
	"bytes"
	"context"
	"encoding/json"
	"regexp"
	"strings"
	"testing"
	"time"
)

// Black-box checks of the CLI against its help text and
// docs, through run/runContext as main_test.go does.

// The demo's headline is "the load in the outage: attempts that reached the
// provider during the outage per request the fleet offered in that time
// (1.00x: one attempt each)". When the outage starts as the fleet stops
// sending (fail-at = duration, inside the run's duration + deadline), the
// provider still gets the retries of the calls in flight, but the fleet
// offered nothing in that time: the figure is undefined, and the demo
// prints 0.00x, i.e. "no load in the outage", while the provider took
// hundreds of attempts during it.
func TestAttackDemoOutageAfterSendingHeadline(t *testing.T) {
	args := []string{"demo", "--clients", "20", "--every", "20ms", "--duration", "300ms",
		"--fail-at", "300ms", "--fail-for", "500ms", "--deadline", "1500ms",
		"--capacity", "1", "--queue", "0", "--work", "20ms", "--naive-every", "100ms", "--quiet", "--json"}
	code, out, errs := runCLI(t, args...)
	if code == 2 {
		t.Logf("refused (fine): %s", errs)
		return
	}
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	var r struct {
		Runs []struct {
			Name    string `json:"name"`
			Summary struct {
				OutageAttempts      int64   `json:"outage_attempts"`
				OutageOffered       float64 `json:"outage_offered"`
				OutageAmplification float64 `json:"outage_amplification"`
			} `json:"summary"`
		} `json:"runs"`
	}
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatal(err)
	}
	for _, run := range r.Runs {
		s := run.Summary
		if s.OutageAttempts > 0 && s.OutageAmplification == 0 {
			t.Errorf("run %q: %d attempts reached the provider during the outage, offered in it %v, yet the headline figure is %.2fx (\"no load in the outage\"), exit 0",
				run.Name, s.OutageAttempts, s.OutageOffered, s.OutageAmplification)
		}
	}
}

// A failure window entirely past the run's end (fail-at 10s, a run of
// duration + deadline = 600ms) is accepted: four runs without any outage,
// headlines "0.00x the load in the outage, 100% served", exit 0. Every
// other command refuses a trigger past its horizon (sim outage: "0 <=
// trigger-start <= trigger-end <= horizon"; sim meta: "trigger-start +
// trigger-for <= horizon").
func TestAttackDemoFailureWindowPastRunEnd(t *testing.T) {
	code, out, errs := runCLI(t, "demo", "--clients", "10", "--every", "100ms", "--duration", "300ms",
		"--deadline", "300ms", "--fail-at", "10s", "--fail-for", "1s", "--quiet")
	if code != 2 {
		t.Errorf("demo with -fail-at 10s past the run (duration 300ms + deadline 300ms): exit %d, want 2 (refused); stdout:\n%s\nstderr: %q", code, out, errs)
	}
}

// sim meta's help: "recovers: seconds after the trigger from which every
// 1 s span holds 95% goodput to the end, at least 10 s ("stuck": never)",
// limits "trigger-start + trigger-for <= horizon". A trigger that ends at
// the horizon is accepted, and every policy, the recommended +limit
// included, is reported "stuck" (the metastable failure), with "10s after"
// goodput 0% of nothing: a silently wrong run.
func TestAttackMetaTriggerAtHorizonEnd(t *testing.T) {
	code, out, errs := runCLI(t, "sim", "meta", "--quiet", "--trigger-start", "50s", "--trigger-for", "10s",
		"--triggers", "503")
	if code == 2 {
		t.Logf("refused (fine): %s", errs)
		return
	}
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	stuck := regexp.MustCompile(`(?m)^\S+ .*\sstuck\s+\d+%$`).FindAllString(out, -1)
	if len(stuck) == 5 {
		t.Errorf("sim meta with a trigger ending at the horizon: exit 0 and all %d policies \"stuck\" (no time after the trigger to measure):\n%s", len(stuck), out)
	}
}

// sim outage's help: 'the time to recover after the trigger ends ("never":
// the metastable failure)', limits "0 <= trigger-start <= trigger-end <=
// horizon". With trigger-end = horizon (allowed) every policy is reported
// "never" recovered, and "after" goodput 0.0% of no requests.
func TestAttackOutageTriggerAtHorizonEnd(t *testing.T) {
	code, out, errs := runCLI(t, "sim", "outage", "--quiet", "--trigger-start", "1m", "--trigger-end", "1m30s",
		"--policies", "full+budget+breaker+retry-after+wait+limit,full+budget+breaker")
	if code == 2 {
		t.Logf("refused (fine): %s", errs)
		return
	}
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	if n := strings.Count(out, " never\n"); n == 2 {
		t.Errorf("sim outage with trigger-end = horizon: exit 0 and every policy \"never\" recovered (the metastable failure) with no time left to recover in:\n%s", out)
	}
}

// `stormguard help` says every input is bounded so that a run takes
// seconds, "the live demo: at most about three minutes", as `demo --help`
// does; the demo itself, at the flags' limits, announces "at most 2m40s". A
// black-box attack found the main help saying two minutes.
func TestAttackDemoLongestRunVsHelp(t *testing.T) {
	_, help, _ := runCLI(t, "help")
	if !strings.Contains(help, "at most about three") {
		t.Errorf("`stormguard help` does not say the demo takes at most about three minutes: %q", help)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // no run: only the announcement
	var out, errb bytes.Buffer
	code := runContext(ctx, []string{"demo", "--duration", "20s", "--deadline", "20s", "--fail-at", "0s", "--clients", "1"}, &out, &errb)
	if code != 130 {
		t.Fatalf("exit %d, stderr %q", code, errb.String())
	}
	m := regexp.MustCompile(`at most (\S+)\.`).FindStringSubmatch(strings.ReplaceAll(errb.String(), "\n", " "))
	if m == nil {
		t.Fatalf("no 'at most' in %q", errb.String())
	}
	d, err := time.ParseDuration(m[1])
	if err != nil {
		t.Fatal(err)
	}
	if d > 3*time.Minute {
		t.Errorf("`stormguard help` says the demo takes at most about three minutes; with accepted flags it announces at most %v", d)
	}
}

// sim layers' budget columns are "calls at a failing bottom per user
// request" (at least 1: every request makes its first call), "simulated
// over many requests". With an accepted low rate (--rate 0.001, in range
// 0.001 to 1e+06) no request arrives after the warm-up, and the columns
// print 0.000x calls per request, exit 0, instead of refusing the input.
func TestAttackLayersNoMeasuredRequest(t *testing.T) {
	code, out, errs := runCLI(t, "sim", "layers", "--rate", "0.001", "--duration", "20s", "--json")
	if code == 2 {
		t.Logf("refused (fine): %s", errs)
		return
	}
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	var r struct {
		Rows []struct {
			Layers       int     `json:"layers"`
			Budget       float64 `json:"budget"`
			SignalBudget float64 `json:"signal_budget"`
		} `json:"rows"`
	}
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatal(err)
	}
	for _, row := range r.Rows {
		if row.Budget < 1 || row.SignalBudget < 1 {
			t.Errorf("layers %d: budget %v, signal+budget %v calls at the bottom per user request (every request makes at least 1), exit 0",
				row.Layers, row.Budget, row.SignalBudget)
		}
	}
}

// demo --help: "About 45 s with the defaults; it says how long at the
// start", and -quiet is "no progress bar on stderr". With -quiet the demo
// does not say what it runs nor how long (the announcement is dropped too).
func TestAttackDemoQuietDropsAnnouncement(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // no run: only what is said before the runs
	var out, errb bytes.Buffer
	code := runContext(ctx, []string{"demo", "--quiet"}, &out, &errb)
	if code != 130 {
		t.Fatalf("exit %d, stderr %q", code, errb.String())
	}
	if !strings.Contains(errb.String(), "stormguard demo: 4 runs") {
		t.Errorf("demo --quiet (documented: \"no progress bar on stderr\"): stderr %q, want the announcement of what it runs and how long", errb.String())
	}
}

// The headline "the load in the outage: attempts that reached the provider
// during the outage per request the fleet offered in that time (1.00x: one
// attempt each)". With a request interval longer than the run (accepted:
// -every 1m, -duration 1s), the fleet offers one request, at t=0 in the
// outage, and the naive client makes one attempt for it; the headline says
// 12.00x (the figure divides by clients/every x the outage, 0.083
// requests, not by the requests offered).
func TestAttackDemoHeadlineCountsNominalNotOffered(t *testing.T) {
	code, out, errs := runCLI(t, "demo", "--clients", "10", "--every", "1m", "--duration", "1s", "--deadline", "1s",
		"--fail-at", "0s", "--fail-for", "500ms", "--quiet", "--json")
	if code == 2 {
		t.Logf("refused (fine): %s", errs)
		return
	}
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	var r struct {
		Runs []struct {
			Name    string `json:"name"`
			Summary struct {
				OutageAttempts      int64   `json:"outage_attempts"`
				OutageOffered       float64 `json:"outage_offered"`
				OutageStarted       int64   `json:"outage_started"`
				OutageAmplification float64 `json:"outage_amplification"`
			} `json:"summary"`
		} `json:"runs"`
	}
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatal(err)
	}
	for _, run := range r.Runs {
		s := run.Summary
		if s.OutageStarted == 0 {
			continue
		}
		if real := float64(s.OutageAttempts) / float64(s.OutageStarted); s.OutageAmplification > 2*real {
			t.Errorf("run %q: %d requests offered in the outage, %d attempts in it (%.2fx), headline %.2fx (divides by %.3f requests)",
				run.Name, s.OutageStarted, s.OutageAttempts, real, s.OutageAmplification, s.OutageOffered)
		}
	}
}
