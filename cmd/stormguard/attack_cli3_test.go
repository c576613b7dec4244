package main

import (
	"encoding/json"
	"strings"
	"testing"
)

// metaJSON is the part of `sim meta --json` these tests read.
type metaJSON struct {
	Config struct {
		TriggerStart int64 `json:"trigger_start_ns"`
		TriggerFor   int64 `json:"trigger_for_ns"`
		Horizon      int64 `json:"horizon_ns"`
	} `json:"config"`
	Runs []struct {
		Trigger string `json:"trigger"`
		Results []struct {
			Policy   struct{ Name string } `json:"policy"`
			Offered  int                   `json:"offered"`
			Attempts int                   `json:"attempts"`
			Phases   struct {
				Recovered    bool  `json:"recovered"`
				RecoverAfter int64 `json:"recover_after_ns"`
			} `json:"phases"`
		} `json:"results"`
	} `json:"runs"`
}

func cli3MetaJSON(t *testing.T, args ...string) metaJSON {
	t.Helper()
	code, out, errs := runCLI(t, append([]string{"sim", "meta", "--quiet", "--json"}, args...)...)
	if code != 0 {
		t.Fatalf("exit %d, stderr %q", code, errs)
	}
	var v metaJSON
	if err := json.Unmarshal([]byte(out), &v); err != nil {
		t.Fatalf("not JSON: %v", err)
	}
	return v
}

// `sim meta --help`, Limits: "rho x capacity x horizon at most 200000
// requests, and those x min(30, deadline / 1s ...) at most 4000000
// attempts". The check once divided the deadline by the timeout: with the
// timeout equal to the deadline it counted one attempt per request, but a
// 503 (or a shed) fails at once, so the naive row retries every 1 s up to
// its 30 attempts whatever the timeout, and one trigger's run made
// 5,137,442 attempts. Such a run is now refused up front; one within the
// bound runs and stays within it.
func TestAttackCli3MetaAttemptsBound(t *testing.T) {
	code, _, errs := runCLI(t, "sim", "meta", "--quiet", "--json", "--timeout", "1h", "--deadline", "1h", "--rho", "2", "--capacity", "1000",
		"--horizon", "100s", "--trigger-start", "0s", "--trigger-for", "99s", "--triggers", "503", "--policies", "fixed-1s")
	if code != 2 || !strings.Contains(errs, "attempts, at most 4000000") {
		t.Errorf("a run of up to 6,000,000 attempts: exit %d, stderr %q; want it refused (exit 2) naming the attempts bound", code, errs)
	}
	v := cli3MetaJSON(t, "--timeout", "1h", "--deadline", "3s", "--rho", "2", "--capacity", "1000",
		"--horizon", "100s", "--trigger-start", "0s", "--trigger-for", "99s", "--triggers", "503", "--policies", "fixed-1s")
	for _, run := range v.Runs {
		for _, r := range run.Results {
			if r.Attempts > 4_000_000 || r.Attempts > 3*r.Offered {
				t.Errorf("trigger %s, policy %s: %d requests made %d attempts, over the bound (3 a request, 4000000)",
					run.Trigger, r.Policy.Name, r.Offered, r.Attempts)
			}
		}
	}
}

// `sim outage --help`: "the time to recover after the trigger ends
// ("never": the metastable failure)"; the table: "recovered: time after
// the trigger from which, in every span of 1s (window-aligned, to the
// horizon) at least 90% of the requests made in it succeed". With a
// trigger of length 0 and no request after it, nothing failed, yet every
// policy is reported "never" recovered; sim meta reports the same empty
// case recovered at 0.0s.
func TestAttackCli3OutageNoFailureIsNotNever(t *testing.T) {
	code, out, errs := runCLI(t, "sim", "outage", "--quiet", "--horizon", "2s", "--trigger-start", "0s", "--trigger-end", "0s",
		"--clients", "1", "--rate", "0.001", "--policies", "full,full+budget+breaker+retry-after+wait+limit")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	if n := strings.Count(out, " never\n"); n > 0 {
		t.Errorf("no failure at all (0 s trigger), %d policies reported \"never\" recovered (the metastable failure):\n%s", n, out)
	}
}
