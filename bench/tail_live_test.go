package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/failsafe-go/failsafe-go"
	"github.com/failsafe-go/failsafe-go/failsafehttp"
	"github.com/failsafe-go/failsafe-go/hedgepolicy"

	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/httpretry"
	"github.com/stormguard/stormguard/observe"
)

// The live tail scenario (issue 23): a loopback provider with bounded
// concurrency (tailWorkers workers, a queue of tailQueue requests, 503
// beyond it), whose work is a sleep of tailWork holding a worker, so that
// latency grows with load; 1% of its requests take tailSlowBy times longer.
// Open-loop GETs (Poisson arrivals, seeded) at a rate that keeps it at 50%
// load, each with a deadline of tailDeadline, through one client per row:
// stormguard with hedging (learned p95), stormguard without, failsafe-go's
// hedge policy with a learned p95 delay and with a fixed delay (the
// no-hedging row's p95 in the same run). Three provider variants:
//
//   - random: each request is slow with probability 1% (a seeded generator);
//   - replica: the provider stands for 100 replicas behind one address, as
//     an L4 balancer would: each TCP connection is pinned at accept to
//     replica (accept index mod 100), and every request on replica 0's
//     connections is slow; the provider closes a connection after
//     tailConnRequests requests (a server's max requests per connection),
//     so connections, and with them the slow replica, rotate. All replicas
//     share the one worker pool;
//   - overload: random, at 95% load, with the service time x5 for 10 s:
//     hedges must stop, and recovery must be no slower than without them.
//
// TestLiveTail is a measurement, not a test: it runs only when
// STORMGUARD_LIVE_TAIL=1 is set, takes about 7 minutes, and prints its
// command, the machine's load before and after each row, and the tables.
// STORMGUARD_LIVE_TAIL_SCENARIOS (comma list of random, replica,
// overload), _DURATION (of the random and replica rows [30s]; of the
// overload rows too when longer than their 40 s, so that a client still
// slow at 40 s can be seen to recover) and _MD (a file to write the report
// to) change what it runs.

const (
	tailWorkers      = 10
	tailWork         = 10 * time.Millisecond
	tailSlowBy       = 10
	tailSlowShare    = 0.01
	tailQueue        = 100
	tailDeadline     = 2 * time.Second
	tailWarmup       = 2 * time.Second
	tailReplicas     = 100
	tailConnRequests = 20
	tailSeed         = 42
	tailNormalFor    = 3 // seconds in a row that make a recovery
)

// tailMode is which requests are slow.
type tailMode string

const (
	tailRandom  tailMode = "random"
	tailReplica tailMode = "replica"
)

// tailParams is one scenario.
type tailParams struct {
	name     string
	mode     tailMode
	rho      float64
	duration time.Duration
	// From triggerAt for triggerFor (if positive), the service time is
	// multiplied by triggerBy for the requests that get a worker then.
	triggerAt, triggerFor time.Duration
	triggerBy             float64
}

// rate is the arrival rate (per second) that puts the provider at rho:
// rho times the workers over the mean service time, 1% of it slow.
func (p tailParams) rate() float64 {
	mean := (1-tailSlowShare)*tailWork.Seconds() + tailSlowShare*tailSlowBy*tailWork.Seconds()
	return p.rho * tailWorkers / mean
}

// tailSecond is what the provider saw in one second of the run.
type tailSecond struct {
	arrived, shed, slow, wasted atomic.Int64
}

// tailConn is one accepted connection: its replica and its requests.
type tailConn struct {
	replica int64
	served  atomic.Int64
}

type tailConnKey struct{}

// tailProvider is the loopback provider of the scenario.
type tailProvider struct {
	p       tailParams
	start   time.Time
	inside  atomic.Int64
	workers chan int64 // a free worker: when its last work ended (unix ns)
	conns   atomic.Int64
	mu      sync.Mutex
	rng     *mrand.Rand
	secs    []tailSecond
}

func newTailProvider(p tailParams, start time.Time) *tailProvider {
	tp := &tailProvider{p: p, start: start, workers: make(chan int64, tailWorkers),
		rng: mrand.New(mrand.NewPCG(tailSeed, 1)), secs: make([]tailSecond, int((p.duration+tailDeadline)/time.Second)+2)}
	for range tailWorkers {
		tp.workers <- 0
	}
	return tp
}

func (tp *tailProvider) second(t time.Time) *tailSecond {
	return &tp.secs[max(0, min(int(t.Sub(tp.start)/time.Second), len(tp.secs)-1))]
}

func (tp *tailProvider) triggered(t time.Time) bool {
	at := t.Sub(tp.start)
	return tp.p.triggerFor > 0 && at >= tp.p.triggerAt && at < tp.p.triggerAt+tp.p.triggerFor
}

// ServeHTTP answers "ok" after the request's work, or 503 at once when the
// workers and the queue are full. Work is done even for a caller that has
// gone (a hedge that lost, a call past its deadline).
func (tp *tailProvider) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	now := time.Now()
	sec := tp.second(now)
	sec.arrived.Add(1)
	slow := false
	switch tp.p.mode {
	case tailRandom:
		tp.mu.Lock()
		slow = tp.rng.Float64() < tailSlowShare
		tp.mu.Unlock()
	case tailReplica:
		if c, ok := r.Context().Value(tailConnKey{}).(*tailConn); ok {
			slow = c.replica == 0
			if c.served.Add(1) >= tailConnRequests {
				w.Header().Set("Connection", "close")
			}
		}
	}
	if slow {
		sec.slow.Add(1)
		w.Header().Set(tailSlowHeader, "1") // for the client's tally of ordinary answers
	}
	if tp.inside.Add(1) > tailWorkers+tailQueue {
		tp.inside.Add(-1)
		sec.shed.Add(1)
		http.Error(w, "over capacity", http.StatusServiceUnavailable)
		return
	}
	// The work starts when the request arrived or when its worker became
	// free, whichever is later (not when the scheduler got round to it),
	// so that a loaded machine does not lower the capacity.
	begin := now
	if free := time.Unix(0, <-tp.workers); free.After(begin) {
		begin = free
	}
	work := tailWork
	if slow {
		work *= tailSlowBy
	}
	if tp.triggered(begin) {
		work = time.Duration(float64(work) * tp.p.triggerBy)
	}
	end := begin.Add(work)
	time.Sleep(time.Until(end))
	tp.workers <- end.UnixNano()
	tp.inside.Add(-1)
	if r.Context().Err() != nil {
		tp.second(time.Now()).wasted.Add(1)
	}
	io.WriteString(w, "ok\n")
}

// listen serves tp on loopback; stop shuts it down.
func (tp *tailProvider) listen() (url string, stop func(), err error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	srv := &http.Server{Handler: tp, ReadHeaderTimeout: 10 * time.Second,
		ConnContext: func(ctx context.Context, _ net.Conn) context.Context {
			return context.WithValue(ctx, tailConnKey{}, &tailConn{replica: (tp.conns.Add(1) - 1) % tailReplicas})
		}}
	done := make(chan struct{})
	go func() {
		defer close(done)
		srv.Serve(ln)
	}()
	return "http://" + ln.Addr().String(), func() {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		if srv.Shutdown(ctx) != nil {
			srv.Close()
		}
		<-done
	}, nil
}

// tailCounter counts events (hedges) per second of the run.
type tailCounter struct {
	start time.Time
	secs  []atomic.Int64
}

func (c *tailCounter) add() {
	c.secs[max(0, min(int(time.Since(c.start)/time.Second), len(c.secs)-1))].Add(1)
}

// tailSetup is one client of the scenario.
type tailSetup struct {
	name, how  string
	stormguard bool
	hedging    bool
	// client returns the client over base; hedges counts its hedges;
	// fixed is the no-hedging row's p95 in this scenario (0 if not run).
	client func(base http.RoundTripper, hedges *tailCounter, fixed time.Duration) (*http.Client, error)
}

func tailSetups() []tailSetup {
	sg := func(hedge bool) func(http.RoundTripper, *tailCounter, time.Duration) (*http.Client, error) {
		return func(base http.RoundTripper, hedges *tailCounter, _ time.Duration) (*http.Client, error) {
			opts := []httpretry.Option{httpretry.WithObserver(observe.Func(func(_ context.Context, e observe.Event) {
				if e.Kind == observe.AttemptStart && e.Hedge {
					hedges.add()
				}
			}))}
			if hedge {
				opts = append(opts, httpretry.WithHedging(0, 0.95, 1))
			}
			t, err := httpretry.NewTransport(base, opts...)
			return &http.Client{Transport: t}, err
		}
	}
	fs := func(b hedgepolicy.Builder[*http.Response], hedges *tailCounter, base http.RoundTripper) *http.Client {
		hp := b.OnHedge(func(failsafe.ExecutionEvent[*http.Response]) { hedges.add() }).Build()
		return &http.Client{Transport: failsafehttp.NewRoundTripper(base, hp)}
	}
	return []tailSetup{
		{name: "stormguard, no hedging", how: "one httpretry.NewTransport(base) (defaults: retries within the budget, breaker)",
			stormguard: true, client: sg(false)},
		{name: "stormguard, WithHedging(0, 0.95, 1)", how: "one httpretry.NewTransport(base, WithHedging(0, 0.95, 1)): learned p95 delay, 1 hedge, the default budget",
			stormguard: true, hedging: true, client: sg(true)},
		{name: "failsafe-go v0.9.8, hedge p95 quantile", how: "one failsafehttp.NewRoundTripper(base, hedgepolicy.NewBuilderWithDelayQuantile(0.95, 100, 20).Build()): " +
			"a moving p95 of the last ~100 executions, after 20 executions; 1 hedge, no budget (its defaults)",
			hedging: true, client: func(base http.RoundTripper, h *tailCounter, _ time.Duration) (*http.Client, error) {
				return fs(hedgepolicy.NewBuilderWithDelayQuantile[*http.Response](0.95, 100, 20), h, base), nil
			}},
		{name: "failsafe-go v0.9.8, hedge fixed delay", how: "one failsafehttp.NewRoundTripper(base, hedgepolicy.NewBuilderWithDelay(d).Build()), " +
			"d the no-hedging row's p95 in the same scenario; 1 hedge, no budget",
			hedging: true, client: func(base http.RoundTripper, h *tailCounter, fixed time.Duration) (*http.Client, error) {
				if fixed <= 0 {
					return nil, fmt.Errorf("the fixed-delay row needs the no-hedging row run before it")
				}
				return fs(hedgepolicy.NewBuilderWithDelay[*http.Response](fixed), h, base), nil
			}},
	}
}

// tailCall is one call of the load.
type tailCall struct {
	start, took, late time.Duration
	ok                bool
	slow              bool   // its answer was one the provider drew slow
	why               string // why it failed: tailWhy
}

// tailSlowHeader marks an answer that the provider drew slow.
const tailSlowHeader = "X-Tail-Slow"

// tailWhy names the cause of a failed call.
func tailWhy(err error) string {
	var st tailStatus
	switch {
	case err == nil:
		return ""
	case errors.As(err, &st):
		return fmt.Sprintf("status %d", int(st))
	case errors.Is(err, breaker.ErrOpen):
		return "breaker open"
	case errors.Is(err, context.DeadlineExceeded):
		return "deadline"
	case errors.Is(err, syscall.EADDRNOTAVAIL):
		return "no local port"
	}
	return "other"
}

// tailStatus is the error of a call answered with a status other than 200.
type tailStatus int

func (s tailStatus) Error() string { return fmt.Sprintf("status %d", int(s)) }

// runTailLoad sends GETs to url through client at Poisson times of the
// given rate (seeded) for duration from start, each in its own goroutine
// with its own deadline, and returns the calls once all have returned.
func runTailLoad(client *http.Client, url string, rate float64, duration time.Duration, start time.Time) []tailCall {
	rng := mrand.New(mrand.NewPCG(tailSeed, 2))
	var (
		mu    sync.Mutex
		wg    sync.WaitGroup
		calls = make([]tailCall, 0, int(rate*duration.Seconds()*1.2))
		at    time.Duration
	)
	for {
		at += time.Duration(rng.ExpFloat64() / rate * float64(time.Second))
		if at >= duration {
			break
		}
		if d := time.Until(start.Add(at)); d > 0 {
			time.Sleep(d)
		}
		at := at // the call's own scheduled time
		wg.Go(func() {
			began := time.Now()
			ctx, cancel := context.WithTimeout(context.Background(), tailDeadline)
			defer cancel()
			slow, err := tailGet(ctx, client, url)
			c := tailCall{start: at, took: time.Since(began), late: began.Sub(start) - at, ok: err == nil, slow: slow, why: tailWhy(err)}
			mu.Lock()
			calls = append(calls, c)
			mu.Unlock()
		})
	}
	wg.Wait()
	return calls
}

// tailGet sends one GET and reads its answer; slow reports that the answer
// was one the provider drew slow.
func tailGet(ctx context.Context, client *http.Client, url string) (slow bool, err error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return false, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return false, err
	}
	_, err = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if err == nil && resp.StatusCode != http.StatusOK {
		err = tailStatus(resp.StatusCode)
	}
	return resp.Header.Get(tailSlowHeader) != "", err
}

// tailRow is one measured row.
type tailRow struct {
	setup                tailSetup
	calls                []tailCall
	measured, failed     int // calls started after the warm-up, of them failed
	p50, p95, p99, p999  time.Duration
	p999Ordinary         time.Duration // p99.9 of the calls answered by a copy not drawn slow
	p999Calm             time.Duration // p99.9 of the calls that ran during no stall of the process
	calm                 int           // those calls
	lateP99              time.Duration
	stalls               []tailStall // the process's stalls during the load
	arrived, shed, slow  int64
	wasted, hedges       int64
	arrivedSec, hedgeSec []int64
	loadBefore, load     string
	causes               map[string]int // failed calls of the whole run by cause
}

// p95Before is the p95 of the calls started after the warm-up and before
// p's trigger (of all of them after the warm-up without a trigger).
func (r tailRow) p95Before(p tailParams) time.Duration {
	var took []time.Duration
	for _, c := range r.calls {
		if c.start >= tailWarmup && (p.triggerFor == 0 || c.start < p.triggerAt) {
			took = append(took, c.took)
		}
	}
	slices.Sort(took)
	return quantile(took, 0.95)
}

// perSecond lists, per second of the load, the calls started, how many
// failed, their median, and the requests and hedges of that second.
func (r tailRow) perSecond(p tailParams) string {
	n := int(p.duration / time.Second)
	took := make([][]time.Duration, n)
	failed := make([]int, n)
	for _, c := range r.calls {
		if i := int(c.start / time.Second); i < n {
			took[i] = append(took[i], c.took)
			if !c.ok {
				failed[i]++
			}
		}
	}
	var b strings.Builder
	for i := range n {
		slices.Sort(took[i])
		fmt.Fprintf(&b, "  s%02d calls %d failed %d p50 %s p99 %s requests %d hedges %d\n",
			i, len(took[i]), failed[i], ms(quantile(took[i], 0.5)), ms(quantile(took[i], 0.99)), r.arrivedSec[i], r.hedgeSec[i])
	}
	return b.String()
}

// causes lists the failed calls by cause, "none" if none failed.
func (r tailRow) causeText() string {
	if len(r.causes) == 0 {
		return "none"
	}
	var out []string
	for why, n := range r.causes {
		out = append(out, fmt.Sprintf("%s %d", why, n))
	}
	slices.Sort(out)
	return strings.Join(out, ", ")
}

// tailStall is a spell in which the process ran nothing: a 1 ms sleep that
// woke more than tailStallOver late (the machine's virtual CPUs paused, or
// the runtime's own pauses), from and to since the run's start.
type tailStall struct{ from, to time.Duration }

// tailStallOver is the lateness of a 1 ms sleep that counts as a stall.
const tailStallOver = 5 * time.Millisecond

// watchStalls records the process's stalls from start until stop is
// closed, and then sends them.
func watchStalls(start time.Time, stop <-chan struct{}) <-chan []tailStall {
	out := make(chan []tailStall, 1)
	go func() {
		var stalls []tailStall
		for {
			select {
			case <-stop:
				out <- stalls
				return
			default:
			}
			t0 := time.Now()
			time.Sleep(time.Millisecond)
			t1 := time.Now()
			if t1.Sub(t0)-time.Millisecond > tailStallOver {
				stalls = append(stalls, tailStall{from: t0.Sub(start) + time.Millisecond, to: t1.Sub(start)})
			}
		}
	}()
	return out
}

// stallText says how many stalls the row's process had, the longest, and
// how many of the calls measured over the row's p99.9 ran during one.
func (r tailRow) stallText() string {
	var longest time.Duration
	for _, st := range r.stalls {
		longest = max(longest, st.to-st.from)
	}
	over, during := 0, 0
	for _, c := range r.calls {
		if c.start < tailWarmup || c.took <= r.p999 {
			continue
		}
		over++
		if r.ranDuringStall(c) {
			during++
		}
	}
	return fmt.Sprintf("%d stalls over %v (longest %v); of the %d calls over the p99.9, %d ran during one; p99.9 of the %d calls that ran during none: %v",
		len(r.stalls), tailStallOver, ms(longest), over, during, r.calm, ms(r.p999Calm))
}

// ranDuringStall reports whether c ran during one of the process's stalls.
func (r tailRow) ranDuringStall(c tailCall) bool {
	from := c.start + c.late
	for _, st := range r.stalls {
		if from < st.to && from+c.took > st.from {
			return true
		}
	}
	return false
}

// calmTook returns, sorted, the times of the calls measured (started after
// the warm-up) that ran during none of the process's stalls: the machine's
// pauses, which every row gets at random and no client can shorten, left
// out.
func (r tailRow) calmTook() []time.Duration {
	var took []time.Duration
	for _, c := range r.calls {
		if c.start >= tailWarmup && !r.ranDuringStall(c) {
			took = append(took, c.took)
		}
	}
	slices.Sort(took)
	return took
}

// extra is the requests at the provider per call, minus one.
func (r tailRow) extra() float64 { return float64(r.arrived)/float64(max(len(r.calls), 1)) - 1 }

// runTail runs setup s through scenario p once.
func runTail(p tailParams, s tailSetup, fixed time.Duration) (tailRow, error) {
	row := tailRow{setup: s, loadBefore: loadavg()}
	start := time.Now().Add(200 * time.Millisecond)
	tp := newTailProvider(p, start)
	url, stop, err := tp.listen()
	if err != nil {
		return row, err
	}
	base := newLiveBase()
	defer base.CloseIdleConnections()
	hedges := &tailCounter{start: start, secs: make([]atomic.Int64, len(tp.secs))}
	client, err := s.client(base, hedges, fixed)
	if err != nil {
		stop()
		return row, err
	}
	stopWatch := make(chan struct{})
	stalls := watchStalls(start, stopWatch)
	row.calls = runTailLoad(client, url, p.rate(), p.duration, start)
	close(stopWatch)
	row.stalls = <-stalls
	stop()
	var took, ordinary, late []time.Duration
	row.causes = make(map[string]int)
	for _, c := range row.calls {
		late = append(late, c.late)
		if !c.ok {
			row.causes[c.why]++
		}
		if c.start < tailWarmup {
			continue
		}
		row.measured++
		took = append(took, c.took)
		if c.ok && !c.slow {
			ordinary = append(ordinary, c.took)
		}
		if !c.ok {
			row.failed++
		}
	}
	slices.Sort(took)
	slices.Sort(ordinary)
	slices.Sort(late)
	row.p999Ordinary = quantile(ordinary, 0.999)
	calm := row.calmTook()
	row.p999Calm, row.calm = quantile(calm, 0.999), len(calm)
	row.p50, row.p95, row.p99, row.p999 = quantile(took, 0.5), quantile(took, 0.95), quantile(took, 0.99), quantile(took, 0.999)
	row.lateP99 = quantile(late, 0.99)
	for i := range tp.secs {
		s := &tp.secs[i]
		a, h := s.arrived.Load(), hedges.secs[i].Load()
		row.arrived += a
		row.shed += s.shed.Load()
		row.slow += s.slow.Load()
		row.wasted += s.wasted.Load()
		row.hedges += h
		row.arrivedSec = append(row.arrivedSec, a)
		row.hedgeSec = append(row.hedgeSec, h)
	}
	row.load = loadavg()
	return row, nil
}

// quantile returns the q quantile of sorted xs (nearest rank), 0 if empty.
func quantile(xs []time.Duration, q float64) time.Duration {
	if len(xs) == 0 {
		return 0
	}
	i := int(q*float64(len(xs))+0.999999) - 1
	return xs[min(max(i, 0), len(xs)-1)]
}

func tailScenarios(d time.Duration) []tailParams {
	return []tailParams{
		{name: "random", mode: tailRandom, rho: 0.5, duration: d},
		{name: "replica", mode: tailReplica, rho: 0.5, duration: d},
		{name: "overload", mode: tailRandom, rho: 0.95, duration: max(40*time.Second, d), triggerAt: 10 * time.Second, triggerFor: 10 * time.Second, triggerBy: 5},
	}
}

// TestLiveTail runs the tail scenarios; see the comment at the top of this
// file.
//
//	cd bench && STORMGUARD_LIVE_TAIL=1 go test -run TestLiveTail -v -timeout 30m .
func TestLiveTail(t *testing.T) {
	if os.Getenv("STORMGUARD_LIVE_TAIL") != "1" {
		t.Skip("live tail scenario: about 7 minutes on loopback; set STORMGUARD_LIVE_TAIL=1 to run it")
	}
	d := 30 * time.Second
	if v := os.Getenv("STORMGUARD_LIVE_TAIL_DURATION"); v != "" {
		var err error
		if d, err = time.ParseDuration(v); err != nil || d <= tailWarmup {
			t.Fatalf("STORMGUARD_LIVE_TAIL_DURATION=%q: want a duration above %v", v, tailWarmup)
		}
	}
	scenarios := tailScenarios(d)
	if v := os.Getenv("STORMGUARD_LIVE_TAIL_SCENARIOS"); v != "" {
		want := strings.Split(v, ",")
		scenarios = slices.DeleteFunc(scenarios, func(p tailParams) bool { return !slices.Contains(want, p.name) })
	}
	var md strings.Builder
	env := []string{"STORMGUARD_LIVE_TAIL=1"}
	for _, n := range []string{"SCENARIOS", "DURATION", "ROWS", "MD"} {
		if v, ok := os.LookupEnv("STORMGUARD_LIVE_TAIL_" + n); ok {
			env = append(env, fmt.Sprintf("STORMGUARD_LIVE_TAIL_%s=%s", n, v))
		}
	}
	up, _ := exec.Command("uptime").Output()
	start := time.Now().UTC()
	fmt.Fprintf(&md, "Command: `cd bench && %s go test -run TestLiveTail -v -timeout 30m .`\n\n", strings.Join(env, " "))
	fmt.Fprintf(&md, "Run %s on %s/%s, %d CPUs, %s, library at %s; uptime before: %s\n\n",
		start.Format(time.RFC3339), runtime.GOOS, runtime.GOARCH, runtime.NumCPU(), runtime.Version(), gitRevision(), strings.TrimSpace(string(up)))
	t.Log(md.String())
	for _, p := range scenarios {
		var rows []tailRow
		var fixed time.Duration
		for _, s := range tailOrdered(tailSetups()) {
			row, err := runTail(p, s, fixed)
			if err != nil {
				t.Fatalf("%s, %s: %v", p.name, s.name, err)
			}
			if s.stormguard && !s.hedging {
				fixed = row.p95Before(p)
			}
			rows = append(rows, row)
			t.Logf("%s, %s, per second:\n%s", p.name, s.name, row.perSecond(p))
			t.Logf("%s, %s: p50 %v p95 %v p99 %v p99.9 %v (of the calls answered by a copy not drawn slow: %v), %d calls (%d failed after the warm-up; all failures: %s), %d requests (%+.1f%%), %d hedges, load %s; %s",
				p.name, s.name, ms(row.p50), ms(row.p95), ms(row.p99), ms(row.p999), ms(row.p999Ordinary), len(row.calls), row.failed, row.causeText(), row.arrived, 100*row.extra(), row.hedges, row.load, row.stallText())
		}
		table := tailTable(p, rows)
		t.Log("\n" + table)
		md.WriteString(table + "\n")
	}
	up, _ = exec.Command("uptime").Output()
	fmt.Fprintf(&md, "Took %v; uptime after: %s\n\nSetups:\n\n", time.Since(start).Round(time.Second), strings.TrimSpace(string(up)))
	for _, s := range tailSetups() {
		fmt.Fprintf(&md, "- **%s**: %s\n", s.name, s.how)
	}
	if f := os.Getenv("STORMGUARD_LIVE_TAIL_MD"); f != "" {
		if err := os.WriteFile(f, []byte(md.String()), 0o644); err != nil {
			t.Errorf("writing %s: %v", f, err)
		}
	}
}

// ms formats a latency in milliseconds.
func ms(d time.Duration) string { return fmt.Sprintf("%.1f ms", float64(d)/float64(time.Millisecond)) }

// tailRecovery is how a row came through the overload trigger.
type tailRecovery struct {
	before                   time.Duration // median before the trigger
	hedgesDuring, arrDuring  int64         // in the trigger's seconds
	failedDuring, failedRest int           // calls started in the trigger, after it
	recovered                bool
	after                    time.Duration // from the trigger's end to normal
}

// recovery finds when row got back to normal after p's trigger: the first
// second after its end that begins tailNormalFor seconds in a row with no
// failed call and a median within twice the median before the trigger (a
// later stall of the machine does not undo it; the failures after the
// trigger are counted apart).
func recovery(p tailParams, row tailRow) tailRecovery {
	var rc tailRecovery
	end := p.triggerAt + p.triggerFor
	n := int(p.duration / time.Second)
	secs := make([][]time.Duration, n)
	failed := make([]int, n)
	var before []time.Duration
	for _, c := range row.calls {
		i := int(c.start / time.Second)
		if i >= n {
			continue
		}
		secs[i] = append(secs[i], c.took)
		if !c.ok {
			failed[i]++
			switch {
			case c.start >= p.triggerAt && c.start < end:
				rc.failedDuring++
			case c.start >= end:
				rc.failedRest++
			}
		}
		if c.start >= tailWarmup && c.start < p.triggerAt {
			before = append(before, c.took)
		}
	}
	slices.Sort(before)
	rc.before = quantile(before, 0.5)
	for i := int(p.triggerAt / time.Second); i < int(end/time.Second) && i < len(row.arrivedSec); i++ {
		rc.hedgesDuring += row.hedgeSec[i]
		rc.arrDuring += row.arrivedSec[i]
	}
	normal := func(i int) bool {
		slices.Sort(secs[i])
		return failed[i] == 0 && len(secs[i]) > 0 && quantile(secs[i], 0.5) <= 2*rc.before
	}
	run := 0
	for i := int(end / time.Second); i < n; i++ {
		if !normal(i) {
			run = 0
			continue
		}
		if run++; run == tailNormalFor {
			rc.recovered, rc.after = true, time.Duration(i+1-tailNormalFor)*time.Second-end
			break
		}
	}
	return rc
}

// tailTable formats one scenario's rows as Markdown, with the issue's
// must-holds checked for the stormguard hedging row.
func tailTable(p tailParams, rows []tailRow) string {
	var b strings.Builder
	how := map[tailMode]string{
		tailRandom:  "each request slow with probability 1% (seeded)",
		tailReplica: fmt.Sprintf("the requests on connections pinned to replica 0 of %d (connection i to replica i mod %d; a connection closed after %d requests) slow", tailReplicas, tailReplicas, tailConnRequests),
	}[p.mode]
	fmt.Fprintf(&b, "#### %s: %d workers x %v (x%d when slow), queue %d, %s; %.0f GETs/s (Poisson) = %.0f%% load, deadline %v, %v",
		p.name, tailWorkers, tailWork, tailSlowBy, tailQueue, how, p.rate(), 100*p.rho, tailDeadline, p.duration)
	if p.triggerFor > 0 {
		fmt.Fprintf(&b, "; service time x%g from %v to %v", p.triggerBy, p.triggerAt, p.triggerAt+p.triggerFor)
	}
	fmt.Fprintf(&b, "\n\nLatency of the calls started after the first %v (a failed call counts with the time it took); requests are every request that reached the provider, hedges and retries included.\n\n", tailWarmup)
	if p.triggerFor == 0 {
		b.WriteString("| client | p50 | p95 | p99 | p99.9 | p99.9 answered not slow | calls | failed | requests / call | hedges / call | slow at the provider | shed | load before → after | late p99 |\n")
		b.WriteString("|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|\n")
		for _, r := range rows {
			fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %s | %d | %d | %.3f | %.3f | %.2f%% | %d | %s → %s | %s |\n",
				r.setup.name, ms(r.p50), ms(r.p95), ms(r.p99), ms(r.p999), ms(r.p999Ordinary), len(r.calls), r.failed, 1+r.extra(),
				float64(r.hedges)/float64(max(len(r.calls), 1)), 100*float64(r.slow)/float64(max(r.arrived, 1)), r.shed, r.loadBefore, r.load, ms(r.lateP99))
		}
		b.WriteString("\nThe process's stalls (a 1 ms sleep that woke over 5 ms late: the machine paused it), per row:\n\n")
		for _, r := range rows {
			fmt.Fprintf(&b, "- %s: %s\n", r.setup.name, r.stallText())
		}
		b.WriteString(tailMustHold(rows))
		return b.String()
	}
	b.WriteString("| client | p50 before | p99 | calls | failed in the trigger | after it | hedges / requests in the trigger | hedges / requests, whole run | requests / call | shed | wasted | back to normal after the trigger | load before → after |\n")
	b.WriteString("|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|\n")
	recs := make([]tailRecovery, len(rows))
	for i, r := range rows {
		rc := recovery(p, r)
		recs[i] = rc
		back := "not within the run"
		if rc.recovered {
			back = fmt.Sprintf("%.0f s", rc.after.Seconds())
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %d | %d | %d | %d / %d (%.2f%%) | %d / %d (%.2f%%) | %.3f | %d | %d | %s | %s → %s |\n",
			r.setup.name, ms(rc.before), ms(r.p99), len(r.calls), rc.failedDuring, rc.failedRest,
			rc.hedgesDuring, rc.arrDuring, 100*float64(rc.hedgesDuring)/float64(max(rc.arrDuring, 1)),
			r.hedges, r.arrived, 100*float64(r.hedges)/float64(max(r.arrived, 1)), 1+r.extra(), r.shed, r.wasted, back, r.loadBefore, r.load)
	}
	fmt.Fprintf(&b, "\nBack to normal: the first second after the trigger that begins %d seconds in a row with no failed call and a median within 2x the row's median before the trigger (calls by the second they started in).\n", tailNormalFor)
	b.WriteString(tailOverloadHold(rows, recs))
	return b.String()
}

// mark says whether a must-hold was met.
func mark(ok bool) string {
	if ok {
		return "met"
	}
	return "MISSED"
}

// tailRowsByRole finds the stormguard rows and failsafe-go's quantile row.
func tailRowsByRole(rows []tailRow) (noHedge, hedge, fsq *tailRow) {
	for i := range rows {
		r := &rows[i]
		switch {
		case r.setup.stormguard && !r.setup.hedging:
			noHedge = r
		case r.setup.stormguard:
			hedge = r
		case strings.Contains(r.setup.name, "quantile"):
			fsq = r
		}
	}
	return noHedge, hedge, fsq
}

// tailMustHold checks issue 23's tail must-hold on the rows.
func tailMustHold(rows []tailRow) string {
	no, h, fsq := tailRowsByRole(rows)
	if no == nil || h == nil {
		return ""
	}
	floor := no.p95 + no.p50
	ratio := float64(h.p999) / float64(floor)
	s := fmt.Sprintf("\nMust-hold (issue 23), for %s: p99.9 %s within 1.25x of the floor %s (the no-hedging row's p95 %s + p50 %s): %.2fx, %s; "+
		"extra requests <= 5%%: %+.1f%%, %s",
		h.setup.name, ms(h.p999), ms(floor), ms(no.p95), ms(no.p50), ratio, mark(ratio <= 1.25), 100*h.extra(), mark(h.extra() <= 0.05))
	if fsq != nil {
		s += fmt.Sprintf("; lower p99.9 than %s (%s) at equal or fewer extra requests (%+.1f%% vs %+.1f%%): %s",
			fsq.setup.name, ms(fsq.p999), 100*h.extra(), 100*fsq.extra(), mark(h.p999 < fsq.p999 && h.extra() <= fsq.extra()))
	}
	// The same of the calls that ran during none of the process's stalls
	// (the machine's pauses: docs/hedging.md, "The machine's pauses").
	calm := float64(h.p999Calm) / float64(floor)
	s += fmt.Sprintf(".\n\nOf the calls that ran during no stall of the process: p99.9 %s, %.2fx of the floor, %s",
		ms(h.p999Calm), calm, mark(calm <= 1.25))
	if fsq != nil {
		s += fmt.Sprintf("; lower than %s's (%s): %s", fsq.setup.name, ms(fsq.p999Calm), mark(h.p999Calm < fsq.p999Calm && h.extra() <= fsq.extra()))
	}
	return s + "\n"
}

// tailOverloadHold checks issue 23's overload must-hold on the rows.
func tailOverloadHold(rows []tailRow, recs []tailRecovery) string {
	no, h := -1, -1
	for i, r := range rows {
		switch {
		case r.setup.stormguard && !r.setup.hedging:
			no = i
		case r.setup.stormguard:
			h = i
		}
	}
	if no < 0 || h < 0 {
		return ""
	}
	rh, rn := recs[h], recs[no]
	share := float64(rh.hedgesDuring) / float64(max(rh.arrDuring, 1))
	faster := rh.recovered && (!rn.recovered || rh.after <= rn.after)
	return fmt.Sprintf("\nMust-hold (issue 23), for %s: hedges <= 1%% of the requests in the trigger: %.2f%%, %s; back to normal no later than %s: %s\n",
		rows[h].setup.name, 100*share, mark(share <= 0.01), rows[no].setup.name, mark(faster))
}

// tailWanted reports whether STORMGUARD_LIVE_TAIL_ROWS (|-separated parts
// of row names; unset: every row) selects the row named name.
func tailWanted(name string) bool { return tailRank(name) >= 0 }

// tailRank is the index in STORMGUARD_LIVE_TAIL_ROWS of the first part
// that the row named name contains (0 for every row when it is unset), or
// -1 if none does.
func tailRank(name string) int {
	only := os.Getenv("STORMGUARD_LIVE_TAIL_ROWS")
	if only == "" {
		return 0
	}
	for i, part := range strings.Split(only, "|") {
		if part != "" && strings.Contains(name, part) {
			return i
		}
	}
	return -1
}

// tailOrdered returns the setups STORMGUARD_LIVE_TAIL_ROWS selects, in the
// order of its parts (setups that one part selects in their own order):
// _ROWS='WithHedging|no hedging' runs the hedging row first, so that a
// comparison of two rows can be run both ways round on a machine whose
// load drifts.
func tailOrdered(setups []tailSetup) []tailSetup {
	setups = slices.DeleteFunc(setups, func(s tailSetup) bool { return !tailWanted(s.name) })
	slices.SortStableFunc(setups, func(a, b tailSetup) int { return tailRank(a.name) - tailRank(b.name) })
	return setups
}

// TestLiveTailSmoke runs every setup through a one-second random scenario
// at 10% load and checks the accounting only: every scheduled call
// recorded, no more successful calls, hedges or slow requests than requests
// at the provider.
func TestLiveTailSmoke(t *testing.T) {
	p := tailParams{name: "smoke", mode: tailRandom, rho: 0.1, duration: time.Second}
	want := 0
	rng := mrand.New(mrand.NewPCG(tailSeed, 2))
	for at := time.Duration(0); ; want++ {
		if at += time.Duration(rng.ExpFloat64() / p.rate() * float64(time.Second)); at >= p.duration {
			break
		}
	}
	for _, s := range tailSetups() {
		t.Run(s.name, func(t *testing.T) {
			row, err := runTail(p, s, 20*time.Millisecond)
			if err != nil {
				t.Fatal(err)
			}
			var ok int64
			for _, c := range row.calls {
				if c.ok {
					ok++
				}
			}
			if len(row.calls) != want || ok > row.arrived || row.hedges > row.arrived || row.slow > row.arrived || row.arrived == 0 {
				t.Errorf("%d calls (want %d), %d ok, %d requests, %d hedges, %d slow", len(row.calls), want, ok, row.arrived, row.hedges, row.slow)
			}
		})
	}
}

// TestTailRecovery checks the overload table's recovery on made-up calls:
// failures and slow medians after the trigger delay it, a later bad second
// does not undo it.
func TestTailRecovery(t *testing.T) {
	p := tailParams{duration: 12 * time.Second, triggerAt: 3 * time.Second, triggerFor: 2 * time.Second}
	mk := func(bad map[int]string) tailRow {
		r := tailRow{arrivedSec: make([]int64, 14), hedgeSec: make([]int64, 14)}
		for s := range 12 {
			for i := range 10 {
				c := tailCall{start: time.Duration(s)*time.Second + time.Duration(i)*time.Millisecond, took: 10 * time.Millisecond, ok: true}
				switch bad[s] {
				case "fail":
					c.ok = i != 0
				case "slow":
					c.took = 25 * time.Millisecond
				}
				r.calls = append(r.calls, c)
			}
			r.arrivedSec[s] = 10
		}
		r.hedgeSec[3] = 1
		return r
	}
	for _, tt := range []struct {
		bad       map[int]string
		recovered bool
		after     time.Duration
	}{
		{nil, true, 0},
		{map[int]string{5: "fail"}, true, time.Second},
		{map[int]string{5: "slow", 7: "slow"}, true, 3 * time.Second},
		{map[int]string{5: "fail", 10: "fail"}, true, time.Second},
		{map[int]string{5: "fail", 8: "fail", 11: "slow"}, false, 0},
	} {
		rc := recovery(p, mk(tt.bad))
		if rc.recovered != tt.recovered || rc.after != tt.after || rc.before != 10*time.Millisecond || rc.hedgesDuring != 1 || rc.arrDuring != 20 {
			t.Errorf("bad seconds %v: recovered %v after %v (want %v after %v), before %v, %d hedges / %d requests in the trigger",
				tt.bad, rc.recovered, rc.after, tt.recovered, tt.after, rc.before, rc.hedgesDuring, rc.arrDuring)
		}
	}
}

// TestTailOrdered: _ROWS selects rows and orders them by its parts.
func TestTailOrdered(t *testing.T) {
	for _, tt := range []struct{ rows, want string }{
		{"", "stormguard, no hedging|stormguard, WithHedging(0, 0.95, 1)|failsafe-go v0.9.8, hedge p95 quantile|failsafe-go v0.9.8, hedge fixed delay"},
		{"stormguard", "stormguard, no hedging|stormguard, WithHedging(0, 0.95, 1)"},
		{"WithHedging|no hedging", "stormguard, WithHedging(0, 0.95, 1)|stormguard, no hedging"},
		{"fixed|stormguard", "failsafe-go v0.9.8, hedge fixed delay|stormguard, no hedging|stormguard, WithHedging(0, 0.95, 1)"},
		{"nothing", ""},
	} {
		t.Setenv("STORMGUARD_LIVE_TAIL_ROWS", tt.rows)
		var got []string
		for _, s := range tailOrdered(tailSetups()) {
			got = append(got, s.name)
		}
		if g := strings.Join(got, "|"); g != tt.want {
			t.Errorf("_ROWS=%q: %s, want %s", tt.rows, g, tt.want)
		}
	}
}
