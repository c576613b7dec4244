// Package keyedtest is an end-to-end harness for gRPC idempotency keys:
// it checks that grpcretry's retrying client, making one idempotency key
// per call (grpcretry.WithAutoIdempotencyKey), and
// grpcretry.IdempotencyUnaryServerInterceptor together apply every
// logical operation exactly once over a network that resets and cuts
// connections.
//
// [Run] starts one gRPC server per idempotency store it is given (pass the
// same store twice, or two stores over one database, for two servers that
// share a store), each serving a payments service that records every
// application in one shared ledger, and puts a lossy TCP proxy in front of
// each: it resets a connection before some of what the client sent reaches
// the server, and cuts others after it did (the server runs the call; its
// reply, and every other call in flight on that connection, is lost). Some
// handler runs are slow, so that a retry finds its key in progress, or the
// handler gives up when its caller went away. A driver makes many logical
// payments through a grpcretry client balanced over the servers, sending a
// payment again with its key when a call did not succeed, and the [Result]
// gives the ledger's verdict: duplicates, lost payments, failed calls,
// answers that differ from what the handler produced, with the counts of
// the faults and replays seen.
//
// The package is meant for grpcretry's end-to-end tests, in the test-only
// module grpcretry/test (so that grpcretry's own go.mod requires no store
// driver, and no shipped code imports the root module's internal
// packages): [RunTest] runs the harness and fails a test on a bad verdict.
// They run it on the in-memory store and on real PostgreSQL and Redis
// servers.
package keyedtest

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	grpcbackoff "google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	testpb "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/resolver/manual"
	"google.golang.org/grpc/status"

	"github.com/stormguard/stormguard/backoff"
	"github.com/stormguard/stormguard/grpcretry"
	"github.com/stormguard/stormguard/idempotency"
	"github.com/stormguard/stormguard/idempotency/store"
	"github.com/stormguard/stormguard/internal/idemtest"
	"github.com/stormguard/stormguard/retry"
)

// Defaults of a [Config].
const (
	DefaultPayments    = 2000
	DefaultWorkers     = 16
	DefaultResetRate   = 0.03
	DefaultCutRate     = 0.05
	DefaultMaxRedrives = 20
)

// Slow handler runs: SlowRate of the runs, chosen by a hash of the payment
// and the run's number for it, pause Pause; half of them before applying
// the payment (they give up if their caller went away meanwhile), half
// after (the payment is applied: they finish their answer).
const (
	SlowRate = 0.10
	Pause    = 10 * time.Millisecond
)

// Config configures [Run]. The zero value of each field means its default.
type Config struct {
	// Stores has one store per server: Run starts len(Stores) servers,
	// the i-th guarded by the interceptor on Stores[i]. At least one.
	Stores []store.Store
	// Guard are the options of every server's idempotency.Guard
	// (idempotency.NewGuard), e.g. a short retention.
	Guard []idempotency.GuardOption
	// Interceptor are extra options for every server's interceptor, after
	// the harness's own (one shared key scope: the driver is the
	// only caller; grpcretry.WithKeyRequired; grpcretry.WithKeyPushback
	// of 5 ms).
	Interceptor []grpcretry.IdempotencyOption
	// Payments is the number of logical payments; 0 means
	// [DefaultPayments].
	Payments int
	// Workers is the number of payments made at the same time; 0 means
	// [DefaultWorkers].
	Workers int
	// ResetRate and CutRate are the proxies' fault rates per chunk a
	// client sends (see idemtest.TCPFaults); 0 means [DefaultResetRate]
	// and [DefaultCutRate], a negative value means none.
	ResetRate, CutRate float64
	// Seed seeds the proxies' faults (server i's proxy uses Seed+i); 0
	// means 1.
	Seed uint64
}

// Result is what [Run] measured. [Result.Err] gives the verdict.
type Result struct {
	// Payments is the number of logical payments made; Applied the number
	// the ledger applied at least once; Duplicates the extra applications
	// (the sum over payments of times applied - 1); Lost the payments
	// never applied; Unknown the ledger entries for payments never sent.
	Payments, Applied, Duplicates, Lost, Unknown int
	// Failed is the number of payments whose calls never succeeded (after
	// every re-drive, or with an answer that cannot be retried).
	Failed int
	// Calls is the number of client calls: one per payment plus the
	// re-drives (Redrives: calls that sent a payment again with its key
	// after a call that did not succeed). Attempts is the number of
	// attempts grpcretry's client sent.
	Calls, Redrives, Attempts int64
	// Aborted and Unavailable are the attempts answered ABORTED (the key
	// in progress) and UNAVAILABLE (a reset or cut connection, mostly).
	Aborted, Unavailable int64
	// Replays is the number of payments whose successful call was answered
	// from the store (header idempotent-replayed: true).
	Replays int64
	// BadAnswers is the number of successful calls whose reply differs
	// from the answer the handler produced for the payment, as the ledger
	// recorded it. KeyErrors is the number of calls in which an attempt
	// carried no key or another key than the payment's. Always 0 unless
	// something is broken.
	BadAnswers, KeyErrors int64
	// Chunks, Resets and Cuts are the proxies' counts: what clients sent,
	// dropped with a reset, and cut after it reached the server.
	Chunks, Resets, Cuts int64
	// GaveUp is the number of slow handler runs that gave up because
	// their caller went away before they applied the payment; RanOn the
	// slow runs that applied it and then paused.
	GaveUp, RanOn int64
	// RunsByServer maps server name ("server-0", ...) to the applications
	// its handler made.
	RunsByServer map[string]int
	// Elapsed is the wall time of the payments (set-up excluded).
	Elapsed time.Duration
	// Errors has the first few failures, for the report.
	Errors []string
	// ResetRate and CutRate are the configured rates: when positive, the
	// verdict wants resets and cuts to have happened.
	ResetRate, CutRate float64
}

// Err returns nil when the run passed: every payment applied exactly once
// (no duplicate, none lost, none unknown), every payment's calls ended in
// success with the answer its handler produced, every attempt of a
// payment carried its one key; and the faults happened: resets and cuts
// (at the configured rates), replays, and handlers ran on every server.
// Otherwise its error lists every violation.
func (r *Result) Err() error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if r.Payments == 0 {
		bad("no payment made")
	}
	if r.Duplicates != 0 || r.Lost != 0 || r.Unknown != 0 || r.Applied != r.Payments {
		bad("applied %d of %d payments, %d duplicates, %d lost, %d unknown: want each applied once", r.Applied, r.Payments, r.Duplicates, r.Lost, r.Unknown)
	}
	if r.Failed != 0 {
		bad("%d payments failed (no successful call); first errors: %s", r.Failed, strings.Join(r.Errors, "; "))
	}
	if r.BadAnswers != 0 || r.KeyErrors != 0 {
		bad("%d answers differ from what the handler produced and %d calls carried a wrong key: want 0", r.BadAnswers, r.KeyErrors)
	}
	if (r.ResetRate > 0 && r.Resets == 0) || (r.CutRate > 0 && (r.Cuts == 0 || r.Replays == 0)) {
		bad("resets %d, cuts %d, replays %d: want some of each (the run proves nothing)", r.Resets, r.Cuts, r.Replays)
	}
	for name, n := range r.RunsByServer {
		if n == 0 {
			bad("%s applied no payment", name)
		}
	}
	return errors.Join(errs...)
}

// String formats the result as a small report.
func (r *Result) String() string {
	pct := func(n int64) float64 { return 100 * float64(n) / float64(max(r.Chunks, 1)) }
	return fmt.Sprintf("payments %d in %v (%.0f/s): applied %d, duplicates %d, lost %d, unknown %d, failed %d; runs by server %v\n"+
		"client: calls %d (re-drives %d), attempts %d, answered ABORTED %d, UNAVAILABLE %d; final replays %d, bad answers %d, key errors %d\n"+
		"network: chunks %d, resets %d (%.1f%%), cuts %d (%.1f%%); slow handler runs that gave up %d, that ran on %d",
		r.Payments, r.Elapsed.Round(time.Millisecond), float64(r.Payments)/r.Elapsed.Seconds(), r.Applied, r.Duplicates, r.Lost, r.Unknown, r.Failed, r.RunsByServer,
		r.Calls, r.Redrives, r.Attempts, r.Aborted, r.Unavailable, r.Replays, r.BadAnswers, r.KeyErrors,
		r.Chunks, r.Resets, pct(r.Resets), r.Cuts, pct(r.Cuts), r.GaveUp, r.RanOn)
}

// RunTest runs the harness with cfg, logs the result and fails tb if Run
// fails or the verdict is bad. It returns the result (nil after a failed
// Run).
func RunTest(tb testing.TB, cfg Config) *Result {
	tb.Helper()
	res, err := Run(tb.Context(), cfg)
	if !idemtest.Report(tb, "keyedtest.Run (gRPC end to end)", res, err) {
		return nil
	}
	return res
}

// Payments returns the number of payments for an end-to-end test:
// [DefaultPayments], or the positive integer in the environment variable
// idemtest.PaymentsEnv (STORMGUARD_E2E_PAYMENTS). A bad value fails tb.
func Payments(tb testing.TB) int {
	tb.Helper()
	return idemtest.PaymentsOr(tb, DefaultPayments)
}

// Run starts the servers and the proxies, makes cfg.Payments logical
// payments, stops everything and returns the result. Its error is about
// the set-up (bad config, an interceptor that cannot be built) or ctx
// ending; the verdict is [Result.Err].
func Run(ctx context.Context, cfg Config) (*Result, error) {
	if len(cfg.Stores) == 0 {
		return nil, errors.New("keyedtest: Run: no store")
	}
	cfg = withDefaults(cfg)
	if cfg.Payments < 0 || cfg.Workers < 0 {
		return nil, fmt.Errorf("keyedtest: Run: payments %d and workers %d must not be negative", cfg.Payments, cfg.Workers)
	}
	ledger := &idemtest.Ledger{}
	var gaveUp, ranOn atomic.Int64
	var proxies []*idemtest.TCPProxy
	var addrs []resolver.Address
	for i, store := range cfg.Stores {
		g, err := idempotency.NewGuard(store, cfg.Guard...)
		if err != nil {
			return nil, fmt.Errorf("keyedtest: Run: server %d: %w", i, err)
		}
		opts := append([]grpcretry.IdempotencyOption{grpcretry.WithKeyScope(func(context.Context) (string, error) { return "shared", nil }), grpcretry.WithKeyRequired(),
			grpcretry.WithKeyPushback(5 * time.Millisecond)}, cfg.Interceptor...)
		ic, err := grpcretry.IdempotencyUnaryServerInterceptor(g, opts...)
		if err != nil {
			return nil, fmt.Errorf("keyedtest: Run: server %d: %w", i, err)
		}
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("keyedtest: Run: %w", err)
		}
		srv := grpc.NewServer(grpc.ChainUnaryInterceptor(ic))
		testpb.RegisterTestServiceServer(srv, &payments{name: "server-" + strconv.Itoa(i), ledger: ledger,
			runs: make(map[string]int), gaveUp: &gaveUp, ranOn: &ranOn})
		go func() { _ = srv.Serve(ln) }()
		defer srv.Stop()
		p, err := idemtest.NewTCPProxy(ln.Addr().String())
		if err != nil {
			return nil, fmt.Errorf("keyedtest: Run: %w", err)
		}
		defer p.Close()
		if err := p.SetFaults(idemtest.TCPFaults{ResetRate: cfg.ResetRate, CutRate: cfg.CutRate, Seed: cfg.Seed + uint64(i)}); err != nil {
			return nil, fmt.Errorf("keyedtest: Run: %w", err)
		}
		proxies = append(proxies, p)
		addrs = append(addrs, resolver.Address{Addr: p.Addr()})
	}

	conn, err := dial(addrs)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	d := &driver{ledger: ledger, client: testpb.NewTestServiceClient(conn),
		res: &Result{Payments: cfg.Payments, ResetRate: cfg.ResetRate, CutRate: cfg.CutRate}}

	start := time.Now()
	idemtest.Drive(ctx, cfg.Payments, cfg.Workers, d.pay)
	res := d.res
	res.Elapsed = time.Since(start)
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("keyedtest: Run: %w", err)
	}

	res.Applied, res.Duplicates, res.Lost, res.Unknown = ledger.Tally(cfg.Payments)
	_, res.RunsByServer = ledger.Snapshot()
	for i := range cfg.Stores {
		if _, ok := res.RunsByServer["server-"+strconv.Itoa(i)]; !ok {
			res.RunsByServer["server-"+strconv.Itoa(i)] = 0
		}
	}
	for _, p := range proxies {
		res.Chunks += p.Chunks()
		res.Resets += p.Resets()
		res.Cuts += p.Cuts()
	}
	res.GaveUp, res.RanOn = gaveUp.Load(), ranOn.Load()
	return res, nil
}

// dial returns a connection through grpcretry's client (a key per call,
// retried, no budget or breaker) balanced round-robin over addrs.
func dial(addrs []resolver.Address) (*grpc.ClientConn, error) {
	// Cannot fail: valid constants.
	bo, _ := backoff.New(backoff.Config{Base: time.Millisecond, Cap: 5 * time.Millisecond})
	c, err := grpcretry.DialOptions(grpcretry.WithAutoIdempotencyKey(),
		grpcretry.WithBudget(nil),  // a fault rate this high would drain any budget sized for healthy traffic
		grpcretry.WithBreaker(nil), // and trip the breaker: both would refuse retries, not test them
		grpcretry.WithRetry(retry.WithMaxAttempts(10), retry.WithBackoff(bo),
			// Below the interceptor's default pushback (1 s), in case a
			// caller's options change it: a slow first call costs the
			// driver a re-drive, not a second.
			retry.WithMaxRetryAfter(500*time.Millisecond)))
	if err != nil {
		return nil, fmt.Errorf("keyedtest: Run: %w", err)
	}
	r := manual.NewBuilderWithScheme("keyedtest")
	r.InitialState(resolver.State{Addresses: addrs})
	conn, err := grpc.NewClient(r.Scheme()+":///payments", append(c,
		grpc.WithResolvers(r),
		grpc.WithDefaultServiceConfig(`{"loadBalancingConfig":[{"round_robin":{}}]}`),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		// A connection reset during its handshake is tried again after
		// this backoff, not grpc-go's default second.
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           grpcbackoff.Config{BaseDelay: 5 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: 50 * time.Millisecond},
			MinConnectTimeout: time.Second,
		}),
		grpc.WithChainUnaryInterceptor(tap))...)
	if err != nil {
		return nil, fmt.Errorf("keyedtest: Run: %w", err)
	}
	return conn, nil
}

func withDefaults(cfg Config) Config {
	if cfg.Payments == 0 {
		cfg.Payments = DefaultPayments
	}
	if cfg.Workers == 0 {
		cfg.Workers = DefaultWorkers
	}
	cfg.ResetRate = idemtest.RateOr(cfg.ResetRate, DefaultResetRate)
	cfg.CutRate = idemtest.RateOr(cfg.CutRate, DefaultCutRate)
	if cfg.Seed == 0 {
		cfg.Seed = 1
	}
	return cfg
}

// payments is the payments service: it applies the idemtest.Payment sent
// as a SimpleRequest's payload to the ledger, and answers the payment with
// its application count and the server's name.
type payments struct {
	testpb.UnimplementedTestServiceServer
	name   string
	ledger *idemtest.Ledger

	mu   sync.Mutex
	runs map[string]int // payment ID -> runs started; guarded by mu

	gaveUp, ranOn *atomic.Int64
}

// start counts a new run for payment id and returns its number, from 1.
func (s *payments) start(id string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.runs[id]++
	return s.runs[id]
}

func (s *payments) UnaryCall(ctx context.Context, req *testpb.SimpleRequest) (*testpb.SimpleResponse, error) {
	var p idemtest.Payment
	if err := json.Unmarshal(req.GetPayload().GetBody(), &p); err != nil || p.ID == "" {
		return nil, status.Error(codes.InvalidArgument, "want a JSON payment with an ID")
	}
	h := fnv.New64a()
	fmt.Fprintf(h, "%s/%d", p.ID, s.start(p.ID))
	x := float64(h.Sum64()>>11) / (1 << 53)
	if x < SlowRate/2 {
		t := time.NewTimer(Pause)
		select {
		case <-ctx.Done():
			t.Stop()
			s.gaveUp.Add(1)
			return nil, status.FromContextError(ctx.Err()).Err()
		case <-t.C:
		}
	}
	p.Applied = s.ledger.Apply(p.ID, s.name)
	p.Server = s.name
	out, _ := json.Marshal(p) // cannot fail: strings and integers
	if x >= SlowRate/2 && x < SlowRate {
		time.Sleep(Pause)
		s.ranOn.Add(1)
	}
	s.ledger.Answered(p.ID, out)
	return &testpb.SimpleResponse{Username: p.ID, Payload: &testpb.Payload{Body: out}}, nil
}

// attempts records, for one call, the idempotency key of each attempt as
// grpcretry's client sent it, and the attempts answered ABORTED and
// UNAVAILABLE.
type attempts struct {
	mu                      sync.Mutex
	key                     string
	n, aborted, unavailable int
	bad                     bool // an attempt had no key, or another one
}

// attemptsKey is the context key of a call's *attempts.
type attemptsKey struct{}

// tap is the client interceptor under grpcretry's: it sees every attempt.
func tap(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	err := invoker(ctx, method, req, reply, cc, opts...)
	if a, ok := ctx.Value(attemptsKey{}).(*attempts); ok {
		vs := metadata.ValueFromOutgoingContext(ctx, idempotency.Header)
		a.mu.Lock()
		defer a.mu.Unlock()
		a.n++
		switch {
		case len(vs) != 1 || vs[0] == "":
			a.bad = true
		case a.key == "":
			a.key = vs[0]
		case a.key != vs[0]:
			a.bad = true
		}
		switch status.Code(err) {
		case codes.Aborted:
			a.aborted++
		case codes.Unavailable:
			a.unavailable++
		}
	}
	return err
}

// driver makes the payments.
type driver struct {
	ledger *idemtest.Ledger
	client testpb.TestServiceClient

	mu  sync.Mutex
	res *Result // its counts are guarded by mu
}

// pay makes payment i: a first call, whose key grpcretry's client makes,
// then, while the payment is not known to be applied, re-drives with the
// same key (as the client's attempts carried it, or as its error names
// it). Sending it with a new key could apply it twice.
func (d *driver) pay(ctx context.Context, i int) {
	id := idemtest.PaymentID(i)
	body, _ := json.Marshal(idemtest.Payment{ID: id, AmountCents: 100 + int64(i%900)})
	req := &testpb.SimpleRequest{Payload: &testpb.Payload{Body: body}}
	key := ""
	for redrive := 0; ; redrive++ {
		a := &attempts{}
		cctx := context.WithValue(ctx, attemptsKey{}, a)
		if key != "" {
			cctx = metadata.AppendToOutgoingContext(cctx, idempotency.Header, key)
		}
		var header metadata.MD
		cctx, cancel := context.WithTimeout(cctx, 10*time.Second) // the call's deadline, its retries included
		resp, err := d.client.UnaryCall(cctx, req, grpc.Header(&header), grpc.WaitForReady(true))
		cancel()
		a.mu.Lock()
		d.count(a, key, redrive > 0)
		if key == "" {
			key = a.key
		}
		a.mu.Unlock()
		if err == nil {
			want, ok := d.ledger.Produced(id)
			d.mu.Lock()
			defer d.mu.Unlock()
			if !ok || sha256.Sum256(resp.GetPayload().GetBody()) != want {
				d.res.BadAnswers++
			}
			if len(header.Get(idempotency.ReplayHeader)) > 0 {
				d.res.Replays++
			}
			return
		}
		if code := status.Code(err); (code != codes.Unavailable && code != codes.Aborted) || redrive == DefaultMaxRedrives || ctx.Err() != nil {
			d.mu.Lock()
			defer d.mu.Unlock()
			d.res.Failed++
			if len(d.res.Errors) < 5 {
				d.res.Errors = append(d.res.Errors, fmt.Sprintf("%s after %d re-drives: %v", id, redrive, err))
			}
			return
		}
		var ge *grpcretry.Error
		if key == "" && errors.As(err, &ge) {
			key = ge.IdempotencyKey // no attempt went out: the key the client made
		}
		// A short pause: the first call may still run.
		t := time.NewTimer(time.Duration(redrive+1) * 2 * time.Millisecond)
		select {
		case <-ctx.Done():
			t.Stop()
		case <-t.C:
		}
	}
}

// count adds a call's attempts to the result; key is the payment's key
// ("" if the client makes it), redrive whether the call is a re-drive.
// It requires a.mu held.
func (d *driver) count(a *attempts, key string, redrive bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	r := d.res
	r.Calls++
	r.Attempts += int64(a.n)
	r.Aborted += int64(a.aborted)
	r.Unavailable += int64(a.unavailable)
	if a.bad || (key != "" && a.key != "" && a.key != key) {
		r.KeyErrors++
	}
	if redrive {
		r.Redrives++
	}
}
