// Black-box tests of the package against its documentation, from attacks
// on it from outside: each names the sentence it checks.

package storetest_test

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stormguard/stormguard/idempotency"
	"github.com/stormguard/stormguard/idempotency/store"
	"github.com/stormguard/stormguard/idempotency/storetest"
)

// mapStore is a minimal store on a fake clock, correct unless a mutation
// is switched on.
type mapStore struct {
	mu  sync.Mutex
	now time.Time
	m   map[store.ID]*ent
	mut string
}

type ent struct {
	fp      store.Fingerprint
	owner   store.Owner
	done    bool
	rec     []byte
	expires time.Time
}

func (s *mapStore) live(id store.ID) *ent {
	e := s.m[id]
	if e == nil || !s.now.Before(e.expires) {
		return nil
	}
	return e
}

func (s *mapStore) Begin(ctx context.Context, id store.ID, fp store.Fingerprint, ttl time.Duration) (store.Result, error) {
	if err := ctx.Err(); err != nil {
		return store.Result{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if e := s.live(id); e != nil {
		switch {
		case e.fp != fp:
			return store.Result{Outcome: store.Mismatch}, nil
		case e.done:
			r, err := store.DecodeRecord(e.rec)
			return store.Result{Outcome: store.Completed, Record: r}, err
		}
		return store.Result{Outcome: store.InProgress}, nil
	}
	o := store.NewOwner()
	if old := s.m[id]; old != nil && s.mut == "keep-fingerprint-on-reclaim" {
		// An UPDATE that forgot the fingerprint column.
		*old = ent{fp: old.fp, owner: o, expires: s.now.Add(ttl)}
		return store.Result{Outcome: store.Claimed, Owner: o}, nil
	}
	s.m[id] = &ent{fp: fp, owner: o, expires: s.now.Add(ttl)}
	return store.Result{Outcome: store.Claimed, Owner: o}, nil
}

func (s *mapStore) Complete(ctx context.Context, id store.ID, o store.Owner, rec store.Record, ret time.Duration) error {
	b, err := rec.MarshalBinary()
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.live(id)
	if e == nil || e.owner != o || (e.done && !bytes.Equal(e.rec, b)) {
		return store.ErrStaleOwner
	}
	e.done, e.rec, e.expires = true, slices.Clone(b), s.now.Add(ret)
	return nil
}

func (s *mapStore) Extend(ctx context.Context, id store.ID, o store.Owner, ttl time.Duration) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.live(id)
	if s.mut == "extend-revives-expired-lock" {
		e = s.m[id] // forgot the expiry check
	}
	if e == nil || e.owner != o || e.done {
		return store.ErrStaleOwner
	}
	e.expires = s.now.Add(ttl)
	return nil
}

func (s *mapStore) Release(ctx context.Context, id store.ID, o store.Owner) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.live(id)
	if e == nil || e.owner != o || e.done {
		return store.ErrStaleOwner
	}
	delete(s.m, id)
	return nil
}

// TestAttackMutantSuite runs the conformance suite on mapStore with the
// mutation named by STORMGUARD_ATTACK_MUTANT (run by TestAttackSuiteCatchesMutants).
func TestAttackMutantSuite(t *testing.T) {
	mut, ok := os.LookupEnv("STORMGUARD_ATTACK_MUTANT")
	if !ok {
		t.Skip("run by TestAttackSuiteCatchesMutants")
	}
	storetest.Run(t, func(t *testing.T) (store.Store, func(time.Duration)) {
		s := &mapStore{now: time.Unix(1e9, 0), m: map[store.ID]*ent{}, mut: mut}
		return s, func(d time.Duration) { s.mu.Lock(); s.now = s.now.Add(d); s.mu.Unlock() }
	})
}

func TestAttackSuiteCatchesMutants(t *testing.T) {
	for _, c := range []struct {
		mut      string
		wantFail bool
	}{
		{"", false}, // control: the correct store passes
		{"keep-fingerprint-on-reclaim", true},
		{"extend-revives-expired-lock", true},
	} {
		cmd := exec.Command(os.Args[0], "-test.run=^TestAttackMutantSuite$", "-test.count=1")
		cmd.Env = append(os.Environ(), "STORMGUARD_ATTACK_MUTANT="+c.mut)
		out, err := cmd.CombinedOutput()
		failed := err != nil
		if failed != c.wantFail {
			t.Errorf("mutant %q: suite failed=%v, want %v\n%s", c.mut, failed, c.wantFail, out)
		}
	}
}

// What the mutant that the suite passes does through a Guard: after a
// crashed request's lock expired and another request reused the key, the
// crashed request's retry is served the other request's response (and the
// other request's own retry gets a mismatch).
func TestAttackKeepFingerprintMutantImpact(t *testing.T) {
	for _, mut := range []string{"", "keep-fingerprint-on-reclaim"} {
		s := &mapStore{now: time.Unix(1e9, 0), m: map[store.ID]*ent{}, mut: mut}
		g, err := idempotency.NewGuard(s)
		if err != nil {
			t.Fatal(err)
		}
		ctx := context.Background()
		fpA := store.NewFingerprint("POST", "/pay/alice", [32]byte{})
		fpB := store.NewFingerprint("POST", "/pay/bob", [32]byte{})
		// Request A claims through a Guard whose process then dies: its fn never returns.
		crashed := make(chan struct{})
		go g.Run(ctx, "s", "key", fpA, func(ctx context.Context) (store.Record, bool) {
			close(crashed)
			select {}
		})
		<-crashed
		s.mu.Lock()
		s.now = s.now.Add(2 * time.Hour) // its lock expired long ago (the fake store clock)
		s.mu.Unlock()
		out, _, err := g.Run(ctx, "s", "key", fpB, func(context.Context) (store.Record, bool) {
			return store.Record{Status: 201, Body: []byte("bob paid")}, true
		})
		if out != store.Claimed || err != nil {
			t.Fatalf("%q: B = %q %v", mut, out, err)
		}
		out, rec, err := g.Run(ctx, "s", "key", fpA, func(context.Context) (store.Record, bool) { return store.Record{Status: 201}, true })
		t.Logf("store %q: retry of A = %q %q %v", mut, out, rec.Body, err)
		if mut != "" && out == store.Completed {
			t.Logf("the suite passes a store that replays B's response to A's retry")
		}
	}
}
