package idemtest

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"
)

// Result is what [Run] measured. [Result.Err] gives the verdict. Err and
// String only read the Result.
type Result struct {
	// Payments is the number of logical payments made.
	Payments int
	// Servers is the number of servers.
	Servers int
	// Applied is the number of payments the ledger applied at least once.
	Applied int
	// Duplicates is the number of extra applications: the sum over
	// payments of (times applied - 1).
	Duplicates int
	// Lost is the number of payments the ledger never applied.
	Lost int
	// Unknown is the number of ledger entries for payment IDs the driver
	// never sent.
	Unknown int
	// Failed is the number of payments whose calls never succeeded (after
	// all re-drives, or with an unexpected answer).
	Failed int
	// Calls is the number of client calls (http.Client.Do): one per
	// payment plus the re-drives.
	Calls int64
	// Attempts is the number of attempts the transport sent (requests that
	// reached the base transport under the retrying transport).
	Attempts int64
	// Redrives is the number of calls that re-sent a payment with its key
	// after a call that did not succeed.
	Redrives int64
	// GaveUp is the number of calls where the transport gave up (an error
	// or a response marked Stormguard-Gave-Up).
	GaveUp int64
	// Conflicts is the number of calls answered 409 (in progress).
	Conflicts int64
	// LongestBusy is the longest run of 409s that a payment got past (an
	// answer other than 409 ended it): how long a key was held by a
	// request that had not settled it.
	LongestBusy time.Duration
	// Replays is the number of successful calls answered from the store
	// (Idempotent-Replayed: true).
	Replays int64
	// BadReplays is the number of replays (of any call, final or not)
	// whose body differs from the answer the handler produced for the
	// payment, as the ledger recorded it; BadAnswers is the same for
	// original answers. Always 0 unless something cut or changed a stored
	// answer.
	BadReplays, BadAnswers int64
	// Aborted is the number of handler runs that gave up without a word
	// because their request was canceled before they applied the payment;
	// Overran is the number of runs that applied it but ended after their
	// request's deadline (an http.TimeoutHandler answered 503 for most).
	Aborted, Overran int
	// TimedOut is the number of requests an http.TimeoutHandler answered
	// 503 itself because the middleware had not returned in time.
	TimedOut int64
	// KeyErrors is the number of calls in which an attempt carried no key
	// or a key other than the call's first attempt (or, on a re-drive,
	// other than the payment's key). Always 0 unless the transport is
	// broken.
	KeyErrors int64
	// KeyCollisions is the number of payments that got a key another
	// payment already had.
	KeyCollisions int
	// RunsByServer maps server name ("server-0", ...) to handler runs.
	RunsByServer map[string]int
	// Proxy has the proxy's counts.
	Proxy ProxyStats
	// Elapsed is the wall time of the payments (servers set up excluded).
	Elapsed time.Duration
	// Errors has the first few unexpected answers, for the report.
	Errors []string
	// ResetRate, DropRate and CutRate are the configured fault rates the
	// verdict checks the proxy's counts against; 0 skips the check.
	ResetRate, DropRate, CutRate float64
	// Timeout and SlowRate are the configured server-side faults
	// ([Config.Timeout], [HandlerConfig.SlowRate]); when both are set the
	// verdict checks that handlers overran and aborted.
	Timeout  time.Duration
	SlowRate float64
	// StoreBlips is the number of store blips ([Config.StoreBlipRate],
	// the configured rate): when the rate is set, the verdict checks that
	// some happened.
	StoreBlips    int64
	StoreBlipRate float64
}

// Err returns nil when the run passed: every payment applied exactly once
// (no duplicate, none lost, no unknown), every payment's calls ended in
// success, every answer and every replay was the whole answer the handler
// produced for its payment, every attempt of a call carried the call's key
// and no two payments shared one, and the faults really happened: resets,
// drops and cuts occurred at rates near the configured ones, every dropped
// or cut original answer was later replayed (without a timeout the final
// answer of exactly as many payments was a replay; with one, at least as
// many, and at most as many more as the timeout handler answered itself),
// handlers overran and aborted when a timeout and slow runs were
// configured, the store blipped when blips were configured, and every
// server took requests. Otherwise its error lists every violation.
func (r *Result) Err() error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if r.Payments == 0 {
		bad("no payment made")
	}
	if r.Duplicates != 0 {
		bad("%d duplicate applications, want 0", r.Duplicates)
	}
	if r.Lost != 0 {
		bad("%d payments lost (never applied), want 0", r.Lost)
	}
	if r.Unknown != 0 {
		bad("%d ledger entries for payments never sent, want 0", r.Unknown)
	}
	if r.Applied != r.Payments {
		bad("%d payments applied, want %d", r.Applied, r.Payments)
	}
	if r.Failed != 0 {
		bad("%d payments failed (no successful call), want 0; first errors: %s", r.Failed, strings.Join(r.Errors, "; "))
	}
	if r.BadReplays != 0 || r.BadAnswers != 0 {
		bad("%d replays and %d original answers differ from what the handler produced, want 0", r.BadReplays, r.BadAnswers)
	}
	if r.KeyErrors != 0 {
		bad("%d calls whose attempts did not all carry the call's key, want 0", r.KeyErrors)
	}
	if r.KeyCollisions != 0 {
		bad("%d payments shared a key with another, want 0", r.KeyCollisions)
	}
	if r.Proxy.UpstreamErrors != 0 {
		bad("%d proxy upstream errors, want 0", r.Proxy.UpstreamErrors)
	}
	checkRate := func(what string, n, of int64, rate float64) {
		if rate <= 0 {
			return
		}
		if n == 0 {
			bad("no %s injected (rate %.2f over %d requests): the run proves nothing", what, rate, of)
			return
		}
		got := float64(n) / float64(of)
		if tol := 5*math.Sqrt(rate*(1-rate)/float64(of)) + 0.005; math.Abs(got-rate) > tol {
			bad("%s rate %.4f (%d of %d requests), want %.2f ± %.4f", what, got, n, of, rate, tol)
		}
	}
	checkRate("resets", r.Proxy.Resets, r.Proxy.Requests, r.ResetRate)
	checkRate("drops", r.Proxy.Drops, r.Proxy.Requests, r.DropRate)
	checkRate("cuts", r.Proxy.Cuts, r.Proxy.Requests, r.CutRate)
	lost := r.Proxy.DroppedOriginals + r.Proxy.CutOriginals
	switch {
	case r.Timeout <= 0 && r.Replays != lost:
		bad("%d payments ended with a replay, but the proxy dropped or cut %d original answers: want equal", r.Replays, lost)
	case r.Replays < lost || r.Replays > lost+r.TimedOut:
		bad("%d payments ended with a replay, the proxy dropped or cut %d original answers and the timeout handler answered %d requests: want %d to %d", r.Replays, lost, r.TimedOut, lost, lost+r.TimedOut)
	}
	if r.StoreBlipRate > 0 && r.StoreBlips == 0 {
		bad("no store blip at a blip rate of %.2f: the run proves nothing", r.StoreBlipRate)
	}
	if r.Timeout > 0 && r.SlowRate > 0 && (r.Overran == 0 || r.Aborted == 0) {
		bad("%d handler runs overran the timeout and %d aborted: want some of each (the run proves nothing)", r.Overran, r.Aborted)
	}
	for i, n := range r.Proxy.PerUpstream {
		if n == 0 && len(r.Proxy.PerUpstream) > 1 {
			bad("server %d got no request", i)
		}
	}
	return errors.Join(errs...)
}

// String formats the result as a small report, one figure per line.
func (r *Result) String() string {
	var b strings.Builder
	p := r.Proxy
	pct := func(n int64) float64 {
		if p.Requests == 0 {
			return 0
		}
		return 100 * float64(n) / float64(p.Requests)
	}
	fmt.Fprintf(&b, "payments %d, servers %d, elapsed %v (%.0f payments/s)\n",
		r.Payments, r.Servers, r.Elapsed.Round(time.Millisecond), float64(r.Payments)/r.Elapsed.Seconds())
	fmt.Fprintf(&b, "ledger: applied %d, duplicates %d, lost %d, unknown %d; runs by server %v\n",
		r.Applied, r.Duplicates, r.Lost, r.Unknown, r.RunsByServer)
	fmt.Fprintf(&b, "handlers: aborted %d, overran %d, timed out by the timeout handler %d (timeout %v, slow rate %.2f); store blips %d (rate %.2f of completions)\n", r.Aborted, r.Overran, r.TimedOut, r.Timeout, r.SlowRate, r.StoreBlips, r.StoreBlipRate)
	fmt.Fprintf(&b, "client: calls %d, attempts %d (+%d resent by net/http below the transport), re-drives %d, gave up %d, 409s %d (longest run got past %v), final replays %d, failed %d, key errors %d, bad replays %d, bad answers %d\n",
		r.Calls, r.Attempts, max(0, p.Requests-r.Attempts), r.Redrives, r.GaveUp, r.Conflicts, r.LongestBusy.Round(time.Millisecond), r.Replays, r.Failed, r.KeyErrors, r.BadReplays, r.BadAnswers)
	fmt.Fprintf(&b, "proxy: requests %d, resets %d (%.1f%%), drops %d (%.1f%%, %d originals), cuts %d (%.1f%%, %d originals), forwarded %d %v, relayed %d (replays %d, 409s %d), upstream errors %d",
		p.Requests, p.Resets, pct(p.Resets), p.Drops, pct(p.Drops), p.DroppedOriginals, p.Cuts, pct(p.Cuts), p.CutOriginals,
		p.Forwarded, p.PerUpstream, p.Relayed, p.RelayedReplays, p.RelayedConflicts, p.UpstreamErrors)
	return b.String()
}

// Verdict is the result of an end-to-end run: its report, and nil from
// Err when the run passed.
type Verdict interface {
	Err() error
	String() string
}

// Report ends a test's end-to-end run named run (e.g. "idemtest.Run"),
// which returned res and err: it fails tb at once if err is not nil
// (res is then ignored), else logs res and fails tb if its verdict is
// bad. It reports whether res is there (err was nil).
func Report(tb testing.TB, run string, res Verdict, err error) bool {
	tb.Helper()
	if err != nil {
		tb.Fatalf("%s: %v", run, err)
		return false
	}
	tb.Logf("%s:\n%v", run, res)
	if err := res.Err(); err != nil {
		tb.Errorf("%s: verdict:\n%v", run, err)
	}
	return true
}
