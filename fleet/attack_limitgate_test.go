package fleet_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/stormguard/stormguard/fleet"
	"github.com/stormguard/stormguard/limit"
	"github.com/stormguard/stormguard/retry"
)

// lgWarm drives one call per 100 ms for d, so that the fleet learns a rate
// (cold: about 10 a second) and gates the limiter; it reports whether the
// gate binds (a burst of 50 with done-ish contexts gets few).
func lgWarm(t *testing.T, gg retry.Guards, d time.Duration) bool {
	g := gg.Limiter
	t.Helper()
	end := time.Now().Add(d)
	for time.Now().Before(end) {
		atkBurst(g, gg.Breaker, 1)
		time.Sleep(100 * time.Millisecond)
	}
	n := atkBurst(g, gg.Breaker, 50)
	t.Logf("gated burst: %d of 50", n)
	return n <= 10
}

type leaseFailHook struct{ on atomic.Bool }

func (h *leaseFailHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *leaseFailHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		a := cmd.Args()
		n := strings.ToLower(cmd.Name())
		if h.on.Load() && (n == "evalsha" || n == "eval") && len(a) > 4 && fmt.Sprint(a[2]) == "1" && fmt.Sprint(a[4]) == "l" {
			err := errors.New("lease refused by the test")
			cmd.SetErr(err)
			return err
		}
		return next(ctx, cmd)
	}
}
func (h *leaseFailHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// A lease request that fails switches the fleet to local mode (Modes: "A
// round trip that fails ... switches it to ModeLocal"); Config.Limit: "In
// local mode the gate is lifted and each process's limiter decides alone".
// Only a failed sync lifted it: after a failed lease the process was in
// local mode with its fleet share still gating it, until the next sync.
func TestAttackLeaseFailureLiftsGate(t *testing.T) {
	c := atkClient(t, atkAddr(t))
	hook := &leaseFailHook{}
	c.AddHook(hook)
	name := atkName(t, c)
	f, err := fleet.New(c, fleet.Config{Name: name, SyncEvery: time.Second, Timeout: 200 * time.Millisecond, Limit: &limit.Config{}})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	g, _ := f.Guards("h")
	if !lgWarm(t, g, 4*time.Second) {
		t.Fatal("the fleet's rate did not gate the limiter after 4 s")
	}
	for range 20 {
		g.Budget.Deposit()
	}
	hook.on.Store(true)
	g.Budget.Withdraw()
	m := f.Mode()
	n := atkBurst(g.Limiter, g.Breaker, 50)
	m2 := f.Mode()
	t.Logf("mode after failed lease %v, burst %d of 50, mode after %v, stats %+v", m, n, m2, f.Stats())
	if m != fleet.ModeLocal {
		t.Fatalf("mode %v after a failed lease, want local", m)
	}
	if m2 == fleet.ModeLocal && n < 10 {
		t.Errorf("in local mode (a failed lease round trip) the gate still binds: %d of 50 calls went", n)
	}
}

// Close with Redis blackholed while calls wait on the gate: the last sync
