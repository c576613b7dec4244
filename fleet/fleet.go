package fleet

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/budget"
	"github.com/stormguard/stormguard/httpretry"
	"github.com/stormguard/stormguard/observe"
)

// Defaults of a [Config]'s zero fields.
const (
	// DefaultPrefix begins every Redis key of a fleet.
	DefaultPrefix = "stormguard:fleet:"
	// DefaultSyncEvery is the interval of the background sync.
	DefaultSyncEvery = 100 * time.Millisecond
	// DefaultTimeout bounds every Redis round trip.
	DefaultTimeout = 100 * time.Millisecond
	// DefaultProbeRounds is the number of processes of the whole fleet
	// that may start a probe round per probe interval, while the fleet's
	// breaker is open.
	DefaultProbeRounds = 3
	// DefaultProbes is the probe calls of one process's probe round
	// (Breaker.Probes) when the configuration leaves it zero: one, so
	// that a round needs only the call that asked for it (a low-volume
	// process may hold no other), and one success closes the fleet.
	DefaultProbes = 1
	// DefaultMaxLease is the most retries one lease request asks for.
	DefaultMaxLease = 8
	// DefaultMaxHosts bounds the destination hosts one Fleet tracks.
	DefaultMaxHosts = 1024
)

// MaxSlices is the largest number of slices of the fleet's budget window
// and of buckets of its breaker window: the script reads every one of them
// on each call.
const MaxSlices = 1000

var (
	// ErrInvalidConfig is wrapped by every error [New] returns for a bad
	// [Config].
	ErrInvalidConfig = errors.New("fleet: invalid config")
	// ErrTooManyHosts is returned for a host beyond Config.MaxHosts.
	ErrTooManyHosts = errors.New("fleet: too many hosts")
	// ErrTimeout is the error of a Redis round trip that took longer than
	// Config.Timeout; the fleet switches to local mode.
	ErrTimeout = errors.New("fleet: redis round trip timed out")
	// ErrClosed is the error of a round trip attempted after [Fleet.Close].
	ErrClosed = errors.New("fleet: closed")
)

// Config is the plain-data description of a fleet. Only Name is required;
// zero fields take the defaults.
type Config struct {
	// Name names the fleet: every process that uses the same Name (and
	// Prefix) on the same Redis shares its budgets and breakers. It must
	// not be empty and must not contain '{' or '}': it is the Redis Cluster
	// hash tag of every key of the fleet, so all of them live on one node.
	Name string
	// Prefix begins every key; "" means [DefaultPrefix]. It must not
	// contain '{' or '}'. A host's key is Prefix + "{" + Name + "}:" + host.
	Prefix string
	// SyncEvery is the interval of the background sync, in which each
	// process flushes its counts and reads the fleet's windows in one
	// round trip; 0 means [DefaultSyncEvery]. At least a millisecond.
	SyncEvery time.Duration
	// Timeout bounds each Redis round trip (a sync, a lease, a probe
	// round); one that takes longer switches the fleet to local mode. 0
	// means [DefaultTimeout].
	Timeout time.Duration
	// Budget is the fleet-wide retry budget of each host: retries of the
	// whole fleet stay within Ratio times the fleet's requests plus
	// MinPerSecond·Window.Seconds() (a floor for the whole fleet, not per
	// process) over the sliding window, on the Redis server's clock. Zero
	// fields take the budget package's defaults; Now is not used. Slices at
	// most [MaxSlices], and a slice must be a whole number of microseconds.
	// The bound holds for every retry granted in fleet mode, whatever the
	// callers' deadlines: each one is counted in the fleet's window before
	// it is granted, and a retry whose lease cannot come within the
	// caller's time left is refused, not taken from LocalBudget (see
	// [Budget.WithdrawWithin]).
	Budget budget.Config
	// LocalBudget is each process's own budget per host, used in local
	// mode (the zero value: budget's defaults). It counts every call in
	// fleet mode too, so that it is ready when Redis goes away.
	LocalBudget budget.Config
	// Breaker is the configuration of each host's circuit breaker in each
	// process. Its window (FailureRatio over Window in Buckets) is also
	// the fleet's, and OpenFor the fleet's probe interval. Shared must be
	// nil: the fleet sets it. A nil Now uses Config.Now; a zero Probes
	// means [DefaultProbes] (1), not the breaker package's default.
	// Buckets at most [MaxSlices], and a bucket must be a whole number of
	// microseconds.
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
	// about that slot); 0 means [DefaultProbeRounds]. A process refused a
	// round stays open for another interval. A round that closes its
	// process's breaker closes the fleet's.
	ProbeRounds int
	// MaxLease is the most retries a lease request asks for; 0 means
	// [DefaultMaxLease]. A process asks for one, and doubles its ask each
	// time it uses a whole lease, halves it when one expires unused.
	MaxLease int
	// MaxHosts bounds the destination hosts the Fleet tracks; 0 means
	// [DefaultMaxHosts]. Beyond it, Budget, Breaker and Guards return
	// [ErrTooManyHosts].
	MaxHosts int
	// Now is the process's clock, for lease expiry and the local budget
	// and breaker; nil means the monotonic clock. The fleet's windows run
	// on the Redis server's clock.
	Now func() time.Time
	// Logger, if not nil, gets a Warn record on each mode change (not per
	// call). Nil means silent.
	Logger *slog.Logger
	// Observer, if not nil, gets an [observe.FleetMode] event on each mode
	// change, and an [observe.BreakerState] event (Name: the host) on each
	// state change of a host's breaker.
	Observer observe.Observer
}

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

// Fleet shares the retry budgets and circuit breakers of one process with
// every other process of the same fleet (same Name, same Redis). Build one
// with [New] and [Fleet.Close] it when done. Each destination host gets a
// [Budget] and a [breaker.Breaker]; [Fleet.Guards] hands both to
// httpretry.WithGuards. A Fleet is safe for concurrent use.
type Fleet struct {
	// Immutable after New.
	cfg       Config
	be        backend
	set       settings
	keyPrefix string
	now       func() time.Time
	base      time.Time
	logger    *slog.Logger
	obs       observe.Observer
	maxLease  int64
	probes    int // probe calls per round (Breaker.Probes)

	mode    atomic.Uint32 // a Mode
	closing atomic.Bool   // Close has begun: local mode from now on
	closed  atomic.Bool   // Close has sent its last sync: no more round trips

	mu    sync.Mutex       // guards hosts
	hosts map[string]*host // guarded by mu
	list  atomic.Pointer[[]*host]

	errMu     sync.Mutex
	lastErr   error     // guarded by errMu
	lastErrAt time.Time // guarded by errMu

	syncs, syncFailures  atomic.Int64
	leaseCalls           atomic.Int64
	probeCalls           atomic.Int64
	modeChanges          atomic.Int64
	maxRoundTrip         atomic.Int64 // ns
	syncing              atomic.Bool  // a sync's round trip is in flight
	ctx                  context.Context
	cancel               context.CancelFunc
	kick, stop, loopDone chan struct{}
	wg                   sync.WaitGroup // round-trip goroutines
	closeOnce            sync.Once
	closeErr             error
}

// New returns a Fleet on client (a *redis.Client, *redis.ClusterClient, a
// Sentinel failover client, or whatever redis.NewUniversalClient returns),
// after one first sync, and starts its background sync. New returns an
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

func newFleet(be backend, c Config) (*Fleet, error) {
	switch {
	case c.Name == "":
		return nil, invalid("empty name")
	case strings.ContainsAny(c.Name, "{}"):
		return nil, invalid("name %q contains a brace", c.Name)
	case strings.ContainsAny(c.Prefix, "{}"):
		return nil, invalid("prefix %q contains a brace", c.Prefix)
	case c.SyncEvery < 0 || (c.SyncEvery > 0 && c.SyncEvery < time.Millisecond):
		return nil, invalid("sync interval %v must be at least 1ms", c.SyncEvery)
	case c.Timeout < 0:
		return nil, invalid("timeout %v must not be negative", c.Timeout)
	case c.MinCalls < 0 || c.ProbeRounds < 0 || c.MaxLease < 0 || c.MaxHosts < 0:
		return nil, invalid("min calls %d, probe rounds %d, max lease %d and max hosts %d must not be negative",
			c.MinCalls, c.ProbeRounds, c.MaxLease, c.MaxHosts)
	case c.Breaker.Shared != nil:
		return nil, invalid("Breaker.Shared must be nil: the fleet sets it")
	}
	if c.Prefix == "" {
		c.Prefix = DefaultPrefix
	}
	if c.SyncEvery == 0 {
		c.SyncEvery = DefaultSyncEvery
	}
	if c.Timeout == 0 {
		c.Timeout = DefaultTimeout
	}
	if c.ProbeRounds == 0 {
		c.ProbeRounds = DefaultProbeRounds
	}
	if c.MaxLease == 0 {
		c.MaxLease = DefaultMaxLease
	}
	if c.MaxHosts == 0 {
		c.MaxHosts = DefaultMaxHosts
	}
	if c.Now == nil {
		base := time.Now()
		c.Now = func() time.Time { return base.Add(time.Since(base)) }
	}
	if c.LocalBudget.Now == nil {
		c.LocalBudget.Now = c.Now
	}
	if c.Breaker.Now == nil {
		c.Breaker.Now = c.Now
	}
	if c.Breaker.Probes == 0 {
		c.Breaker.Probes = DefaultProbes
	}
	// Validate the three configurations, and read back their defaults.
	fb, err := budget.New(budget.Config{Ratio: c.Budget.Ratio, MinPerSecond: c.Budget.MinPerSecond,
		Window: c.Budget.Window, Slices: c.Budget.Slices})
	if err != nil {
		return nil, fmt.Errorf("%w: fleet budget: %w", ErrInvalidConfig, err)
	}
	if _, err := budget.New(c.LocalBudget); err != nil {
		return nil, fmt.Errorf("%w: local budget: %w", ErrInvalidConfig, err)
	}
	bb, err := breaker.New(c.Breaker)
	if err != nil {
		return nil, fmt.Errorf("%w: breaker: %w", ErrInvalidConfig, err)
	}
	bc, brc := fb.Config(), bb.Config()
	if bc.Slices > MaxSlices || brc.Buckets > MaxSlices {
		return nil, invalid("%d slices and %d buckets must each be at most %d", bc.Slices, brc.Buckets, MaxSlices)
	}
	f := &Fleet{cfg: c, be: be, now: c.Now, logger: c.Logger, obs: c.Observer,
		maxLease: int64(c.MaxLease), probes: brc.Probes,
		keyPrefix: c.Prefix + "{" + c.Name + "}:", hosts: map[string]*host{}}
	s := &f.set
	if s.sliceUS, err = micros("budget slice", bc.Window/time.Duration(bc.Slices)); err != nil {
		return nil, err
	}
	if s.bucketUS, err = micros("breaker bucket", brc.Window/time.Duration(brc.Buckets)); err != nil {
		return nil, err
	}
	s.slices, s.buckets = int64(bc.Slices), int64(brc.Buckets)
	s.ratio = max(bc.Ratio, 0)
	s.reserve = max(bc.MinPerSecond, 0) * bc.Window.Seconds()
	s.fratio = brc.FailureRatio
	s.minCalls = int64(brc.MinCalls)
	if c.MinCalls > 0 {
		s.minCalls = int64(c.MinCalls)
	}
	s.probeUS = max(int64(brc.OpenFor/time.Microsecond), 1)
	s.rounds = int64(c.ProbeRounds)
	longest := max(bc.Window, brc.Window, brc.OpenFor, brc.MaxOpenFor)
	s.ttlMS = int64(min(2*longest+10*time.Second, time.Duration(math.MaxInt64/2)) / time.Millisecond)

	f.base = f.now()
	f.list.Store(&[]*host{})
	f.mode.Store(uint32(ModeFleet))
	f.ctx, f.cancel = context.WithCancel(context.Background())
	f.kick, f.stop, f.loopDone = make(chan struct{}, 1), make(chan struct{}), make(chan struct{})
	f.sync(false)
	go f.loop()
	return f, nil
}

// Config returns the configuration f was built from, with the defaults of
// its own fields filled in.
func (f *Fleet) Config() Config { return f.cfg }

// since returns the time on f's clock, in nanoseconds since New.
func (f *Fleet) since() int64 { return int64(f.now().Sub(f.base)) }

// Mode returns the fleet's current mode.
func (f *Fleet) Mode() Mode { return Mode(f.mode.Load()) }

// fleetMode reports whether f decides with the fleet now.
func (f *Fleet) fleetMode() bool { return f.mode.Load() == uint32(ModeFleet) }

// failed records err, the failure of a round trip, and switches to local
// mode.
func (f *Fleet) failed(err error) {
	f.errMu.Lock()
	f.lastErr, f.lastErrAt = err, f.now()
	f.errMu.Unlock()
	f.setMode(ModeLocal, err)
}

// setMode switches to mode to; a change (not a repeat) is logged and
// observed, once.
func (f *Fleet) setMode(to Mode, err error) {
	if f.closing.Load() {
		return
	}
	from := Mode(f.mode.Swap(uint32(to)))
	if from == to {
		return
	}
	f.modeChanges.Add(1)
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

// trip is one round trip to Redis, run on a goroutine of its own so that
// no caller waits for it longer than it chooses to.
type trip struct {
	done chan struct{} // closed once v and err are set
	v    []int64
	err  error
}

// start runs the script with keys and args on a goroutine of its own, on a
// context that ends Timeout later, and returns at once. then, if not nil,
// runs on that goroutine with the reply (or the error) when it comes,
// whether or not a caller still waits, before done is closed; the error it
// returns (a reply it could not take in) is the trip's. After Close the
// trip fails with ErrClosed at once, and then is not run.
func (f *Fleet) start(keys, args []string, then func([]int64, error) error) *trip {
	tr := &trip{done: make(chan struct{})}
	if f.closed.Load() {
		tr.err = ErrClosed
		close(tr.done)
		return tr
	}
	f.wg.Add(1)
	go func() {
		defer f.wg.Done()
		ctx, cancel := context.WithTimeout(f.ctx, f.cfg.Timeout)
		start := time.Now()
		v, err := f.eval(ctx, keys, args)
		cancel()
		if err == nil {
			d := int64(time.Since(start))
			for m := f.maxRoundTrip.Load(); d > m && !f.maxRoundTrip.CompareAndSwap(m, d); m = f.maxRoundTrip.Load() {
			}
		}
		if then != nil {
			err = then(v, err)
		}
		tr.v, tr.err = v, err
		close(tr.done)
	}()
	return tr
}

// wait returns tr's reply, or ErrTimeout if it has not come within d.
func (tr *trip) wait(d time.Duration) ([]int64, error) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-tr.done:
		return tr.v, tr.err
	case <-t.C:
		return nil, ErrTimeout
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

// host returns the state of host name, creating it if needed.
func (f *Fleet) host(name string) (*host, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if h := f.hosts[name]; h != nil {
		return h, nil
	}
	if len(f.hosts) >= f.cfg.MaxHosts {
		return nil, fmt.Errorf("%w: %d hosts tracked, host %q refused", ErrTooManyHosts, len(f.hosts), name)
	}
	h, err := newHost(f, name)
	if err != nil {
		return nil, err
	}
	f.hosts[name] = h
	list := append((*f.list.Load())[:len(*f.list.Load()):len(*f.list.Load())], h)
	f.list.Store(&list)
	return h, nil
}

// Budget returns the fleet retry budget of destination host name (any
// string naming the dependency; the same name in every process), creating
// it on first use. Every call for the same name returns the same Budget.
func (f *Fleet) Budget(name string) (*Budget, error) {
	h, err := f.host(name)
	if err != nil {
		return nil, err
	}
	return &h.budget, nil
}

// Breaker returns the circuit breaker of destination host name, connected
// to the fleet, creating it on first use. Every call for the same name
// returns the same breaker.
func (f *Fleet) Breaker(name string) (*breaker.Breaker, error) {
	h, err := f.host(name)
	if err != nil {
		return nil, err
	}
	return h.brk, nil
}

// Guards returns the budget and breaker of host: pass f.Guards to
// httpretry.WithGuards to give every destination host of a transport a
// fleet budget and a fleet breaker. The transport's logger and observer do
// not hear of these breakers' state changes: set Config.Observer (or
// Breaker.OnStateChange) for that.
func (f *Fleet) Guards(host string) (httpretry.Guards, error) {
	h, err := f.host(host)
	if err != nil {
		return httpretry.Guards{}, err
	}
	return httpretry.Guards{Budget: &h.budget, Breaker: h.brk}, nil
}

// loop syncs every SyncEvery, and at once when kicked, until Close.
func (f *Fleet) loop() {
	defer close(f.loopDone)
	t := time.NewTicker(f.cfg.SyncEvery)
	defer t.Stop()
	for {
		select {
		case <-f.stop:
			return
		case <-t.C:
		case <-f.kick:
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
	keys := make([]string, len(hosts))
	args := f.set.args("s", 0)
	batch := make([]syncHost, len(hosts))
	now := f.since()
	for i, h := range hosts {
		keys[i] = h.key
		batch[i] = h.collect(now, final)
		args = appendSync(args, batch[i])
	}
	v, err := f.start(keys, args, func(_ []int64, err error) error {
		f.syncing.Store(false)
		return err
	}).wait(f.cfg.Timeout)
	if err == nil {
		var r syncReply
		if r, err = decodeSync(v, len(hosts)); err == nil {
			f.syncs.Add(1)
			f.setMode(ModeFleet, nil)
			for i, h := range hosts {
				h.synced(batch[i], r.hosts[i])
			}
			return nil
		}
	}
	f.syncFailures.Add(1)
	f.failed(fmt.Errorf("fleet: sync: %w", err))
	if r, ok := f.be.(interface{ reload() }); ok {
		r.reload()
	}
	return err
}

// Close stops the background sync, flushes the counts and returns the
// unused leases in one last sync (bounded by Timeout), and waits for every
// round trip to end. Budgets and breakers keep working afterwards, in
// local mode. It returns the last sync's error, if any; the Fleet is closed
// either way. Close is safe to call more than once.
func (f *Fleet) Close() error {
	f.closeOnce.Do(func() {
		f.closing.Store(true)
		f.mode.Store(uint32(ModeLocal))
		close(f.stop)
		<-f.loopDone
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
		f.closed.Store(true)
		f.cancel()
		f.wg.Wait()
	})
	return f.closeErr
}

// Stats is a snapshot of a Fleet's mode and round trips.
type Stats struct {
	// Mode is the current mode.
	Mode Mode
	// LastError is the error of the last round trip that failed (nil if
	// none did), at LastErrorAt on the process's clock.
	LastError   error
	LastErrorAt time.Time
	// ModeChanges counts the switches between modes.
	ModeChanges int64
	// Syncs counts the syncs that succeeded, SyncFailures those that
	// failed or timed out.
	Syncs, SyncFailures int64
	// LeaseCalls counts lease requests (a retry found its lease empty),
	// ProbeCalls the probe-round requests: the round trips made on a
	// caller's path. Neither happens on the success path.
	LeaseCalls, ProbeCalls int64
	// RoundTrips is every round trip attempted:
	// Syncs + SyncFailures + LeaseCalls + ProbeCalls.
	RoundTrips int64
	// MaxRoundTrip is the longest round trip that got a reply (late ones
	// included).
	MaxRoundTrip time.Duration
	// Hosts is the number of destination hosts tracked.
	Hosts int
}

// Stats returns a snapshot of f's mode and counters.
func (f *Fleet) Stats() Stats {
	f.errMu.Lock()
	err, at := f.lastErr, f.lastErrAt
	f.errMu.Unlock()
	s := Stats{Mode: f.Mode(), LastError: err, LastErrorAt: at, ModeChanges: f.modeChanges.Load(),
		Syncs: f.syncs.Load(), SyncFailures: f.syncFailures.Load(),
		LeaseCalls: f.leaseCalls.Load(), ProbeCalls: f.probeCalls.Load(), Hosts: len(*f.list.Load()),
		MaxRoundTrip: time.Duration(f.maxRoundTrip.Load())}
	s.RoundTrips = s.Syncs + s.SyncFailures + s.LeaseCalls + s.ProbeCalls
	return s
}
