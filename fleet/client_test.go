package fleet

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stormguard/stormguard/observe"
)

// TestNewRefusesNilClients: New refuses a nil client, and a typed nil of
// every client type in a redis.UniversalClient, which passes a plain nil
// check and would panic in the first sync, on the fleet's own goroutine
// (killing the process).
func TestNewRefusesNilClients(t *testing.T) {
	tests := []struct {
		name   string
		client redis.UniversalClient
	}{
		{"nil", nil},
		{"(*redis.Client)(nil)", (*redis.Client)(nil)},
		{"(*redis.ClusterClient)(nil)", (*redis.ClusterClient)(nil)},
		{"(*redis.Ring)(nil)", (*redis.Ring)(nil)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f, err := New(tt.client, Config{Name: "a"})
			if err == nil {
				f.Close()
				t.Fatalf("New(%s) = nil error, want a refusal", tt.name)
			}
			if !strings.Contains(err.Error(), "nil") {
				t.Errorf("New(%s) = %v, want an error naming the nil client", tt.name, err)
			}
		})
	}
}

// panicky is a backend whose client panics on every round trip.
type panicky struct{}

func (panicky) eval(context.Context, []string, []string) ([]int64, error) {
	panic("client bug")
}

// TestClientPanicIsARedisFailure: a client that panics in a round trip (on
// the fleet's own goroutine, where no caller could recover it) is taken for
// a failing Redis: the fleet goes local with the panic as its last error,
// and its budgets and breakers keep working.
func TestClientPanicIsARedisFailure(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := mustNew(t, panicky{}, Config{Name: "p", SyncEvery: 10 * time.Millisecond})
		s := f.stats()
		if s.Mode != ModeLocal || !errors.Is(s.LastError, errClientPanic) || !strings.Contains(s.LastError.Error(), "client bug") {
			t.Fatalf("after a sync whose client panicked: mode %v, last error %v; want local and the panic", s.Mode, s.LastError)
		}
		g, err := f.Guards("api")
		if err != nil {
			t.Fatal(err)
		}
		g.Budget.Deposit()
		if !g.Budget.Withdraw() {
			t.Error("Withdraw refused in local mode: the local budget's floor should admit it")
		}
		time.Sleep(50 * time.Millisecond) // more syncs, each one panicking
		if f.Mode() != ModeLocal {
			t.Errorf("mode %v with a client that panics", f.Mode())
		}
	})
}

// TestNewUnreachableStartsLocal: a Redis that does not answer at New is not
// an error (a process that starts during a Redis outage serves its callers
// on its local guards); New returns a fleet in local mode, the reason is
// logged at Warn and kept as the last error, and the fleet switches to
// fleet mode by itself once a sync succeeds.
func TestNewUnreachableStartsLocal(t *testing.T) {
	redisAddr(t) // the same skip-or-require rule as every Redis test
	port := freePort(t)
	addr := "127.0.0.1:" + itoa(int64(port))
	rec := &recorder{}
	cfg := Config{Name: uniqueName(t), SyncEvery: 20 * time.Millisecond, Timeout: 200 * time.Millisecond,
		Logger: slog.New(rec), Observer: rec}
	f, err := New(newClient(t, addr), cfg)
	if err != nil {
		t.Fatalf("New with Redis unreachable = %v, want a fleet in local mode", err)
	}
	defer f.Close()
	s := f.stats()
	if s.Mode != ModeLocal || s.LastError == nil {
		t.Fatalf("New with Redis unreachable: mode %v, last error %v; want local with the reason", s.Mode, s.LastError)
	}
	rec.mu.Lock()
	logs := append([]string(nil), rec.logs...)
	rec.mu.Unlock()
	if len(logs) != 1 || !strings.HasPrefix(logs[0], "WARN") {
		t.Errorf("logs %q, want one Warn record with the reason", logs)
	}
	if ev := rec.kinds(observe.FleetMode); len(ev) != 1 || ev[0].To != "local" || ev[0].Err == nil {
		t.Errorf("FleetMode events %+v, want one to local with the error", ev)
	}
	startRedisServer(t, port)
	if !eventually(5*time.Second, func() bool { return f.Mode() == ModeFleet }) {
		t.Fatalf("still local 5s after Redis came up: %+v", f.stats())
	}
}
