package idempotency_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stormguard/stormguard/idempotency"
	"github.com/stormguard/stormguard/idempotency/store"
)

// lostClaimStore is a memory store whose next Begin loses its answer: it
// fails with errLostReply and the owner token it reports (as
// store.Result.Owner says a store does when its claim may have been made),
// while the claim itself lands land later (never when land is negative),
// as a command queued behind a lock does. A Release of the reported token
// releases the claim once it has landed. Safe for concurrent use.
type lostClaimStore struct {
	*idempotency.MemoryStore
	land     time.Duration
	noOwner  bool // report the zero owner with the error (a failure before sending)
	mu       sync.Mutex
	armed    bool
	reported store.Owner
	landed   store.Owner // the claim's real token, once it landed
	releases int         // Releases of the reported token
	landedAt time.Time
}

var errLostReply = errors.New("test: the claim's reply was lost")

func (s *lostClaimStore) Begin(ctx context.Context, id store.ID, fp store.Fingerprint, ttl time.Duration) (store.Result, error) {
	s.mu.Lock()
	armed := s.armed
	s.armed = false
	s.mu.Unlock()
	if !armed {
		return s.MemoryStore.Begin(ctx, id, fp, ttl)
	}
	reported := store.NewOwner()
	s.mu.Lock()
	s.reported = reported
	s.mu.Unlock()
	claim := func() {
		res, err := s.MemoryStore.Begin(context.Background(), id, fp, ttl)
		if err == nil && res.Outcome == store.Claimed {
			s.mu.Lock()
			s.landed, s.landedAt = res.Owner, time.Now()
			s.mu.Unlock()
		}
	}
	switch {
	case s.land == 0:
		claim()
	case s.land > 0:
		time.AfterFunc(s.land, claim)
	}
	if s.noOwner {
		return store.Result{}, errLostReply
	}
	return store.Result{Owner: reported}, errLostReply
}

func (s *lostClaimStore) Release(ctx context.Context, id store.ID, o store.Owner) error {
	s.mu.Lock()
	if o == s.reported {
		s.releases++
		if s.landed == (store.Owner{}) {
			s.mu.Unlock()
			return store.ErrStaleOwner // nothing there (yet)
		}
		o = s.landed
	}
	s.mu.Unlock()
	return s.MemoryStore.Release(ctx, id, o)
}

// TestLostClaimReleased: a claim whose answer was lost, reported by the
// store with its owner token (store.Result.Owner), is released by the
// Guard in the background, a store timeout (2 s) after the failure, and
// again after pauses that double while none is found (it may land later);
// its request is answered "store unavailable" without running, and a
// retry runs the operation long before the lock timeout (1 min), where it
// was answered "in progress" until then. The tries end within a lock
// timeout, at most 7 of them.
func TestLostClaimReleased(t *testing.T) {
	for _, c := range []struct {
		name    string
		land    time.Duration // when the claim lands after the failure; negative: never
		noOwner bool
		// the retry's run: at most this long after the failure (0: it is
		// told "in progress" until the lock timeout)
		runBy       time.Duration
		maxReleases int
	}{
		{"landed at once", 0, false, 2100 * time.Millisecond, 1},
		{"landed 3 s later", 3 * time.Second, false, 15 * time.Second, 3},
		{"never landed", -1, false, 100 * time.Millisecond, 7},
		{"no owner reported", 0, true, 0, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				mem, err := idempotency.NewMemoryStore(idempotency.MemoryConfig{})
				if err != nil {
					t.Fatal(err)
				}
				s := &lostClaimStore{MemoryStore: mem, land: c.land, noOwner: c.noOwner, armed: true}
				g, err := idempotency.NewGuard(s)
				if err != nil {
					t.Fatal(err)
				}
				fp := store.NewFingerprint("POST", "/pay", [32]byte{7})
				runs := 0
				fn := func(context.Context) (store.Record, bool) {
					runs++
					return store.Record{Status: 201}, true
				}
				start := time.Now()
				out, _, err := g.Run(context.Background(), "s", "k", fp, fn)
				if !errors.Is(err, idempotency.ErrStoreUnavailable) || !errors.Is(err, errLostReply) || runs != 0 {
					t.Fatalf("first Run: %q, %v, %d runs; want ErrStoreUnavailable wrapping the store's error, no run", out, err, runs)
				}
				// The client's retries, every 50 ms until one is not "in
				// progress", from the claim's landing on (a retry before it
				// finds the key free).
				if c.land > 0 {
					time.Sleep(c.land)
				}
				var ranAt time.Duration
				for {
					time.Sleep(50 * time.Millisecond)
					out, _, err = g.Run(context.Background(), "s", "k", fp, fn)
					if err != nil {
						t.Fatalf("retry: %v", err)
					}
					if out != store.InProgress {
						ranAt = time.Since(start)
						break
					}
				}
				if runs != 1 {
					t.Fatalf("the operation ran %d times, want 1 (retry: %q)", runs, out)
				}
				synctest.Wait()
				time.Sleep(2 * time.Minute) // any tries left end within the lock timeout
				s.mu.Lock()
				releases, landedAt := s.releases, s.landedAt
				s.mu.Unlock()
				landed := "never"
				if !landedAt.IsZero() {
					landed = landedAt.Sub(start).String() + " after the failure"
				}
				t.Logf("claim landed: %s; the retry ran %v after the failure; %d releases of the reported token", landed, ranAt, releases)
				if c.runBy == 0 {
					if ranAt < time.Minute {
						t.Errorf("the retry ran %v after the failure, want the lock timeout (no owner to release)", ranAt)
					}
				} else if ranAt > c.runBy {
					t.Errorf("the retry ran %v after the failure, want at most %v", ranAt, c.runBy)
				}
				if releases > c.maxReleases || (c.maxReleases > 0 && releases == 0) {
					t.Errorf("%d releases of the reported token, want 1 to %d", releases, c.maxReleases)
				}
			})
		})
	}
}
