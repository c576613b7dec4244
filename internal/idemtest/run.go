package idemtest

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"sync"
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
	DefaultPayments    = 10000
	DefaultWorkers     = 16
	DefaultResetRate   = 0.10
	DefaultDropRate    = 0.20
	DefaultMaxAttempts = 10
	DefaultMaxRedrives = 20
)

// Settings of [Hostile].
const (
	HostileCutRate     = 0.05
	HostileTimeout     = 20 * time.Millisecond
	HostileAnswerBytes = 16 << 10
	HostileChunks      = 8
	HostileSlowRate    = 0.10
	HostilePause       = 25 * time.Millisecond
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
	// the harness's own (idempotency.WithSharedScope: the driver is the
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
	// ([httpretry.WithMaxAttempts]); 0 means [DefaultMaxAttempts].
	MaxAttempts int
	// MaxRedrives is how many times the driver sends a logical payment
	// again, with the same key, after a call that did not succeed (the
	// transport gave up, or 409 in progress); 0 means
	// [DefaultMaxRedrives], a negative value means never.
	MaxRedrives int
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
// configured, and every server took requests. Otherwise its error lists
// every violation.
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
	fmt.Fprintf(&b, "handlers: aborted %d, overran %d, timed out by the timeout handler %d (timeout %v, slow rate %.2f)\n", r.Aborted, r.Overran, r.TimedOut, r.Timeout, r.SlowRate)
	fmt.Fprintf(&b, "client: calls %d, attempts %d (+%d resent by net/http below the transport), re-drives %d, gave up %d, 409s %d, final replays %d, failed %d, key errors %d, bad replays %d, bad answers %d\n",
		r.Calls, r.Attempts, max(0, p.Requests-r.Attempts), r.Redrives, r.GaveUp, r.Conflicts, r.Replays, r.Failed, r.KeyErrors, r.BadReplays, r.BadAnswers)
	fmt.Fprintf(&b, "proxy: requests %d, resets %d (%.1f%%), drops %d (%.1f%%, %d originals), cuts %d (%.1f%%, %d originals), forwarded %d %v, relayed %d (replays %d, 409s %d), upstream errors %d",
		p.Requests, p.Resets, pct(p.Resets), p.Drops, pct(p.Drops), p.DroppedOriginals, p.Cuts, pct(p.Cuts), p.CutOriginals,
		p.Forwarded, p.PerUpstream, p.Relayed, p.RelayedReplays, p.RelayedConflicts, p.UpstreamErrors)
	return b.String()
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
	ledger := &Ledger{}
	var timedOut atomic.Int64
	var upstreams []string
	for i, s := range cfg.Stores {
		opts := append([]idempotency.Option{idempotency.WithSharedScope(), idempotency.WithRequired()}, cfg.Middleware...)
		mw, err := idempotency.NewMiddleware(s, opts...)
		if err != nil {
			return nil, fmt.Errorf("idemtest: Run: server %d: %w", i, err)
		}
		h := mw.Handler(ledger.HandlerWith("server-"+strconv.Itoa(i), cfg.Handler))
		if cfg.Timeout > 0 && i%2 == 0 {
			h = timeoutTap(http.TimeoutHandler(h, cfg.Timeout, timeoutMessage), &timedOut)
		}
		mux := http.NewServeMux()
		mux.Handle("POST /payments", h)
		srv := httptest.NewServer(mux)
		defer srv.Close()
		upstreams = append(upstreams, srv.URL)
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
		httpretry.WithoutBudget(),  // a 30% fault rate would drain any budget sized for healthy traffic
		httpretry.WithoutBreaker(), // and trip the breaker: both would refuse retries, not test them
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

	res := &Result{
		Payments:   cfg.Payments,
		Servers:    len(cfg.Stores),
		Failed:     int(d.failed.Load()),
		Calls:      d.calls.Load(),
		Attempts:   d.attempts.Load(),
		Redrives:   d.redrives.Load(),
		GaveUp:     d.gaveUp.Load(),
		Conflicts:  d.conflicts.Load(),
		Replays:    d.replays.Load(),
		BadReplays: d.badReplays.Load(),
		BadAnswers: d.badAnswers.Load(),
		KeyErrors:  d.keyErrors.Load(),
		Proxy:      proxy.Stats(),
		Elapsed:    elapsed,
		Errors:     d.errs,
		ResetRate:  cfg.ResetRate,
		DropRate:   cfg.DropRate,
		CutRate:    cfg.CutRate,
		Timeout:    cfg.Timeout,
		SlowRate:   cfg.Handler.SlowRate,
	}
	res.Aborted, res.Overran = ledger.Slow()
	res.TimedOut = timedOut.Load()
	res.Applied, res.Duplicates, res.Lost, res.Unknown = ledger.Tally(cfg.Payments)
	_, res.RunsByServer = ledger.Snapshot()
	seen := make(map[string]bool, len(d.keys))
	for _, k := range d.keys {
		if k == "" {
			continue
		}
		if seen[k] {
			res.KeyCollisions++
		}
		seen[k] = true
	}
	return res, nil
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
	if cfg.Backoff == nil {
		// Cannot fail: valid constants.
		cfg.Backoff, _ = backoff.New(backoff.Config{Base: time.Millisecond, Cap: 5 * time.Millisecond})
	}
	return cfg
}

// timeoutMessage is the body of the 503 the timeout handler answers.
const timeoutMessage = "idemtest: handler timeout"

// timeoutTap counts in n the requests h (an http.TimeoutHandler) answers
// with its own 503.
func timeoutTap(h http.Handler, n *atomic.Int64) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.ServeHTTP(&statusTap{ResponseWriter: w, n: n}, r)
	})
}

// statusTap counts the timeout handler's own answer.
type statusTap struct {
	http.ResponseWriter
	status int
	n      *atomic.Int64
}

func (s *statusTap) WriteHeader(code int) {
	if s.status == 0 {
		s.status = code
	}
	s.ResponseWriter.WriteHeader(code)
}

func (s *statusTap) Write(p []byte) (int, error) {
	if s.status == http.StatusServiceUnavailable && string(p) == timeoutMessage {
		s.n.Add(1)
	}
	return s.ResponseWriter.Write(p)
}

// Hostile returns cfg with the server-side faults on: the proxy cuts
// [HostileCutRate] of the answers mid-way, the even-numbered servers have
// an http.TimeoutHandler of [HostileTimeout] in front of the middleware,
// and the handlers write answers of [HostileAnswerBytes] in
// [HostileChunks] flushed parts, [HostileSlowRate] of their runs pausing
// [HostilePause] (before applying the payment, or before each part).
func Hostile(cfg Config) Config {
	cfg.CutRate = HostileCutRate
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

// Payments returns the number of payments for an end-to-end test:
// [DefaultPayments], or the positive integer in the [PaymentsEnv]
// environment variable. A bad value fails tb.
func Payments(tb testing.TB) int {
	tb.Helper()
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

// Drive makes payments 0 to n-1, calling pay for each on one of workers
// goroutines, and returns once every call returned. Once ctx has ended no
// new payment starts.
func Drive(ctx context.Context, n, workers int, pay func(ctx context.Context, i int)) {
	jobs := make(chan int)
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for i := range jobs {
				pay(ctx, i)
			}
		})
	}
	for i := range n {
		if ctx.Err() != nil {
			break
		}
		jobs <- i
	}
	close(jobs)
	wg.Wait()
}

// driver makes the payments.
type driver struct {
	ledger *Ledger
	client *http.Client
	url    string
	cfg    Config
	keys   []string // keys[i]: payment i's key; each written by one worker

	calls, attempts, redrives, gaveUp, conflicts, replays atomic.Int64
	keyErrors, failed, badReplays, badAnswers             atomic.Int64

	mu   sync.Mutex // guards errs
	errs []string
}

// maxErrors bounds Result.Errors.
const maxErrors = 5

func (d *driver) fail(format string, args ...any) {
	d.failed.Add(1)
	d.mu.Lock()
	defer d.mu.Unlock()
	if len(d.errs) < maxErrors {
		d.errs = append(d.errs, fmt.Sprintf(format, args...))
	}
}

// outcome is how a call ended.
type outcome int

const (
	succeeded outcome = iota
	unknown           // not known to be applied: send again with the same key
	rejected          // an answer that sending again cannot fix
)

// pay makes payment i: a first call through the transport's automatic key,
// then, while the payment is not known to be applied, re-drives with the
// same key.
//
// Why the key is taken from the wire: the main path must leave the key to
// [httpretry.WithAutoIdempotencyKey], so the driver never sees it. But
// when that call fails (the transport gave up, or 409) the payment may or
// may not have been applied; sending it with a new key could apply it
// twice, and not sending it could lose it. So keyTap, the base transport
// under the retrying one, records the key every attempt carries into a
// slot in the request's context; the re-drive sends that key explicitly
// (the transport keeps a caller's key as is). This also checks the
// transport: every attempt of one call must carry one and the same key.
// If no attempt was sent at all, no key exists and none was used: the
// re-drive makes a new one.
func (d *driver) pay(ctx context.Context, i int) {
	id := PaymentID(i)
	body, _ := json.Marshal(Payment{ID: id, AmountCents: 100 + int64(i%900)})
	slot := &keySlot{}
	ctx = context.WithValue(ctx, slotKey{}, slot)
	out, why := d.call(ctx, id, body, "", slot)
	for r := 0; out == unknown; r++ {
		if r == d.cfg.MaxRedrives {
			d.fail("%s: no success after %d re-drives: %s", id, r, why)
			d.keys[i] = slot.get()
			return
		}
		// A short pause: a 409 means the first request still runs.
		t := time.NewTimer(time.Duration(r+1) * 2 * time.Millisecond)
		select {
		case <-ctx.Done():
			t.Stop()
			d.fail("%s: %v", id, ctx.Err())
			return
		case <-t.C:
		}
		key := slot.get()
		if key == "" {
			key = idempotency.NewKey()
		}
		d.redrives.Add(1)
		out, why = d.call(ctx, id, body, key, slot)
	}
	d.keys[i] = slot.get()
	if out == rejected {
		d.fail("%s: %s", id, why)
	}
}

// call makes one client call for payment id; key "" leaves the key to the
// transport.
func (d *driver) call(ctx context.Context, id string, body []byte, key string, slot *keySlot) (outcome, string) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, d.url, bytes.NewReader(body))
	if err != nil {
		return rejected, err.Error()
	}
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set(idempotency.Header, key)
		slot.expect(key)
	}
	d.calls.Add(1)
	resp, err := d.client.Do(req)
	n, keyOK := slot.endCall()
	d.attempts.Add(int64(n))
	if !keyOK {
		d.keyErrors.Add(1)
	}
	if err != nil {
		d.gaveUp.Add(1)
		return unknown, err.Error()
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		return unknown, "reading the answer: " + err.Error()
	}
	if _, gaveUp := httpretry.GaveUp(resp); gaveUp {
		d.gaveUp.Add(1)
	}
	switch code := resp.StatusCode; {
	case code == http.StatusCreated:
		replay := resp.Header.Get(idempotency.ReplayHeader) == "true"
		if want, ok := d.ledger.Produced(id); !ok || sha256.Sum256(data) != want {
			what := "answer"
			if replay {
				what = "replay"
				d.badReplays.Add(1)
			} else {
				d.badAnswers.Add(1)
			}
			return rejected, fmt.Sprintf("201 %s of %d bytes (%.40q...) differs from what the handler produced for %s", what, len(data), data, id)
		}
		var p Payment
		if err := json.Unmarshal(data, &p); err != nil || p.ID != id {
			return rejected, fmt.Sprintf("201 with body %q, want payment %s", data, id)
		}
		if replay {
			d.replays.Add(1)
		}
		return succeeded, ""
	case code == http.StatusConflict:
		d.conflicts.Add(1)
		return unknown, "409 in progress"
	case code >= 500:
		return unknown, fmt.Sprintf("%d %s", code, bytes.TrimSpace(data))
	default:
		return rejected, fmt.Sprintf("status %d, body %q", code, data)
	}
}

// slotKey is the context key of a *keySlot.
type slotKey struct{}

// keySlot records the Idempotency-Key of the attempts of one payment's
// calls, as keyTap sees them on the wire.
type keySlot struct {
	mu       sync.Mutex
	key      string // the payment's key: the first one seen or expected
	callKey  string // the key of the current call's first attempt
	attempts int    // attempts of the current call
	bad      bool   // an attempt of the current call had another key or none
}

// get returns the payment's key, "" if none was sent yet.
func (s *keySlot) get() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.key
}

// expect sets the key the next call must send on every attempt.
func (s *keySlot) expect(key string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.key, s.callKey = key, key
}

// observe records one attempt's key.
func (s *keySlot) observe(key string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.attempts++
	switch {
	case key == "":
		s.bad = true
	case s.callKey == "":
		s.callKey = key
		if s.key == "" {
			s.key = key
		} else if s.key != key {
			s.bad = true
		}
	case s.callKey != key:
		s.bad = true
	}
}

// endCall returns the current call's attempts and whether they all carried
// the right key, and resets the per-call state.
func (s *keySlot) endCall() (attempts int, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	attempts, ok = s.attempts, !s.bad
	s.attempts, s.bad, s.callKey = 0, false, ""
	return attempts, ok
}

// keyTap is the base transport under the retrying one: it reports the key
// of each attempt to the request context's keySlot and, unless resend is
// set, keeps net/http from resending the attempt on its own.
type keyTap struct {
	base   http.RoundTripper
	resend bool
}

func (k keyTap) RoundTrip(r *http.Request) (*http.Response, error) {
	if !k.resend && r.GetBody != nil {
		// net/http resends a request after a failure on a reused
		// connection only if it can rewind the body (GetBody).
		r2 := *r
		r2.GetBody = nil
		r = &r2
	}
	if s, ok := r.Context().Value(slotKey{}).(*keySlot); ok {
		var key string
		if vs := r.Header[idempotency.Header]; len(vs) == 1 {
			key = vs[0]
		}
		s.observe(key)
	}
	return k.base.RoundTrip(r)
}
