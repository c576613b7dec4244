// Black-box tests of the package against its documentation, from attacks
// on it from outside: each names the sentence it checks.

package redisstore_test

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stormguard/stormguard/idempotency"
	"github.com/stormguard/stormguard/idempotency/store"
)

// A record the Guard stored must be replayed: Run promises store.Completed
// and the stored record to the retry, and the memory store does so.
// A record with an empty header name (which the encoding cannot tell from
// corruption): a black-box attack found the store taking it and every
// retry then failing to decode it (503 for the whole retention). Now no
// store takes it (store.Record.MarshalBinary refuses it) and the Guard
// releases the key at once (Guard.Run: "a record that no store takes ...
// is fn's misuse"), the same on every store.
func TestAttackGuardReleasesRecordWithEmptyHeaderName(t *testing.T) {
	c, _ := client(t, 4)
	for _, tc := range []struct {
		name string
		s    store.Store
	}{
		{"memory", &idempotency.MemoryStore{}},
		{"redis", newStore(t, c)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g, err := idempotency.NewGuard(tc.s)
			if err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			fp := store.NewFingerprint("PUBLISH", "queue/payments", [32]byte{1})
			key := idempotency.NewKey()
			runs := 0
			fn := func(context.Context) (store.Record, bool) {
				runs++
				return store.Record{Status: 200, Header: http.Header{"": {"meta"}}, Body: []byte("done")}, true
			}
			out, _, err := g.Run(ctx, "tenant", key, fp, fn)
			if err != nil || out != store.Claimed {
				t.Fatalf("first Run = %q, %v", out, err)
			}
			out, rec, err := g.Run(ctx, "tenant", key, fp, fn)
			if err != nil || out != store.Claimed || runs != 2 {
				t.Fatalf("retry Run = %q %q, %v; want claimed, fn run again (runs %d)", out, rec.Body, err, runs)
			}
		})
	}
}

// Many goroutines racing one key through one Guard each (as many servers
// would): fn runs once, every other caller sees in-progress or the replay.
func TestAttackGuardConcurrentClaims(t *testing.T) {
	c, _ := client(t, 64)
	s := newStore(t, c)
	const n = 64
	var runs atomic.Int32
	key := idempotency.NewKey()
	fp := store.NewFingerprint("POST", "/pay", [32]byte{})
	var wg sync.WaitGroup
	start := make(chan struct{})
	var mu sync.Mutex
	outs := map[store.Outcome]int{}
	var errs []error
	for range n {
		g, err := idempotency.NewGuard(s, idempotency.WithLockTimeout(5*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		wg.Go(func() {
			<-start
			out, _, err := g.Run(context.Background(), "s", key, fp, func(context.Context) (store.Record, bool) {
				runs.Add(1)
				time.Sleep(time.Millisecond)
				return store.Record{Status: 201, Body: []byte("x")}, true
			})
			mu.Lock()
			defer mu.Unlock()
			outs[out]++
			if err != nil {
				errs = append(errs, err)
			}
		})
	}
	close(start)
	wg.Wait()
	if runs.Load() != 1 || outs[store.Claimed] != 1 || len(errs) > 0 {
		t.Fatalf("runs %d, outcomes %v, errors %v", runs.Load(), outs, errors.Join(errs...))
	}
}

// A big response (8 MiB) round-trips through Redis.
func TestAttackGuardBigRecord(t *testing.T) {
	c, _ := client(t, 4)
	s := newStore(t, c)
	g, _ := idempotency.NewGuard(s)
	body := bytes.Repeat([]byte{0, 0xff, 'a'}, 8<<20/3)
	fp := store.NewFingerprint("POST", "/big", [32]byte{})
	key := idempotency.NewKey()
	fn := func(context.Context) (store.Record, bool) { return store.Record{Status: 200, Body: body}, true }
	if out, _, err := g.Run(context.Background(), "s", key, fp, fn); err != nil || out != store.Claimed {
		t.Fatalf("Run = %q %v", out, err)
	}
	out, rec, err := g.Run(context.Background(), "s", key, fp, fn)
	if err != nil || out != store.Completed || !bytes.Equal(rec.Body, body) {
		t.Fatalf("replay = %q len %d, %v", out, len(rec.Body), err)
	}
}

func TestAttackGuardHugeDurations(t *testing.T) {
	c, _ := client(t, 4)
	for _, d := range []time.Duration{1<<63 - 1, 100 * 365 * 24 * time.Hour, 1500 * time.Microsecond} {
		g, err := idempotency.NewGuard(newStore(t, c), idempotency.WithLockTimeout(d), idempotency.WithRetention(d))
		if err != nil {
			t.Fatal(err)
		}
		fp := store.NewFingerprint("POST", "/", [32]byte{})
		key := idempotency.NewKey()
		fn := func(context.Context) (store.Record, bool) { return store.Record{Status: 200}, true }
		if out, _, err := g.Run(context.Background(), "s", key, fp, fn); out != store.Claimed || err != nil {
			t.Fatalf("%v: Run = %q, %v", d, out, err)
		}
		if d < time.Second {
			continue
		}
		if out, _, err := g.Run(context.Background(), "s", key, fp, fn); out != store.Completed || err != nil {
			t.Fatalf("%v: second Run = %q, %v", d, out, err)
		}
	}
}
