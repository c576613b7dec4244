// Black-box tests of the package against its documentation, from attacks
// on it from outside: each names the sentence it checks.

package idempotency_test

import (
	"context"
	"fmt"
	"math"
	"net/http"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stormguard/stormguard/idempotency"
	"github.com/stormguard/stormguard/idempotency/store"
)

func TestAttackParseKeyLimits(t *testing.T) {
	a255, a256 := strings.Repeat("a", 255), strings.Repeat("a", 256)
	esc255 := `"` + strings.Repeat(`\"`, 255) + `"`
	esc256 := `"` + strings.Repeat(`\\`, 256) + `"`
	cases := []struct {
		in, want string
		ok       bool
	}{
		{a255, a255, true},
		{a256, "", false},
		{" \t" + a255 + "\t ", a255, true},
		{`"` + a255 + `"`, a255, true},
		{`"` + a256 + `"`, "", false},
		{esc255, strings.Repeat(`"`, 255), true},
		{esc256, "", false},
		{`"a,b"`, "a,b", true},
		{`a,b`, "", false},
		{`""`, "", false},
		{`"`, "", false},
		{`"a"b"`, "", false},
		{`"a\b"`, "", false},
		{"a\x7f", "", false},
		{"a\x00", "", false},
		{"é", "", false},
		{`"   "`, "   ", true},
		{"   ", "", false},
		{`"a";p=1`, "", false},
	}
	for _, c := range cases {
		got, err := idempotency.ParseKey(c.in)
		if (err == nil) != c.ok || got != c.want {
			t.Errorf("ParseKey(%q) = %q, %v; want %q ok=%v", c.in, got, err, c.want, c.ok)
		}
		if err != nil && !strings.HasPrefix(err.Error(), "idempotency: invalid key: ") {
			t.Errorf("ParseKey(%q) error text %q", c.in, err)
		}
	}
}

// Extreme but valid option values must not break the memory store path.
func TestAttackGuardHugeDurations(t *testing.T) {
	g, err := idempotency.NewGuard(&idempotency.MemoryStore{},
		idempotency.WithLockTimeout(math.MaxInt64), idempotency.WithRetention(math.MaxInt64), idempotency.WithStoreTimeout(math.MaxInt64))
	if err != nil {
		t.Fatal(err)
	}
	fp := store.NewFingerprint("POST", "/", [32]byte{})
	fn := func(context.Context) (store.Record, bool) { return store.Record{Status: 200}, true }
	if out, _, err := g.Run(context.Background(), "s", "k", fp, fn); out != store.Claimed || err != nil {
		t.Fatalf("Run = %q, %v", out, err)
	}
	if out, _, err := g.Run(context.Background(), "s", "k", fp, fn); out != store.Completed || err != nil {
		t.Fatalf("Run = %q, %v", out, err)
	}
	_ = time.Second
}

// MemoryStore: "A caller who floods the store with keys only locks itself
// out". A black-box attack found the smallest bounds NewMemoryStore
// accepted (2 keys) breaking it: a caller holding one key locked every
// other caller out. The smallest is now 4 keys: a caller that floods the
// store takes its half (2), and another still gets a key.
func TestAttackMemoryStoreSmallestBoundsOneKeyLocksOthersOut(t *testing.T) {
	for _, cfg := range []idempotency.MemoryConfig{{MaxEntries: 4}, {MaxBytes: 640}} {
		s, err := idempotency.NewMemoryStore(cfg)
		if err != nil {
			t.Fatal(err)
		}
		g, err := idempotency.NewGuard(s)
		if err != nil {
			t.Fatal(err)
		}
		fp := store.NewFingerprint("POST", "/", [32]byte{})
		fn := func(context.Context) (store.Record, bool) { return store.Record{Status: 200}, true }
		claimed := 0
		for i := range 4 { // alice floods the store
			if out, _, err := g.Run(context.Background(), "alice", fmt.Sprint("k", i), fp, fn); out == store.Claimed && err == nil {
				claimed++
			}
		}
		if claimed != 2 {
			t.Errorf("%+v: alice claimed %d keys, want her half, 2", cfg, claimed)
		}
		if out, _, err := g.Run(context.Background(), "bob", "k1", fp, fn); out != store.Claimed || err != nil {
			t.Errorf("%+v: bob's first key, with alice holding her half: %q, %v", cfg, out, err)
		}
	}
}

// Guard.Run: "A record that no store takes ... is fn's misuse: it is not
// stored, and the key is released as for !keep, at once." A black-box
// attack found such a record (status outside 200-999) taken for a store
// outage: Run waited a whole lock timeout.
func TestAttackGuardUnstorableRecord(t *testing.T) {
	for _, rec := range []store.Record{{Status: 0}, {Status: 200, Header: http.Header{"": {"v"}}}} {
		synctest.Test(t, func(t *testing.T) {
			g, err := idempotency.NewGuard(&idempotency.MemoryStore{})
			if err != nil {
				t.Fatal(err)
			}
			fp := store.NewFingerprint("POST", "/", [32]byte{})
			runs := 0
			fn := func(context.Context) (store.Record, bool) { runs++; return rec, true }
			start := time.Now()
			out, _, err := g.Run(context.Background(), "s", "k", fp, fn)
			if out != store.Claimed || err != nil || time.Since(start) != 0 {
				t.Errorf("record %+v: first Run = %q, %v after %v; want claimed, nil, at once", rec, out, err, time.Since(start))
			}
			out, _, err = g.Run(context.Background(), "s", "k", fp, fn)
			if out != store.Claimed || err != nil || runs != 2 {
				t.Errorf("record %+v: a retry = %q, %v, fn run %d times; want claimed (the key released)", rec, out, err, runs)
			}
		})
	}
}
