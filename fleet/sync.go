package fleet

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stormguard/stormguard/observe"
)

// backend runs the script. The Redis one is the only one outside tests.
type backend interface {
	eval(ctx context.Context, keys []string, args []string) ([]int64, error)
}

type redisBackend struct {
	client redis.UniversalClient
	script *redis.Script
}

// reload asks a Redis Cluster client to reload its map of slots and nodes
// (in the background): after a master is lost, a go-redis ClusterClient
// keeps sending the slot's commands to the dead node until its periodic
// reload (every minute by default), however soon the cluster promotes the
// replica; a fleet that asks after each failed sync is back in fleet mode
// a sync after the promotion. Other clients need nothing.
func (r redisBackend) reload() {
	if c, ok := r.client.(interface{ ReloadState(context.Context) }); ok {
		c.ReloadState(context.Background())
	}
}

func (r redisBackend) eval(ctx context.Context, keys []string, args []string) ([]int64, error) {
	a := make([]any, len(args))
	for i, s := range args {
		a[i] = s
	}
	return r.script.Run(ctx, r.client, keys, a...).Int64Slice()
}

// trip is one round trip to Redis, run on a goroutine of its own so that
// no caller waits for it longer than it chooses to.
type trip struct {
	done    chan struct{} // closed once v and err are set
	v       []int64
	err     error
	counted bool // its failure is counted in Stats (guarded by Fleet.errMu)
}

// start runs the script with keys and args on a goroutine of its own, on a
// context that ends Timeout later, and returns at once. then, if not nil,
// runs on that goroutine with the reply (or the error) when it comes,
// whether or not a caller still waits, before done is closed; the error it
// returns (a reply it could not take in) is the trip's. After Close the
// trip fails with errClosed at once, and then is not run.
func (f *Fleet) start(keys, args []string, then func([]int64, error) error) *trip {
	tr := &trip{done: make(chan struct{})}
	// Under tripMu, so that no round trip joins f.wg once Close waits for
	// it (an Add concurrent with Wait: a round trip outliving Close).
	f.tripMu.RLock()
	if f.closed.Load() {
		f.tripMu.RUnlock()
		tr.err = errClosed
		close(tr.done)
		return tr
	}
	f.trips.Add(1)
	f.wg.Add(1)
	f.tripMu.RUnlock()
	go func() {
		defer f.wg.Done()
		ctx, cancel := context.WithTimeout(f.ctx, f.cfg.Timeout)
		start := time.Now()
		v, err := f.eval(ctx, keys, args)
		cancel()
		d := time.Since(start)
		if err == nil {
			for m := f.maxRoundTrip.Load(); int64(d) > m && !f.maxRoundTrip.CompareAndSwap(m, int64(d)); m = f.maxRoundTrip.Load() {
			}
		}
		if then != nil {
			err = then(v, err)
		}
		if err != nil {
			f.noteFailure(tr, err, false)
		} else if d > f.cfg.Timeout {
			f.noteFailure(tr, fmt.Errorf("fleet: a round trip took %v, over the timeout %v", d, f.cfg.Timeout), false)
		}
		tr.v, tr.err = v, err
		close(tr.done)
	}()
	return tr
}

// wait returns tr's reply, or errTimeout if it has not come within d.
func (tr *trip) wait(d time.Duration) ([]int64, error) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-tr.done:
		return tr.v, tr.err
	case <-t.C:
		return nil, errTimeout
	}
}

// errClientPanic is wrapped by the error of a round trip whose client
// panicked.
var errClientPanic = errors.New("fleet: redis client panicked")

// eval runs the script on f's backend. A panic in the client becomes the
// round trip's error: it happens on a goroutine of the fleet, where no
// caller could recover it, and a client that panics is a Redis that fails.
func (f *Fleet) eval(ctx context.Context, keys, args []string) (v []int64, err error) {
	defer func() {
		if r := recover(); r != nil {
			v, err = nil, fmt.Errorf("%w: %v", errClientPanic, r)
		}
	}()
	return f.be.eval(ctx, keys, args)
}

// loop syncs every SyncEvery, at once when kicked, and a tenth of
// SyncEvery after the last sync when asked for one later (kickLater), until
// Close. The first periodic sync comes at a fraction of SyncEvery of this
// process's own (tickAt, from its random id), and the next ones every
// SyncEvery after it: processes built together (a fleet's deployment, the
// bench's 1000 terminals) would otherwise sync in phase, and their
// reports, landing on either side of a rate window's edge by a
// millisecond, fill one window twice and leave the next nearly empty
// (live: 107 and 887 successes in two windows of a host serving 470 a
// second, and a rate cut to a quarter on the thin one).
func (f *Fleet) loop() {
	defer close(f.loopDone)
	first := time.NewTimer(max(time.Duration(f.tickAt*float64(f.cfg.SyncEvery)), 1))
	defer first.Stop()
	t := time.NewTicker(f.cfg.SyncEvery)
	t.Stop() // started at the first periodic sync
	defer t.Stop()
	var tick <-chan time.Time
	tenth := f.cfg.SyncEvery / 10
	soon := time.NewTimer(tenth)
	soon.Stop()
	defer soon.Stop()
	var soonC <-chan time.Time // soon's channel while it is armed
	arm := func() {
		soon.Reset(max(tenth-time.Duration(f.since()-f.syncedAt.Load()), 0))
		soonC = soon.C
	}
	for {
		select {
		case <-f.stop:
			return
		case <-first.C:
			t.Reset(f.cfg.SyncEvery)
			tick = t.C
		case <-tick:
		case <-f.kick:
		case <-f.later:
			if soonC == nil {
				arm()
			}
			continue
		case <-soonC:
			soonC = nil
			if !f.failing() {
				continue // sent meanwhile, or outweighed by successes since
			}
			if time.Duration(f.since()-f.syncedAt.Load()) < tenth {
				arm() // a sync came meanwhile: a tenth after it
				continue
			}
		}
		f.sync(false)
	}
}

// kickSync asks the loop for a sync now.
func (f *Fleet) kickSync() {
	select {
	case f.kick <- struct{}{}:
	default:
	}
}

// failing reports whether some host's unsent outcomes are mostly failures.
func (f *Fleet) failing() bool {
	for _, h := range *f.list.Load() {
		if h.failing() {
			return true
		}
	}
	return false
}

// kickLater asks the loop for a sync a tenth of SyncEvery after the last
// one (at once if that has passed).
func (f *Fleet) kickLater() {
	select {
	case f.later <- struct{}{}:
	default:
	}
}

// sync flushes every host's counts and leftover leases to Redis, reads the
// fleet's windows back in the same round trip, and steers the breakers. A
// sync that fails switches to local mode; its counts are dropped (the fleet
// then counts fewer requests, which only makes its budget stricter, and
// fewer outcomes), except a closed breaker's news, which the next sync
// sends again. The last sync (final) gives back every lease, expired or
// not. It returns the round trip's error.
func (f *Fleet) sync(final bool) error {
	hosts := *f.list.Load()
	if !f.syncing.CompareAndSwap(false, true) {
		// The last round trip is still in flight (it ran out of time
		// already): the local budgets get their deposits all the same.
		for _, h := range hosts {
			h.takeRequests()
		}
		return nil
	}
	defer func() {
		for _, h := range hosts {
			h.markSynced()
		}
	}()
	keys := make([]string, len(hosts))
	args := f.set.args("s", 0)
	batch := make([]syncHost, len(hosts))
	now := f.since()
	f.syncedAt.Store(now)
	clean := true
	for i, h := range hosts {
		keys[i] = h.key
		batch[i] = h.collect(now, final)
		args = appendSync(args, batch[i])
		clean = clean && batch[i].failures == 0
	}
	f.clean.Store(clean)
	tr := f.start(keys, args, func(_ []int64, err error) error {
		f.syncing.Store(false)
		return err
	})
	v, err := tr.wait(f.cfg.Timeout)
	if err == nil {
		var r syncReply
		if r, err = decodeSync(v, len(hosts)); err == nil {
			f.replied(r.now)
			f.syncs.Add(1)
			f.setMode(ModeFleet, nil)
			held := false
			for i, h := range hosts {
				h.synced(batch[i], r.hosts[i])
				held = held || h.holding.Load()
			}
			if held {
				f.flightPoll.Store(true) // a held host asks whether the hold goes on (news may be lost)
				f.kickFlight()
			}
			return nil
		}
	}
	f.syncFailures.Add(1)
	f.failed(tr, fmt.Errorf("fleet: sync: %w", err))
	if r, ok := f.be.(interface{ reload() }); ok {
		r.reload()
	}
	return err
}

// replied records now, the server's time of a reply (µs), if it is the
// newest: the reference for news heard on the channel.
func (f *Fleet) replied(now int64) {
	for cur := f.newest.Load(); now > cur && !f.newest.CompareAndSwap(cur, now); cur = f.newest.Load() {
	}
}

// ungate lifts the fleet's rate gates of the hosts' limiters: in local
// mode each limiter decides alone.
func (f *Fleet) ungate() {
	for _, h := range *f.list.Load() {
		if h.lim == nil {
			continue
		}
		h.rateNow.Store(true) // the next good sync gates it again
		if h.rate.Load() != 0 {
			h.setRate(0)
		}
		h.unhold()
		h.flightSent.Store(-1) // the count goes again once back in fleet mode
	}
}

// failed records err, the failure of round trip tr (a sync, a lease, a
// probe round), and switches to local mode, where the rate gates are
// lifted and each limiter decides alone.
func (f *Fleet) failed(tr *trip, err error) {
	f.noteFailure(tr, err, true)
	f.setMode(ModeLocal, err)
	f.ungate()
}

// noteFailure counts the failure of round trip tr once (its caller's
// account of it, or the trip's own when it fails or comes late) and
// remembers err with the count, so that Stats sees both or neither: the
// caller's account (last) replaces the error, the trip's only when it is
// the first.
func (f *Fleet) noteFailure(tr *trip, err error, last bool) {
	f.errMu.Lock()
	first := !tr.counted
	if first {
		tr.counted = true
		f.failures++
	}
	if first || last {
		f.lastErr = err
	}
	f.errMu.Unlock()
}

// setMode switches to mode to; a change (not a repeat) is logged and
// observed, once.
func (f *Fleet) setMode(to Mode, err error) {
	// Under modeMu, so that a sync that ends as Close begins cannot set
	// fleet mode after Close set local mode (the check and the swap were
	// two steps).
	f.modeMu.Lock()
	if f.closing.Load() {
		f.modeMu.Unlock()
		return
	}
	from := Mode(f.mode.Swap(uint32(to)))
	f.modeMu.Unlock()
	if from != to {
		f.modeChanges.Add(1) // a change a round trip made (Close's is not counted)
	}
	f.modeChanged(from, to, err)
}

// modeChanged logs and observes a change of mode from from to to (none
// if they are the same).
func (f *Fleet) modeChanged(from, to Mode, err error) {
	if from == to {
		return
	}
	if f.logger != nil {
		attrs := []slog.Attr{slog.String("fleet", f.cfg.Name), slog.String("from", from.String()), slog.String("to", to.String())}
		if err != nil {
			attrs = append(attrs, slog.Any("error", err))
		}
		f.logger.LogAttrs(context.Background(), slog.LevelWarn, "fleet: mode change", attrs...)
	}
	if f.obs != nil {
		f.obs.Observe(context.Background(), observe.Event{Kind: observe.FleetMode, Name: f.cfg.Name,
			From: from.String(), To: to.String(), Err: err})
	}
}

// slot names the window slot a lease's retries were counted in: its slice
// and the incarnation of the host's key on Redis (the server's clock, µs,
// when the key was created), so that retries counted on a key since lost
// (a restarted Redis, an evicted or expired key) are not taken off the
// count of another process's retries in the same slice of the new key.
type slot struct{ slice, inc int64 }

// returned is a number of leased retries given back unused, and the slot
// they were counted in.
type returned struct {
	slot
	n int64
}

// syncHost is one host's part of a sync.
type syncHost struct {
	requests, successes, failures uint64
	seen                          int64
	close                         bool
	returns                       []returned
	limit                         *limitReport // nil: the host has no limiter
}

// limitReport is a process's report to the fleet's rate of a host: its
// id; its calls waiting in its limiter and behind its breaker (-1: it
// leaves); the calls its limiter refused for want of a token since its
// last report (demand of the process, not of the host: they count in its
// share, not in the fleet's rate); the sum (µs), the fastest (µs, 0:
// none) and the number of its latency samples since its last report; its
// successes and failures since its last report (the syncs in between sent
// them to the breaker only); the time of the probe that closed its
// breaker (µs, 0: none; see host.StateChanged); and the fleet's settings
// (window in microseconds, Limit.Max, the cold rate's floor).
type limitReport struct {
	pid                           string
	waiting, refused, latUS, latN int64
	latMinUS                      int64
	ok, bad                       uint64
	probeUS                       int64
	windowUS, max, initRate       int64
}

// appendSync appends a host's ARGV of a sync to args.
func appendSync(args []string, h syncHost) []string {
	cl := "0"
	if h.close {
		cl = "1"
	}
	args = append(args, strconv.FormatUint(h.requests, 10), strconv.FormatUint(h.successes, 10),
		strconv.FormatUint(h.failures, 10), itoa(h.seen), cl, itoa(int64(len(h.returns))))
	for _, r := range h.returns {
		args = append(args, itoa(r.slice), itoa(r.inc), itoa(r.n))
	}
	if l := h.limit; l != nil {
		return append(args, "1", l.pid, itoa(l.waiting), itoa(l.latUS), itoa(l.latN), itoa(l.windowUS), itoa(l.max), itoa(l.initRate), itoa(l.refused), itoa(l.latMinUS),
			strconv.FormatUint(l.ok, 10), strconv.FormatUint(l.bad, 10), itoa(l.probeUS))
	}
	return append(args, "0")
}
