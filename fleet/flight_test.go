package fleet

import (
	"context"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stormguard/stormguard/limit"
)

// flightRig is ten processes (fleets on the real Redis, with Config.Limit)
// starting calls at a steady 400 a second in all, each attempt answered
// after its rig's delay (5 ms), or, while the rig hangs, when released or
// at the call's deadline (3 s).
type flightRig struct {
	fs      []*Fleet
	key     string
	delay   atomic.Int64 // each attempt's time, ns
	hung    atomic.Pointer[chan struct{}]
	started atomic.Int64 // attempts started
	served  atomic.Int64 // calls served
	failed  atomic.Int64 // calls that failed
	errMu   sync.Mutex
	errs    map[string]int // the failed calls' errors
	stop    chan struct{}
	wg      sync.WaitGroup
}

func startFlightRig(t *testing.T) *flightRig {
	rc := redisClient(t)
	cfg := Config{Name: uniqueName(t), SyncEvery: 100 * time.Millisecond, Timeout: time.Second, Limit: &limit.Config{}}
	cleanup(t, rc, cfg.Name)
	r := &flightRig{fs: newFleets(t, rc, 10, cfg), stop: make(chan struct{}), errs: map[string]int{}}
	r.delay.Store(int64(5 * time.Millisecond))
	for _, f := range r.fs {
		p := newPolicy(t, f, "api")
		r.wg.Add(1)
		go func() {
			defer r.wg.Done()
			tick := time.NewTicker(25 * time.Millisecond)
			defer tick.Stop()
			for {
				select {
				case <-r.stop:
					return
				case <-tick.C:
				}
				r.wg.Add(1)
				go func() {
					defer r.wg.Done()
					ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
					defer cancel()
					err := p.Do(ctx, func(ctx context.Context, _ int) error {
						r.started.Add(1)
						if h := r.hung.Load(); h != nil {
							select {
							case <-*h:
							case <-ctx.Done():
								return ctx.Err()
							}
						}
						time.Sleep(time.Duration(r.delay.Load()))
						return nil
					})
					if err != nil {
						r.failed.Add(1)
						r.errMu.Lock()
						r.errs[err.Error()]++
						r.errMu.Unlock()
						return
					}
					r.served.Add(1)
				}()
			}
		}()
	}
	t.Cleanup(func() { close(r.stop); r.wg.Wait() })
	r.key = r.fs[0].hostFor("api").key
	// Warm: a baseline, and a rate that serves 0.9 of the 400 calls a
	// second offered (slow start can outlast a fixed wait under -race).
	warm := func() bool {
		v, _ := rc.HMGet(context.Background(), r.key, "rr", "rb").Result()
		for i, x := range v {
			s, _ := x.(string)
			if f, err := strconv.ParseFloat(s, 64); err != nil || f <= 0 || (i == 0 && f < 360) {
				return false
			}
		}
		return true
	}
	if !eventually(20*time.Second, warm) {
		t.Fatalf("the fleet's rate and baseline never learned (the rate below 360 a second): %v", rc.HGetAll(context.Background(), r.key).Val())
	}
	time.Sleep(500 * time.Millisecond)
	return r
}

// held returns how many of the rig's processes are held.
func (r *flightRig) held() int {
	n := 0
	for _, f := range r.fs {
		if f.hostFor("api").holding.Load() {
			n++
		}
	}
	return n
}

// TestFleetHoldsAHang: the dependency hangs (no attempt answers until it
// is released; the calls' deadlines 3 s away). Without the fleet's count
// of attempts in flight each process would go on starting its calls,
// about 320 in the next 0.8 s; with it the fleet holds once its sum
// reaches the bound (8 here: three times 400/s over a 5 ms baseline is
// 6), and every process stops starting attempts within a round trip of
// it. Once released, the hung attempts answer, the hold ends, and calls
// are served again.
func TestFleetHoldsAHang(t *testing.T) {
	r := startFlightRig(t)
	rc := redisClient(t)
	release := make(chan struct{})
	r.hung.Store(&release)
	before := r.started.Load()
	time.Sleep(800 * time.Millisecond)
	during, held := r.started.Load()-before, r.held()
	t.Logf("attempts started in the hang's first 0.8 s: %d (about 320 without the count); %d of 10 processes held; fi fh fs %v",
		during, held, rc.HMGet(context.Background(), r.key, "fi", "fh", "fs").Val())
	if during > 40 {
		t.Errorf("%d attempts started into the hang in 0.8 s, want at most 40 (the bound is 8)", during)
	}
	if held != len(r.fs) {
		t.Errorf("%d of %d processes held", held, len(r.fs))
	}
	r.hung.Store(nil)
	close(release)
	s0 := r.served.Load()
	if !eventually(5*time.Second, func() bool { return r.served.Load() > s0+200 }) {
		t.Errorf("after the release, %d calls served in 5 s", r.served.Load()-s0)
	}
	if !eventually(5*time.Second, func() bool { return r.held() == 0 }) {
		t.Errorf("%d processes still held 5 s after the release: %v", r.held(), rc.HMGet(context.Background(), r.key, "fi", "fh", "fs").Val())
	}
}

// TestFleetHoldEndsOnAnswers: the dependency's latency jumps from 5 ms to
// 400 ms at once, and it goes on answering every call. The sum of the
// attempts in flight passes the bound at once (400/s over 400 ms is 160 in
// flight), and the fleet may hold; the first answer ends the hold: calls
// wait about one slow answer, and the fleet keeps serving (a black-box
// attack on a form that opened the breaker on slow answers failed half
// the calls in this shape). The calls that fail are the rate's hopeless
// refusals: to its rules a latency jump is a queue, and it cuts R (12 and
// 27 of about 470 calls in two runs here, without the hold and with it):
// at most a tenth.
func TestFleetHoldEndsOnAnswers(t *testing.T) {
	r := startFlightRig(t)
	f0, s0 := r.failed.Load(), r.served.Load()
	r.delay.Store(int64(400 * time.Millisecond))
	time.Sleep(3 * time.Second)
	served, failed := r.served.Load()-s0, r.failed.Load()-f0
	r.errMu.Lock()
	t.Logf("at 400 ms a call: %d served, %d failed in 3 s; %d of 10 processes held now; errors %v", served, failed, r.held(), r.errs)
	r.errMu.Unlock()
	if failed > (served+failed)/10 {
		t.Errorf("%d calls failed, %d served, against a host that answers every call in 400 ms (3 s deadlines)", failed, served)
	}
	if served < 350 {
		t.Errorf("%d calls served in 3 s at about 400 offered a second: the fleet held a host that answers", served)
	}
}
