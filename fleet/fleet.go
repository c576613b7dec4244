package fleet

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/stormguard/stormguard/observe"
	"github.com/stormguard/stormguard/retry"
)

var (
	// ErrInvalidConfig is wrapped by every error [New] returns for a bad
	// [Config].
	ErrInvalidConfig = errors.New("fleet: invalid config")
	// ErrTooManyHosts is returned for a host beyond Config.MaxHosts.
	ErrTooManyHosts = errors.New("fleet: too many hosts")
	// errTimeout is the error of a Redis round trip that took longer than
	// Config.Timeout; the fleet switches to local mode.
	errTimeout = errors.New("fleet: redis round trip timed out")
	// errClosed is the error of a round trip attempted after Close.
	errClosed = errors.New("fleet: closed")
)

// Mode is how a [Fleet] decides: with the fleet through Redis, or alone.
type Mode uint8

const (
	// ModeFleet: budgets and breakers are shared through Redis.
	ModeFleet Mode = iota + 1
	// ModeLocal: Redis is unreachable, slow or failing; each host's local
	// budget and breaker decide alone until a sync succeeds again.
	ModeLocal
)

// String returns "fleet" or "local" ("Mode(N)" for anything else).
func (m Mode) String() string {
	switch m {
	case ModeFleet:
		return "fleet"
	case ModeLocal:
		return "local"
	}
	return fmt.Sprintf("Mode(%d)", uint8(m))
}

// Fleet shares the retry budgets and circuit breakers of one process with
// every other process of the same fleet (same Name, same Redis). Build one
// with [New] and [Fleet.Close] it when done. Each destination host gets a
// [Budget] and a [breaker.Breaker]; [Fleet.Guards] hands both to a retry
// policy or a transport. A Fleet is safe for concurrent use.
type Fleet struct {
	// Immutable after New.
	cfg       Config // with its defaults filled in
	be        backend
	set       settings
	keyPrefix string    // "stormguard:fleet:{Name}:"
	pid       string    // this Fleet's id in the fleet's limit registry (random)
	phase     float64   // in (0, 1), from the id: this process's phase in a release (host.spread)
	tickAt    float64   // in (0, 1), from the id: this process's phase in the sync interval (loop)
	base      time.Time // f's clock starts here (monotonic)
	logger    *slog.Logger
	obs       observe.Observer

	mode    atomic.Uint32 // a Mode
	closing atomic.Bool   // Close has begun: local mode from now on
	modeMu  sync.Mutex    // held by setMode and Close around closing and mode
	closed  atomic.Bool   // Close has sent its last sync: no more round trips

	mu    sync.Mutex       // guards hosts
	hosts map[string]*host // guarded by mu
	list  atomic.Pointer[[]*host]

	errMu   sync.Mutex
	lastErr error // guarded by errMu

	failures             int64        // round trips that failed or took longer than Timeout; guarded by errMu
	trips                atomic.Int64 // round trips started
	syncs, syncFailures  atomic.Int64
	leaseCalls           atomic.Int64
	probeCalls           atomic.Int64
	modeChanges          atomic.Int64
	maxRoundTrip         atomic.Int64 // ns
	syncing              atomic.Bool  // a sync's round trip is in flight
	ctx                  context.Context
	cancel               context.CancelFunc
	kick, stop, loopDone chan struct{}
	later                chan struct{}  // a failure asks for a sync a tenth of an interval after the last
	flightKick           chan struct{}  // asks flightLoop to send the counts in flight (nil without Config.Limit)
	flightDone           chan struct{}  // closed when flightLoop returns (nil: none)
	flightPoll           atomic.Bool    // the next send of the counts includes every held host
	syncedAt             atomic.Int64   // when the last sync collected the counts (since base, ns)
	clean                atomic.Bool    // the last sync carried no failure of any host: the next one is news
	listenDone           chan struct{}  // closed when listen returns (nil: no listener)
	news                 atomic.Int64   // openings heard on the channel that tripped a breaker (for the tests)
	newest               atomic.Int64   // the server's time of the newest reply (µs; 0: none yet)
	wg                   sync.WaitGroup // round-trip goroutines
	closeOnce            sync.Once
	tripMu               sync.RWMutex // held to join wg (read) and to close (write)
	closeErr             error
}

// New returns a Fleet on client (a *redis.Client, *redis.ClusterClient, a
// Sentinel failover client, or whatever redis.NewUniversalClient returns),
// after one first sync, and starts its background sync and its
// subscription to the fleet's openings (see the package documentation,
// News on a channel: one more connection to Redis). New returns an
// error wrapping [ErrInvalidConfig] for a bad cfg, and one for a nil client,
// including a typed nil such as (*redis.Client)(nil).
//
// Redis not answering is not an error, at New or later: a process that
// starts during a Redis outage serves its callers on its local guards. If
// the first sync fails, New returns a Fleet in local mode, logs the reason
// at Warn (Config.Logger) and reports it (Config.Observer, and LastError in
// [Fleet.Stats]); the Fleet switches to fleet mode by itself when a sync
// succeeds. A client that panics in a round trip is taken for a failing
// Redis in the same way: the panic becomes the round trip's error.
//
// Give the client ContextTimeoutEnabled: true, so that a round trip that
// outlives Timeout is abandoned at once (the fleet stops waiting for it
// after Timeout either way, and [Fleet.Close] waits for it to end).
func New(client redis.UniversalClient, cfg Config) (*Fleet, error) {
	if v := reflect.ValueOf(client); !v.IsValid() || (v.Kind() == reflect.Pointer && v.IsNil()) {
		return nil, fmt.Errorf("fleet: New: nil redis client (%T)", client)
	}
	return newFleet(redisBackend{client: client, script: redis.NewScript(scriptSource)}, cfg)
}

func newFleet(be backend, cfg Config) (*Fleet, error) {
	c, s, err := cfg.resolve()
	if err != nil {
		return nil, err
	}
	var id [8]byte
	_, _ = rand.Read(id[:])
	f := &Fleet{cfg: c, be: be, set: s, keyPrefix: keyPrefix + "{" + c.Name + "}:", pid: hex.EncodeToString(id[:]),
		phase:  (float64(binary.BigEndian.Uint32(id[:4])) + 1) / (1<<32 + 2),
		tickAt: (float64(binary.BigEndian.Uint32(id[4:])) + 1) / (1<<32 + 2),
		base:   time.Now(), logger: c.Logger, obs: c.Observer,
		hosts: map[string]*host{}}
	f.list.Store(&[]*host{})
	f.mode.Store(uint32(ModeFleet))
	f.ctx, f.cancel = context.WithCancel(context.Background())
	f.kick, f.stop, f.loopDone = make(chan struct{}, 1), make(chan struct{}), make(chan struct{})
	f.later = make(chan struct{}, 1)
	f.clean.Store(true)
	f.sync(false)
	go f.loop()
	if c.Limit != nil {
		f.flightKick, f.flightDone = make(chan struct{}, 1), make(chan struct{})
		go f.flightLoop()
	}
	if sub, ok := be.(subscriber); ok {
		f.listenDone = make(chan struct{})
		go f.listen(sub)
	}
	return f, nil
}

// since returns the time on f's clock (monotonic), in nanoseconds since New.
func (f *Fleet) since() int64 { return int64(time.Since(f.base)) }

// Mode returns the fleet's current mode.
func (f *Fleet) Mode() Mode { return Mode(f.mode.Load()) }

// fleetMode reports whether f decides with the fleet now.
func (f *Fleet) fleetMode() bool { return f.mode.Load() == uint32(ModeFleet) }

// host returns the state of host name, creating it if needed.
func (f *Fleet) host(name string) (*host, error) {
	h, _, err := f.addHost(name)
	if err == nil && f.fleetMode() {
		h.awaitReady()
	}
	return h, err
}

// awaitReady waits until the first sync that carried h has answered (its
// breaker and limiter know the fleet's state of it: an open breaker trips
// this process's at the reply), at most Timeout from h's creation, or the
// fleet closes: every caller that asks for h until then waits, not only
// the one that made it. Later calls return at once.
func (h *host) awaitReady() {
	select {
	case <-h.ready:
		return
	default:
	}
	left := h.f.cfg.Timeout - time.Since(h.made)
	if left <= 0 {
		return
	}
	t := time.NewTimer(left)
	select {
	case <-h.ready:
	case <-t.C:
	case <-h.f.stop:
	}
	t.Stop()
}

// addHost returns the state of host name, creating it if needed (made).
func (f *Fleet) addHost(name string) (h *host, made bool, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if h := f.hosts[name]; h != nil {
		return h, false, nil
	}
	if len(f.hosts) >= f.cfg.MaxHosts {
		return nil, false, fmt.Errorf("%w: %d hosts tracked, host %q refused", ErrTooManyHosts, len(f.hosts), name)
	}
	h, err = newHost(f, name)
	if err != nil {
		return nil, false, err
	}
	f.hosts[name] = h
	list := append((*f.list.Load())[:len(*f.list.Load()):len(*f.list.Load())], h)
	f.list.Store(&list)
	if h.lim != nil || f.fleetMode() {
		f.kickSync() // the fleet's state of it (an open breaker), and its first share
	}
	return h, true, nil
}

// Guards returns the budget and breaker of host, and its limiter with
// Config.Limit. The first call for a host (in fleet mode) starts a sync,
// and every call for it until that sync has answered waits for it, at
// most Timeout from the first, so that the host's breaker and limiter
// know the fleet's state of it (an open breaker, a share of the rate)
// before its first calls; later calls do no I/O. Pass f.Guards to
// httpretry.WithGuards to give every
// destination host of a transport a fleet budget and a fleet breaker (and
// a limiter gated at this process's share of the fleet's rate). The transport's logger and observer do
// not hear of these breakers' state changes: set Config.Observer (or
// Breaker.OnStateChange) for that. host is taken as it is, case and port
// included: the fleet shares one budget and one breaker among the
// processes that name a destination the same way. httpretry names it by
// the URL's host, lower-cased, with its port only if the URL has one
// ("example.com" and "example.com:443" are two hosts); processes (and
// grpcretry targets) that spell one destination differently split its
// guards, and multiply the fleet's bound by the spellings.
func (f *Fleet) Guards(host string) (retry.Guards, error) {
	h, err := f.host(host)
	if err != nil {
		return retry.Guards{}, err
	}
	return retry.Guards{Budget: &h.budget, Breaker: h.brk, Limiter: h.lim}, nil
}

// Close stops the background sync, flushes the counts and returns the
// unused leases in one last sync (bounded by Timeout), and waits for every
// round trip to end. Budgets and breakers keep working afterwards, in
// local mode (the change logged and observed as any other). It returns the last sync's error, if any; the Fleet is closed
// either way. Close is safe to call more than once.
func (f *Fleet) Close() error {
	f.closeOnce.Do(func() {
		f.modeMu.Lock()
		f.closing.Store(true)
		from := Mode(f.mode.Swap(uint32(ModeLocal)))
		f.modeMu.Unlock()
		f.modeChanged(from, ModeLocal, nil) // logged and observed as any change
		close(f.stop)
		<-f.loopDone
		if f.flightDone != nil {
			<-f.flightDone
		}
		// Wait for the lease requests in flight (none starts in local
		// mode), so that the last sync gives back every lease.
		for _, h := range *f.list.Load() {
			h.leaseMu.Lock()
			tr := h.leasing
			h.leaseMu.Unlock()
			if tr != nil {
				_, _ = tr.wait(f.cfg.Timeout)
			}
		}
		f.syncing.Store(false) // a late round trip no longer matters
		if err := f.sync(true); err != nil {
			f.closeErr = fmt.Errorf("fleet: last sync on close: %w", err)
		}
		f.tripMu.Lock()
		f.closed.Store(true)
		f.tripMu.Unlock()
		f.cancel()
		f.wg.Wait()
		if f.listenDone != nil {
			// The subscription ends with f.ctx; a dial in progress (on a
			// Redis that does not answer) may outlive Close by the
			// client's dial and read timeouts, not more.
			t := time.NewTimer(f.cfg.Timeout)
			select {
			case <-f.listenDone:
			case <-t.C:
			}
			t.Stop()
		}
		f.ungate()
	})
	return f.closeErr
}

// Stats is a snapshot of a Fleet's round trips to Redis.
type Stats struct {
	// RoundTrips counts the round trips attempted: one sync per
	// SyncEvery, and, on callers' paths, a lease request when a retry
	// finds its lease empty and a probe-round request when an open
	// breaker's round is due, and, with Config.Limit, the sends of the
	// counts of attempts in flight (from a goroutine of the Fleet's: see
	// the package documentation). The success path makes none.
	RoundTrips int64
	// Failures counts the round trips that failed or took longer than
	// Timeout (see the package documentation's Modes).
	Failures int64
	// LastError is the error of the last round trip that failed (nil if
	// none did).
	LastError error
	// MaxRoundTrip is the longest round trip that got a reply (late ones
	// included).
	MaxRoundTrip time.Duration
}

// Stats returns a snapshot of f's round trips.
func (f *Fleet) Stats() Stats {
	// The failures and their last error together, then the round trips,
	// which each counted failure's trip was counted in before it.
	f.errMu.Lock()
	failures, err := f.failures, f.lastErr
	f.errMu.Unlock()
	return Stats{RoundTrips: f.trips.Load(), Failures: failures, LastError: err, MaxRoundTrip: time.Duration(f.maxRoundTrip.Load())}
}
