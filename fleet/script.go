package fleet

import (
	_ "embed"
	"errors"
	"fmt"
	"strconv"
)

// scriptSource is the one Lua script every Redis round trip of a fleet runs.
// KEYS are hashes, one per destination host, all under the fleet's hash tag.
// ARGV[1] is the mode: "s" (sync: flush counts of every host in KEYS and read
// their fleet windows), "l" (lease: grant retries of KEYS[1]) or "p" (probe:
// ask for a probe round of KEYS[1]). ARGV[2] is the time in microseconds,
// 0 for the server's clock (TIME); ARGV[3..13] are the fleet's settings (see
// settings.args); the rest depends on the mode.
//
// Each hash holds:
//   - t: the latest time seen, so that a server clock that steps back never
//     moves a window back;
//   - bn<i>, bq<i>, br<i>: the budget's ring of slices, slot i holding slice
//     bn<i> (requests bq<i>, retries br<i>);
//   - on<i>, os<i>, of<i>: the breaker's ring of buckets, slot i holding
//     bucket on<i> (successes os<i>, failures of<i>); -1 marks a slot
//     cleared when the fleet's breaker changed state;
//   - st, ep: the fleet's breaker state (0 closed, 1 open) and epoch (the
//     number of state changes);
//   - ps: the probe slot of the last probe round granted while the fleet's
//     breaker is open; a probe interval has ProbeRounds slots, one round
//     each, so that the rounds are spread over it.
//
// A sync that opens a host's breaker publishes it on the fleet's channel
// (see news, and Fleet.listen).
//
// With Config.Limit, the fields of the fleet-wide rate (see rate_share).
//
// A missing field reads as 0. Numbers are written with %.17g: integers
// below 2^53 (every count, every time in µs) print as integers and read
// back exactly, and the rate's fractions read back exactly too.
//
// The script is script.lua, embedded.
//
//go:embed script.lua
var scriptSource string

// errBadReply is wrapped by every error a decoder returns for a reply that
// is not what the script sends.
var errBadReply = errors.New("fleet: malformed script reply")

func badReply(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{errBadReply}, args...)...)
}

// Fleet breaker states in the script.
const (
	fleetClosed = 0
	fleetOpen   = 1
)

// hostWindow is what a sync reads back for one host: the fleet's budget and
// breaker windows after this process's counts were added.
type hostWindow struct {
	requests, retries int64
	state, epoch      int64
	calls, failures   int64
	rate, fleetRate   int64 // this process's share of the fleet's rate and the rate, in thousandths per second (0, 0: no rate yet, or no limiter)
	at                int64 // the server's time of the reply, µs (see host.steer)
}

// syncReply is the decoded reply of a sync.
type syncReply struct {
	now   int64 // the server's time, in microseconds
	hosts []hostWindow
}

// leaseReply is the decoded reply of a lease request.
type leaseReply struct {
	now               int64
	granted           int64 // retries granted, counted in slot
	slot              slot
	left              int64 // microseconds until slice ends
	requests, retries int64 // the window after the grant
	state, epoch      int64
}

// probeReply is the decoded reply of a probe request.
type probeReply struct {
	now          int64
	granted      bool
	state, epoch int64
}

func checkState(st, ep int64) error {
	if st != fleetClosed && st != fleetOpen {
		return badReply("breaker state %d", st)
	}
	if ep < 0 {
		return badReply("epoch %d", ep)
	}
	return nil
}

func checkCounts(vs ...int64) error {
	for _, v := range vs {
		if v < 0 {
			return badReply("negative count %d", v)
		}
	}
	return nil
}

// decodeSync decodes the reply of a sync of n hosts.
func decodeSync(v []int64, n int) (syncReply, error) {
	if len(v) != 1+8*n {
		return syncReply{}, badReply("sync of %d hosts: %d values, want %d", n, len(v), 1+8*n)
	}
	r := syncReply{now: v[0], hosts: make([]hostWindow, n)}
	for i := range r.hosts {
		x := v[1+8*i : 9+8*i]
		w := hostWindow{requests: x[0], retries: x[1], state: x[2], epoch: x[3], calls: x[4], failures: x[5],
			rate: x[6], fleetRate: x[7], at: v[0]}
		if err := checkCounts(w.requests, w.retries, w.calls, w.failures, w.rate, w.fleetRate); err != nil {
			return syncReply{}, err
		}
		if err := checkState(w.state, w.epoch); err != nil {
			return syncReply{}, err
		}
		if w.failures > w.calls {
			return syncReply{}, badReply("%d failures in %d calls", w.failures, w.calls)
		}
		r.hosts[i] = w
	}
	return r, nil
}

// decodeLease decodes the reply of a lease request for want retries.
func decodeLease(v []int64, want int64) (leaseReply, error) {
	if len(v) != 9 {
		return leaseReply{}, badReply("lease: %d values, want 9", len(v))
	}
	r := leaseReply{now: v[0], granted: v[1], slot: slot{v[2], v[8]}, left: v[3], requests: v[4], retries: v[5], state: v[6], epoch: v[7]}
	if err := checkCounts(r.granted, r.slot.slice, r.slot.inc, r.requests, r.retries); err != nil {
		return leaseReply{}, err
	}
	if r.granted > want {
		return leaseReply{}, badReply("lease: %d retries granted, %d asked", r.granted, want)
	}
	if r.left <= 0 {
		return leaseReply{}, badReply("lease: %dµs left in the slice", r.left)
	}
	return r, checkState(r.state, r.epoch)
}

// decodeProbe decodes the reply of a probe request.
func decodeProbe(v []int64) (probeReply, error) {
	if len(v) != 4 {
		return probeReply{}, badReply("probe: %d values, want 4", len(v))
	}
	if v[1] != 0 && v[1] != 1 {
		return probeReply{}, badReply("probe: granted %d", v[1])
	}
	r := probeReply{now: v[0], granted: v[1] == 1, state: v[2], epoch: v[3]}
	return r, checkState(r.state, r.epoch)
}

// settings are the fleet's numbers the script needs, fixed at New.
type settings struct {
	sliceUS  int64   // budget slice
	slices   int64   // budget slices per window
	ratio    float64 // retries per request (0 for none)
	reserve  float64 // the floor: retries per window
	bucketUS int64   // breaker bucket
	buckets  int64   // breaker buckets per window
	fratio   float64 // failure ratio that opens the breaker
	minCalls int64   // calls the fleet's window needs before it may open
	ttlMS    int64   // expiry of an idle host's hash
	probeUS  int64   // the probe interval
	rounds   int64   // probe rounds per probe interval, fleet-wide

	// The fleet-wide rate (Config.Limit): limitMax is 0 without one.
	// limitInit is the cold rate's floor, in starts per second.
	limitWindowUS, limitMax, limitInit int64
	rateDue                            int64 // ns since a process's last report to the rate after which the next sync makes one
	rateFirstLater                     bool  // syncs are shorter than the rate's window: the first report waits a window
}

func ftoa(x float64) string { return strconv.FormatFloat(x, 'g', -1, 64) }
func itoa(x int64) string   { return strconv.FormatInt(x, 10) }

// args returns ARGV[1..13] for mode at time now (0: the server's clock).
func (s *settings) args(mode string, now int64) []string {
	return []string{mode, itoa(now),
		itoa(s.sliceUS), itoa(s.slices), ftoa(s.ratio), ftoa(s.reserve),
		itoa(s.bucketUS), itoa(s.buckets), ftoa(s.fratio), itoa(s.minCalls),
		itoa(s.ttlMS), itoa(s.probeUS), itoa(s.rounds)}
}
