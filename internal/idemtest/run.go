package idemtest

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stormguard/stormguard/backoff"
	"github.com/stormguard/stormguard/httpretry"
	"github.com/stormguard/stormguard/idempotency"
	"github.com/stormguard/stormguard/idempotency/store"
	"github.com/stormguard/stormguard/retry"
)

// Defaults of a [Config].
const (
	DefaultPayments = 10000
	// RacePayments is the number of payments [Payments] returns under the
	// race detector, for a tenth of the CPU: the detector watches the
	// same code paths at any size, and every kind of fault still occurs
	// (in Hostile runs under -race on a loaded machine, the rarest, the
	// aborted handlers, 409s and store blips, 12 to 25 times each). make
	// test runs the end-to-end tests at [DefaultPayments] again without
	// the race detector (NORACE_PKGS in the Makefile).
	RacePayments       = 1000
	DefaultWorkers     = 16
	DefaultResetRate   = 0.10
	DefaultDropRate    = 0.20
	DefaultMaxAttempts = 10
	DefaultMaxRedrives = 20
	// DefaultInProgressWait is well under the middleware's default lock
	// timeout (1 min), so that a key left locked until the lock times out
	// fails the run, and far above what a holder needs that settles a
	// store blip (tens of milliseconds, seconds on a loaded machine).
	DefaultInProgressWait = 10 * time.Second
)

// Settings of [Hostile].
const (
	HostileCutRate     = 0.05
	HostileTimeout     = 20 * time.Millisecond
	HostileAnswerBytes = 16 << 10
	HostileChunks      = 8
	HostileSlowRate    = 0.10
	HostilePause       = 25 * time.Millisecond
	HostileBlipRate    = 0.02
)

// PaymentsEnv is the environment variable [Payments] reads: a positive
// number of payments that overrides [DefaultPayments], e.g. for a quick
// local run.
const PaymentsEnv = "STORMGUARD_E2E_PAYMENTS"

// Config configures [Run]. The zero value of each field means its default.
type Config struct {
	// Stores has one store per server: Run starts len(Stores) servers, the
	// i-th with a middleware on Stores[i]. Give the same store twice, or
	// two stores over one database, for two servers sharing a store. At
	// least one.
	Stores []store.Store
	// Middleware are extra options for every server's middleware, after
	// the harness's own (SharedScope: the driver is the
	// only caller; idempotency.WithRequired).
	Middleware []idempotency.Option
	// Payments is the number of logical payments; 0 means
	// [DefaultPayments].
	Payments int
	// Workers is the number of payments made at the same time; 0 means
	// [DefaultWorkers].
	Workers int
	// ResetRate and DropRate are the proxy's fault rates (see
	// [ProxyConfig]); 0 means [DefaultResetRate] and [DefaultDropRate],
	// a negative value means none.
	ResetRate, DropRate float64
	// CutRate is the proxy's rate of answers cut mid-way (see
	// [ProxyConfig.CutRate]); 0 means none.
	CutRate float64
	// StoreBlipRate is the fraction of completions (the store calls that
	// save a handler's answer) at which a server's link to its store
	// blips: every call the server makes to its store fails for
	// [StoreBlip], starting with that completion (half of such
	// completions fail before they reach the store, half after the store
	// took them: the answer is lost). Each server blips on its own, by a
	// sequence seeded from Seed. 0 means none.
	StoreBlipRate float64
	// Timeout puts an [http.TimeoutHandler] with this timeout in front of
	// the middleware of the even-numbered servers (server-0, server-2,
	// ...); the others answer without one, so that cut answers reach their
	// handlers' writes. 0 means none.
	Timeout time.Duration
	// Handler shapes the payments handlers' answers; the zero value is a
	// small answer written at once.
	Handler HandlerConfig
	// Seed seeds the proxy's fault sequence; 0 means 1.
	Seed uint64
	// MaxAttempts is the client transport's attempts per call
	// (retry.WithMaxAttempts, through httpretry.WithRetry); 0 means
	// [DefaultMaxAttempts].
	MaxAttempts int
	// MaxRedrives is how many times the driver sends a logical payment
	// again, with the same key, after a call that did not succeed (the
	// transport gave up, or an answer other than 409 that sending again
	// may fix); 0 means [DefaultMaxRedrives], a negative value means
	// never.
	MaxRedrives int
	// InProgressWait is how long the driver keeps sending a payment again
	// while it is answered 409 (in progress), from the first 409 since
	// the last other answer; those re-drives do not count towards
	// MaxRedrives. 0 means [DefaultInProgressWait]; a negative value means
	// none (a 409 counts as any other failed call).
	InProgressWait time.Duration
	// Backoff is the client transport's backoff; nil means full jitter
	// with base 1 ms and cap 5 ms, so that a run takes seconds.
	Backoff *backoff.Backoff
	// NetHTTPResend lets the net/http transport under the retrying one
	// resend a request on its own after a failure on a reused keep-alive
	// connection, as it does for requests carrying an Idempotency-Key.
	// By default (false) the harness stops that (it hides the request's
	// GetBody from net/http), so every fault reaches the retrying transport
	// under test; true is the ordinary production stack, where net/http
	// absorbs most resets and drops before the retrying transport sees them.
	NetHTTPResend bool
}

// Run starts the servers and the proxy, makes cfg.Payments logical
// payments through a retrying client, stops everything and returns the
// result. Its error is about the set-up (bad config, a middleware that
// cannot be built) or ctx ending; the verdict is [Result.Err]. Each Run
// has its own servers, proxy and client: runs may go on concurrently
// (over distinct stores, or one store: keys never collide).
func Run(ctx context.Context, cfg Config) (*Result, error) {
	if len(cfg.Stores) == 0 {
		return nil, errors.New("idemtest: Run: no store")
	}
	cfg = withDefaults(cfg)
	if cfg.Payments < 0 || cfg.Workers < 0 {
		return nil, fmt.Errorf("idemtest: Run: payments %d and workers %d must not be negative", cfg.Payments, cfg.Workers)
	}
	if !(cfg.StoreBlipRate >= 0 && cfg.StoreBlipRate <= 1) {
		return nil, fmt.Errorf("idemtest: Run: store blip rate %v outside 0 to 1", cfg.StoreBlipRate)
	}
	ledger := &Ledger{}
	var timedOut, blips atomic.Int64
	upstreams, closeServers, err := startServers(cfg, ledger, &timedOut, &blips)
	defer closeServers()
	if err != nil {
		return nil, err
	}
	proxy, err := NewProxy(ProxyConfig{
		Upstreams:               upstreams,
		ResetRate:               cfg.ResetRate,
		DropRate:                cfg.DropRate,
		CutRate:                 cfg.CutRate,
		Seed:                    cfg.Seed,
		MaxIdleConnsPerUpstream: cfg.Workers,
	})
	if err != nil {
		return nil, fmt.Errorf("idemtest: Run: %w", err)
	}
	defer proxy.Close()

	base := &http.Transport{Proxy: nil, MaxIdleConnsPerHost: cfg.Workers, DisableCompression: true}
	defer base.CloseIdleConnections()
	tr, err := httpretry.NewTransport(keyTap{base: base, resend: cfg.NetHTTPResend},
		httpretry.WithAutoIdempotencyKey(),
		httpretry.WithRetry(
			retry.WithMaxAttempts(cfg.MaxAttempts),
			retry.WithBackoff(cfg.Backoff),
			// Below the middleware's Retry-After (1 s): the transport
			// hands a 409 (in progress) or a 503 with a hint back at once
			// and the driver re-drives it after a few milliseconds,
			// instead of every slow handler costing a second.
			retry.WithMaxRetryAfter(500*time.Millisecond),
		),
		httpretry.WithBudget(nil),  // a 30% fault rate would drain any budget sized for healthy traffic
		httpretry.WithBreaker(nil), // and trip the breaker: both would refuse retries, not test them
		// and, to the default per-host limiter, read as overload: it
		// would hold requests back (7x slower: 77 s against 10 s for the
		// memory store's hostile run), not test idempotency.
		httpretry.WithLimit(nil),
	)
	if err != nil {
		return nil, fmt.Errorf("idemtest: Run: %w", err)
	}
	d := &driver{
		ledger: ledger,
		client: &http.Client{Transport: tr},
		url:    proxy.URL() + "/payments",
		cfg:    cfg,
		keys:   make([]string, cfg.Payments),
	}

	start := time.Now()
	Drive(ctx, cfg.Payments, cfg.Workers, d.pay)
	elapsed := time.Since(start)
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("idemtest: Run: %w", err)
	}
	res := d.result(proxy.Stats(), elapsed)
	res.TimedOut = timedOut.Load()
	res.StoreBlips = blips.Load()
	return res, nil
}

// startServers starts one server per store of cfg, each a middleware (on
// the store, behind store blips if cfg asks for them) in front of
// ledger's payments handler (behind a timeout handler on even servers if
// cfg asks for one), and returns their URLs and a function that closes
// them all (to call even after an error). It counts the timeout handler's
// own answers in timedOut and the store blips in blips.
func startServers(cfg Config, ledger *Ledger, timedOut, blips *atomic.Int64) ([]string, func(), error) {
	var urls []string
	var servers []*httptest.Server
	closeAll := func() {
		for _, srv := range servers {
			srv.Close()
		}
	}
	for i, s := range cfg.Stores {
		if cfg.StoreBlipRate > 0 {
			s = newBlipStore(s, cfg.StoreBlipRate, cfg.Seed+uint64(i), blips)
		}
		opts := append([]idempotency.Option{SharedScope, idempotency.WithRequired()}, cfg.Middleware...)
		mw, err := idempotency.NewMiddleware(s, opts...)
		if err != nil {
			return nil, closeAll, fmt.Errorf("idemtest: Run: server %d: %w", i, err)
		}
		h := mw(ledger.HandlerWith("server-"+strconv.Itoa(i), cfg.Handler))
		if cfg.Timeout > 0 && i%2 == 0 {
			h = timeoutTap(http.TimeoutHandler(h, cfg.Timeout, timeoutMessage), timedOut)
		}
		mux := http.NewServeMux()
		mux.Handle("POST /payments", h)
		srv := httptest.NewServer(mux)
		servers = append(servers, srv)
		urls = append(urls, srv.URL)
	}
	return urls, closeAll, nil
}

func withDefaults(cfg Config) Config {
	if cfg.Payments == 0 {
		cfg.Payments = DefaultPayments
	}
	if cfg.Workers == 0 {
		cfg.Workers = DefaultWorkers
	}
	cfg.ResetRate = RateOr(cfg.ResetRate, DefaultResetRate)
	cfg.DropRate = RateOr(cfg.DropRate, DefaultDropRate)
	if cfg.Seed == 0 {
		cfg.Seed = 1
	}
	if cfg.MaxAttempts == 0 {
		cfg.MaxAttempts = DefaultMaxAttempts
	}
	switch {
	case cfg.MaxRedrives == 0:
		cfg.MaxRedrives = DefaultMaxRedrives
	case cfg.MaxRedrives < 0:
		cfg.MaxRedrives = 0
	}
	switch {
	case cfg.InProgressWait == 0:
		cfg.InProgressWait = DefaultInProgressWait
	case cfg.InProgressWait < 0:
		cfg.InProgressWait = 0
	}
	if cfg.Backoff == nil {
		// Cannot fail: valid constants.
		cfg.Backoff, _ = backoff.New(backoff.Config{Base: time.Millisecond, Cap: 5 * time.Millisecond})
	}
	return cfg
}

// Hostile returns cfg with the server-side faults on: the proxy cuts
// [HostileCutRate] of the answers mid-way, the even-numbered servers have
// an http.TimeoutHandler of [HostileTimeout] in front of the middleware,
// the handlers write answers of [HostileAnswerBytes] in [HostileChunks]
// flushed parts, [HostileSlowRate] of their runs pausing [HostilePause]
// (before applying the payment, or in all between the parts), and each server's
// link to its store blips at [HostileBlipRate] of its completions.
func Hostile(cfg Config) Config {
	cfg.CutRate = HostileCutRate
	cfg.StoreBlipRate = HostileBlipRate
	cfg.Timeout = HostileTimeout
	cfg.Handler = HandlerConfig{
		AnswerBytes: HostileAnswerBytes,
		Chunks:      HostileChunks,
		SlowRate:    HostileSlowRate,
		Pause:       HostilePause,
	}
	return cfg
}

// RunTest runs the harness with cfg, logs the result and fails tb if Run
// fails or the verdict is bad. It returns the result (nil after a failed
// Run).
func RunTest(tb testing.TB, cfg Config) *Result {
	tb.Helper()
	res, err := Run(tb.Context(), cfg)
	if !Report(tb, "idemtest.Run", res, err) {
		return nil
	}
	return res
}

// Payments returns the number of payments for an end-to-end test:
// [DefaultPayments] ([RacePayments] under the race detector), or the
// positive integer in the [PaymentsEnv] environment variable. A bad value
// fails tb.
func Payments(tb testing.TB) int {
	tb.Helper()
	if raceDetector {
		return PaymentsOr(tb, RacePayments)
	}
	return PaymentsOr(tb, DefaultPayments)
}

// PaymentsOr is [Payments] with def in place of [DefaultPayments].
func PaymentsOr(tb testing.TB, def int) int {
	tb.Helper()
	v := os.Getenv(PaymentsEnv)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n <= 0 {
		tb.Fatalf("%s=%q: want a positive integer", PaymentsEnv, v)
	}
	return n
}

// PaymentID returns the ID of the i-th payment of a run, e.g.
// "pay-000042".
func PaymentID(i int) string { return fmt.Sprintf("pay-%06d", i) }

// RateOr returns a fault rate as the harnesses' configurations read it:
// def for 0, none (0) for a negative rate, rate itself otherwise.
func RateOr(rate, def float64) float64 {
	switch {
	case rate == 0:
		return def
	case rate < 0:
		return 0
	}
	return rate
}
