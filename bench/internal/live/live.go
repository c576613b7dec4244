// Package live runs a retry storm for real, on loopback: a [Provider] is an
// HTTP server that fails for a while and counts, per window, every attempt
// that reaches it; a fleet ([RunFleet]) is many goroutine clients sending a
// steady load through whatever HTTP client is under test, and records when
// each of its calls started, how long it took and whether it succeeded.
//
// It is what `stormguard demo` and the peer comparisons in the bench module
// (the outage of [Run], the POS scenario of [RunScenario] with [Payment]
// calls) are built on. It measures load at the server, so a client cannot
// under-report its own retries, and success at the client. Runs take real
// time (seconds); tests of this package only check its accounting, never
// its timing.
//
// Go's internal rule keeps it to cmd/stormguard, so the bench module holds
// a copy, bench/internal/live, that a test of this package keeps
// byte-identical: change this folder and copy its files over.
package live

import (
	"context"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
)

// Result is one client's run against one provider.
type Result struct {
	// Name labels the client under test.
	Name     string         `json:"name"`
	Provider ProviderConfig `json:"provider"`
	Fleet    FleetConfig    `json:"fleet"`
	// Stats counts logical requests as the clients saw them.
	Stats FleetStats `json:"stats"`
	// Windows is what the provider saw, per window.
	Windows []Window `json:"windows"`
	// Summary is derived from Windows and Stats.
	Summary Summary `json:"summary"`
	// Failures counts the failed calls by cause, if the scenario
	// classified them (Scenario.Classify); calls that panicked are
	// counted in Stats only.
	Failures map[string]int64 `json:"failures,omitempty"`
}

// Summary condenses a run.
type Summary struct {
	// Attempts is every attempt the provider saw.
	Attempts int64 `json:"attempts"`
	// OutageAttempts is the attempts that arrived during the outage.
	OutageAttempts int64 `json:"outage_attempts"`
	// OutageOffered is the logical requests the fleet offered during the
	// outage: those it started in it (OutageStarted).
	OutageOffered float64 `json:"outage_offered"`
	// OutageAmplification is OutageAttempts / OutageOffered.
	OutageAmplification float64 `json:"outage_amplification"`
	// Amplification is Attempts / Stats.Offered over the whole run.
	Amplification float64 `json:"amplification"`
	// Peak is the most attempts in one window, at PeakAt.
	Peak   int64         `json:"peak"`
	PeakAt time.Duration `json:"peak_at_ns"`
	// Goodput is Stats.Succeeded / Stats.Offered.
	Goodput float64 `json:"goodput"`
	// OutageStarted is the logical requests started during the outage,
	// OutageSucceeded those of them that succeeded within their deadline (during it or after),
	// OutageGoodput their ratio.
	OutageStarted   int64   `json:"outage_started"`
	OutageSucceeded int64   `json:"outage_succeeded"`
	OutageGoodput   float64 `json:"outage_goodput"`
	// P50 and P99 are the median and 99th percentile of the time the
	// successful logical requests took (0 if none succeeded).
	P50 time.Duration `json:"p50_ns"`
	P99 time.Duration `json:"p99_ns"`
	// LateP99 and LateMax are the 99th percentile and the maximum of how
	// late the fleet made its calls (CallRecord.Late): on a busy machine
	// the load the fleet offers is not the load it meant to.
	LateP99 time.Duration `json:"late_p99_ns"`
	LateMax time.Duration `json:"late_max_ns"`
	// ShedAfter is the attempts the provider shed (or its middleware
	// refused) from the end of the outage on.
	ShedAfter int64 `json:"shed_after"`
	// Normal reports whether the provider got back to normal after the
	// outage, and NormalAfter how long after its end: from then until
	// the fleet stopped sending, every second (in steps of one window) it
	// failed, shed and refused nothing and got at most 10% (and one) more
	// attempts than the fleet scheduled calls in that second.
	Normal      bool          `json:"normal"`
	NormalAfter time.Duration `json:"normal_after_ns"`
}

// Scenario is one run of [RunScenario]: a client under test, a provider
// and a fleet.
type Scenario struct {
	// Name labels the client under test.
	Name     string
	Provider ProviderConfig
	Fleet    FleetConfig
	// NewCall returns the call of client i, given the provider's URL; it
	// is called once per client before the run.
	NewCall func(url string, client int) Call
	// Wrap, if not nil, is put in front of the provider's work (see
	// [Provider.Wrap]).
	Wrap func(next http.Handler) http.Handler
	// Classify, if not nil, names the cause of each failed call's error
	// (e.g. the reason its retry loop gave up); Result.Failures counts
	// the failures by name. It must be safe for concurrent use.
	Classify func(err error) string
	// Started, if not nil, is called once the provider's clock has started
	// (at start), before the fleet's first call: to watch the run as it
	// happens, e.g. with [Provider.Windows], which may be read at any time
	// from any goroutine.
	Started func(p *Provider, start time.Time)
}

// Run starts a provider on loopback, runs the fleet through the calls that
// newCall makes (one per client, each given the provider's URL), and returns
// what the provider saw. It takes about Fleet.Duration plus the longest
// call's tail.
func Run(ctx context.Context, name string, pc ProviderConfig, fc FleetConfig, newCall func(url string, client int) Call) (*Result, error) {
	return RunScenario(ctx, Scenario{Name: name, Provider: pc, Fleet: fc, NewCall: newCall})
}

// RunScenario is [Run] with middleware at the provider, if s.Wrap is set.
// The provider's clock and the fleet's start at the same instant; the
// provider is shut down (finishing what it holds, for up to 2 s) before its
// windows are read.
func RunScenario(ctx context.Context, s Scenario) (*Result, error) {
	p, err := NewProvider(s.Provider)
	if err != nil {
		return nil, err
	}
	if s.Wrap != nil {
		p.Wrap(s.Wrap)
	}
	url, stop, err := p.Listen()
	if err != nil {
		return nil, err
	}
	stopped := false
	defer func() {
		if !stopped {
			stop()
		}
	}()
	calls := make([]Call, s.Fleet.Clients)
	for i := range calls {
		calls[i] = s.NewCall(url, i)
	}
	var next atomic.Int64
	var (
		mu       sync.Mutex
		failures map[string]int64
	)
	perClient := func(ctx context.Context) error {
		// Round-robin over the clients' calls: each client's requests are
		// spread evenly, as RunFleet sends them in turn.
		err := calls[int(next.Add(1)-1)%len(calls)](ctx)
		if err != nil && s.Classify != nil {
			why := s.Classify(err)
			mu.Lock()
			if failures == nil {
				failures = make(map[string]int64)
			}
			failures[why]++
			mu.Unlock()
		}
		return err
	}
	start := time.Now()
	p.startAt(start)
	if s.Started != nil {
		s.Started(p, start)
	}
	st, err := runFleet(ctx, s.Fleet, perClient, start)
	if err != nil {
		return nil, err
	}
	// A call that gave up at its deadline may have left its attempt in
	// the provider's queue: let the provider finish, so that every
	// attempt it counted has its outcome.
	stop()
	stopped = true
	r := &Result{Name: s.Name, Provider: s.Provider, Fleet: s.Fleet, Stats: st, Windows: p.Windows(), Failures: failures}
	r.Summary = summarize(r)
	return r, nil
}
