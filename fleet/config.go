package fleet

import (
	"cmp"
	"fmt"
	"log/slog"
	"math"
	"strings"
	"time"

	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/budget"
	"github.com/stormguard/stormguard/limit"
	"github.com/stormguard/stormguard/observe"
)

// Defaults of a [Config]'s zero fields, and its limits.
const (
	keyPrefix          = "stormguard:fleet:" // begins every Redis key of a fleet
	defaultSyncEvery   = 100 * time.Millisecond
	defaultTimeout     = 100 * time.Millisecond
	defaultProbeRounds = 3
	defaultProbes      = 1    // Breaker.Probes in a fleet
	defaultMaxHosts    = 1024 // destination hosts one Fleet tracks
	maxLease           = 8    // the most retries one lease request asks for ahead of demand
	maxWaitingLease    = 1024 // the most it asks for the callers waiting for it
	maxSlices          = 1000 // slices of the budget window, buckets of the breaker's: the script reads them all
	defaultLimitMax    = 1000 // limit.Config's default Max, the fleet-wide limit's bound
	defaultLimitInit   = 10   // the least fleet-wide rate of a new fleet, in starts per second
	// minRateWindow is the shortest window of the fleet's rate: its rules
	// count per window, and were measured at one second (live, a fleet
	// whose rate learned in windows of 250 ms stayed stuck after a hang).
	minRateWindow = time.Second
)

// Config is the plain-data description of a fleet. Only Name is required;
// zero fields take the defaults.
type Config struct {
	// Name names the fleet: every process that uses the same Name on the
	// same Redis shares its budgets and breakers. It must not be empty and
	// must not contain '{' or '}': it is the Redis Cluster hash tag of
	// every key of the fleet, so all of them live in one slot. A host's
	// key is "stormguard:fleet:{" + Name + "}:" + host.
	Name string
	// SyncEvery is the interval of the background sync, in which each
	// process flushes its counts and reads the fleet's windows in one
	// round trip; 0 means 100 ms. At least a millisecond. Keep it well
	// under the budget's Window: a request is counted in the fleet's
	// window at the sync after it, and stays there as much longer (see
	// Budget). Each process's first periodic sync comes at a random
	// fraction of SyncEvery after New (then one every SyncEvery), so that
	// processes started together do not sync together.
	SyncEvery time.Duration
	// Timeout bounds each Redis round trip (a sync, a lease, a probe
	// round); one that takes longer switches the fleet to local mode. 0
	// means 100 ms.
	Timeout time.Duration
	// Budget is the fleet-wide retry budget of each host: retries of the
	// whole fleet stay within Ratio times the fleet's requests plus
	// MinPerSecond·Window.Seconds() (a floor for the whole fleet, not per
	// process) over the sliding window, as Redis counts them (on its
	// clock, each request at the sync that carries it). Zero
	// fields take the budget package's defaults; Now is not used. Slices at
	// most 1000, and a slice must be a whole number of microseconds.
	// The bound holds for every retry granted in fleet mode, whatever the
	// callers' deadlines: each one is counted in the fleet's window before
	// it is granted, and a retry whose lease cannot come within the
	// caller's time left is refused, not taken from LocalBudget (see
	// [Budget.WithdrawWithin]). As the dependency sees them, requests
	// count up to an interval (a round trip, if that is longer: a sync
	// waits for the one before it) and a one-way trip late and stay in the
	// window as much longer, and a retry goes out at most a one-way trip
	// after the slice it was counted in: over any span of one Window, the
	// fleet's retries stay within Ratio times its requests in that span
	// and in the Window, the interval and the round trip before it, plus
	// the floor of each window of Redis's that their slices fall in (two,
	// or three with a round trip longer than half a Window). In
	// local mode each process's LocalBudget bounds its own retries: it
	// hears of every call and of the retries this process took from the
	// fleet, so across a switch to local mode (a failed round trip, or
	// Close) the fleet's retries stay within the ratio, but each process
	// has its own floor (up to one floor per process in all).
	Budget budget.Config
	// LocalBudget is each process's own budget per host, used in local
	// mode (the zero value: budget's defaults). It counts every call in
	// fleet mode too, so that it is ready when Redis goes away (but not
	// the fleet's retries: see Budget).
	LocalBudget budget.Config
	// Breaker is the configuration of each host's circuit breaker in each
	// process. Its window (FailureRatio over Window in Buckets) is also
	// the fleet's, and OpenFor the fleet's probe interval. Shared must be
	// nil: the fleet sets it. A zero Probes means 1 in a fleet (not the
	// breaker package's default): a round is the call that asked for it,
	// which a low-volume process may hold alone, and one success closes
	// the fleet. Buckets at most 1000, and a bucket must be a whole number
	// of microseconds.
	Breaker breaker.Config
	// MinCalls is the number of calls the fleet's breaker window must hold
	// before the fleet may open every breaker; 0 means Breaker.MinCalls
	// (with its default). The fleet opens when, in its window, failures >=
	// FailureRatio·calls and calls >= MinCalls.
	MinCalls int
	// ProbeRounds is the number of probe rounds the whole fleet may start
	// per probe interval (Breaker.OpenFor) while the fleet's breaker is
	// open, each of Breaker.Probes calls in one process, at most one per
	// slot of OpenFor/ProbeRounds (so that a recovery is found within
	// about that slot); 0 means 3. A process refused a round stays open for
	// another interval. A round that closes its process's breaker closes
	// the fleet's.
	ProbeRounds int
	// Limit, if not nil, gives each host a [limit.Limiter] built from it
	// ([Fleet.Guards] hands it out), gated ([limit.Limiter.SetRate]) at
	// this process's share of a fleet-wide rate of attempt starts per
	// second to the host, which the fleet learns from its outcomes and
	// the limiters' latency in windows of SyncEvery or one second,
	// whichever is longer (see the package documentation, The fleet's
	// rate). Limit.Max (0 means 1000) bounds
	// each process's attempts in flight, and the fleet's rate at Max per
	// baseline latency. In local mode the gate is lifted and each
	// process's limiter decides alone. Nil (the default) means no limiter
	// in [Fleet.Guards] (httpretry and grpcretry then give the host their
	// own per-process limiter, their default, unless told WithLimit(nil));
	// an invalid Limit is an error of New naming the field. New copies
	// it: changing it afterwards changes nothing.
	Limit *limit.Config
	// MaxHosts bounds the destination hosts the Fleet tracks; 0 means
	// 1024. Beyond it, [Fleet.Guards] returns [ErrTooManyHosts].
	MaxHosts int
	// Logger, if not nil, gets a Warn record on each mode change (not per
	// call). Nil means silent.
	Logger *slog.Logger
	// Observer, if not nil, gets an [observe.FleetMode] event on each mode
	// change, and an [observe.BreakerState] event (Name: the host) on each
	// state change of a host's breaker.
	Observer observe.Observer
}

func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrInvalidConfig}, args...)...)
}

// micros returns d in whole microseconds, or an error naming what if d is
// not a positive whole number of them.
func micros(what string, d time.Duration) (int64, error) {
	if d <= 0 || d%time.Microsecond != 0 {
		return 0, invalid("%s %v must be a whole number of microseconds", what, d)
	}
	return int64(d / time.Microsecond), nil
}

// resolve validates c and returns it with its defaults filled in, and the
// settings the script runs on.
func (c Config) resolve() (Config, settings, error) {
	var s settings
	switch {
	case c.Name == "":
		return c, s, invalid("Name is empty")
	case strings.ContainsAny(c.Name, "{}"):
		return c, s, invalid("Name %q contains a brace", c.Name)
	case c.SyncEvery < 0 || (c.SyncEvery > 0 && c.SyncEvery < time.Millisecond):
		return c, s, invalid("SyncEvery %v must be at least 1ms", c.SyncEvery)
	case c.Timeout < 0:
		return c, s, invalid("Timeout %v must not be negative", c.Timeout)
	case c.MinCalls < 0:
		return c, s, invalid("MinCalls %d must not be negative", c.MinCalls)
	case c.ProbeRounds < 0:
		return c, s, invalid("ProbeRounds %d must not be negative", c.ProbeRounds)
	case c.MaxHosts < 0:
		return c, s, invalid("MaxHosts %d must not be negative", c.MaxHosts)
	case c.Breaker.Shared != nil:
		return c, s, invalid("Breaker.Shared must be nil: the fleet sets it")
	}
	if c.Limit != nil {
		lc := *c.Limit
		if _, err := limit.New(lc); err != nil {
			return c, s, fmt.Errorf("%w: Limit: %w", ErrInvalidConfig, err)
		}
		c.Limit = &lc
		s.limitMax = int64(cmp.Or(lc.Max, defaultLimitMax))
		s.limitInit = min(s.limitMax, defaultLimitInit)
	}
	c.SyncEvery = cmp.Or(c.SyncEvery, defaultSyncEvery)
	c.Timeout = cmp.Or(c.Timeout, defaultTimeout)
	c.ProbeRounds = cmp.Or(c.ProbeRounds, defaultProbeRounds)
	c.MaxHosts = cmp.Or(c.MaxHosts, defaultMaxHosts)
	c.Breaker.Probes = cmp.Or(c.Breaker.Probes, defaultProbes)
	// Validate the three configurations, and read back their defaults.
	fb, err := budget.New(budget.Config{Ratio: c.Budget.Ratio, MinPerSecond: c.Budget.MinPerSecond,
		Window: c.Budget.Window, Slices: c.Budget.Slices})
	if err != nil {
		return c, s, fmt.Errorf("%w: Budget: %w", ErrInvalidConfig, err)
	}
	if _, err := budget.New(c.LocalBudget); err != nil {
		return c, s, fmt.Errorf("%w: LocalBudget: %w", ErrInvalidConfig, err)
	}
	bb, err := breaker.New(c.Breaker)
	if err != nil {
		return c, s, fmt.Errorf("%w: Breaker: %w", ErrInvalidConfig, err)
	}
	bc, brc := fb.Config(), bb.Config()
	if bc.Slices > maxSlices || brc.Buckets > maxSlices {
		return c, s, invalid("Budget.Slices %d and Breaker.Buckets %d must each be at most %d", bc.Slices, brc.Buckets, maxSlices)
	}
	if s.sliceUS, err = micros("Budget.Window/Budget.Slices", bc.Window/time.Duration(bc.Slices)); err != nil {
		return c, s, err
	}
	if s.bucketUS, err = micros("Breaker.Window/Breaker.Buckets", brc.Window/time.Duration(brc.Buckets)); err != nil {
		return c, s, err
	}
	s.slices, s.buckets = int64(bc.Slices), int64(brc.Buckets)
	s.ratio = max(bc.Ratio, 0)
	s.reserve = max(bc.MinPerSecond, 0) * bc.Window.Seconds()
	s.fratio = brc.FailureRatio
	s.minCalls = int64(cmp.Or(c.MinCalls, brc.MinCalls))
	s.probeUS = max(int64(brc.OpenFor/time.Microsecond), 1)
	s.rounds = int64(c.ProbeRounds)
	rw := max(c.SyncEvery, minRateWindow)
	s.limitWindowUS = int64(rw / time.Microsecond)
	s.rateDue = int64(rw - c.SyncEvery/2)
	s.rateFirstLater = c.SyncEvery < rw
	longest := max(bc.Window, brc.Window, brc.OpenFor, brc.MaxOpenFor, rw) // rw >= SyncEvery: a key outlives the syncs that keep it
	// Twice the longest plus 10 s, saturating: a window of a century
	// doubled overflowed, and the host's key expired at once.
	ttl := time.Duration(math.MaxInt64 / 2)
	if longest < (ttl-10*time.Second)/2 {
		ttl = 2*longest + 10*time.Second
	}
	s.ttlMS = int64(ttl / time.Millisecond)
	return c, s, nil
}
