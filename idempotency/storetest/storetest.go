// Package storetest is the conformance suite for [store.Store]
// implementations. A store's tests call [Run] with a function that opens a
// fresh, empty store; every store shipped with stormguard (memory,
// PostgreSQL, Redis) passes it. [ServiceAddress] reads a store server's
// address from the environment, for tests against a real server.
package storetest

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"net/http"
	"reflect"
	"sync"
	"testing"
	"time"

	"github.com/stormguard/stormguard/idempotency/store"
)

// fixture is an opened store under test: the store, and the function that
// moves its clock (nil on real time).
type fixture struct {
	Store   store.Store
	Advance func(d time.Duration)
}

// realTTL is the short lock timeout and retention the suite uses for
// stores on real time (no advance function).
const realTTL = 150 * time.Millisecond

// pollLimit bounds how long the suite waits for a real TTL to expire.
const pollLimit = 10 * time.Second

// long is a TTL no test outlives.
const long = time.Hour

// Run runs the conformance suite as subtests of t. open is called once per
// subtest and must return a fresh store, empty or holding only keys the
// suite will not use (it may register cleanups with t.Cleanup and skip or
// fail t), and the function that moves the store's clock forward by d: a
// fake clock's. A nil advance means the store runs on real time (the
// database's or the server's clock): the suite then uses short TTLs (150
// ms) and polls, within a bounded time, until they have expired.
func Run(t *testing.T, open func(t *testing.T) (s store.Store, advance func(d time.Duration))) {
	t.Helper()
	tests := []struct {
		name string
		f    func(t *testing.T, f fixture)
	}{
		{"Claim", testClaim},
		{"InProgress", testInProgress},
		{"Mismatch", testMismatch},
		{"CompleteReplay", testCompleteReplay},
		{"RecordRoundTrip", testRecordRoundTrip},
		{"Release", testRelease},
		{"StaleOwner", testStaleOwner},
		{"LockExpiryCrashRecovery", testLockExpiry},
		{"CompleteAfterLockExpiry", testCompleteAfterLockExpiry},
		{"RetentionExpiry", testRetentionExpiry},
		{"ScopeIsolation", testScopeIsolation},
		{"ConcurrentClaims", testConcurrentClaims},
		{"ConcurrentKeys", testConcurrentKeys},
		{"CanceledContext", testCanceledContext},
		{"Extend", testExtend},
		{"ExtendShortens", testExtendShortens},
		{"ExtendStale", testExtendStale},
		{"CompleteResent", testCompleteResent},
		{"BodyOmitted", testBodyOmitted},
		{"MillisecondTTL", testMillisecondTTL},
		{"MiddlewareDuplicates", testMiddlewareDuplicates},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var f fixture
			f.Store, f.Advance = open(t)
			if f.Store == nil {
				t.Fatal("open returned a nil Store")
			}
			tc.f(t, f)
		})
	}
}

// newKey returns a store ID no other test (or run) uses.
func newKey(t *testing.T) store.ID {
	t.Helper()
	return store.ID(sha256.Sum256([]byte(t.Name() + "/" + rand.Text())))
}

func fingerprint(body string) store.Fingerprint {
	var sum [32]byte
	copy(sum[:], body)
	return store.NewFingerprint(http.MethodPost, "/pay", sum)
}

func begin(t *testing.T, s store.Store, k store.ID, fp store.Fingerprint, ttl time.Duration, want store.Outcome) store.Result {
	t.Helper()
	res, err := s.Begin(context.Background(), k, fp, ttl)
	if err != nil {
		t.Fatalf("Begin(%x) error: %v", k, err)
	}
	if res.Outcome != want {
		t.Fatalf("Begin(%x) = %v, want %v", k, res.Outcome, want)
	}
	if want == store.Claimed && res.Owner == (store.Owner{}) {
		t.Fatalf("Begin(%x) claimed with a zero owner", k)
	}
	if want != store.Claimed && res.Owner != (store.Owner{}) {
		t.Fatalf("Begin(%x) = %v with owner %x, want zero owner", k, res.Outcome, res.Owner)
	}
	return res
}

func complete(t *testing.T, s store.Store, k store.ID, o store.Owner, rec store.Record, retention time.Duration) {
	t.Helper()
	if err := s.Complete(context.Background(), k, o, rec, retention); err != nil {
		t.Fatalf("Complete(%x) error: %v", k, err)
	}
}

func wantStale(t *testing.T, what string, err error) {
	t.Helper()
	if !errors.Is(err, store.ErrStaleOwner) {
		t.Fatalf("%s error = %v, want ErrStaleOwner", what, err)
	}
}

func sameRecord(t *testing.T, what string, got, want store.Record) {
	t.Helper()
	if got.Status != want.Status || !bytes.Equal(got.Body, want.Body) || !equalHeader(got.Header, want.Header) || got.BodyOmitted != want.BodyOmitted {
		t.Fatalf("%s record = %+v, want %+v", what, got, want)
	}
}

func equalHeader(a, b http.Header) bool {
	if len(a) == 0 && len(b) == 0 {
		return true
	}
	return reflect.DeepEqual(a, b)
}

// expire waits until TTLs of ttl set now have expired: it advances the
// fake clock, or polls key k (which must hold such a TTL, with fingerprint
// fp) with Begin until it is claimable, and returns that claim (taken with a
// long lock). With a fake clock it claims k too.
func expire(t *testing.T, f fixture, k store.ID, fp store.Fingerprint, ttl time.Duration) store.Result {
	t.Helper()
	if f.Advance != nil {
		f.Advance(ttl)
		return begin(t, f.Store, k, fp, long, store.Claimed)
	}
	deadline := time.Now().Add(pollLimit)
	for {
		res, err := f.Store.Begin(context.Background(), k, fp, long)
		if err != nil {
			t.Fatalf("Begin(%x) while waiting for expiry: %v", k, err)
		}
		if res.Outcome == store.Claimed {
			return res
		}
		if time.Now().After(deadline) {
			t.Fatalf("Begin(%x) = %v for %v after a TTL of %v, want claimable", k, res.Outcome, pollLimit, ttl)
		}
		time.Sleep(ttl / 10)
	}
}

func short(f fixture) time.Duration {
	if f.Advance != nil {
		return time.Minute
	}
	return realTTL
}

var testRecord = store.Record{
	Status: http.StatusCreated,
	Header: http.Header{"Content-Type": {"application/json"}, "Location": {"/payments/42"}},
	Body:   []byte(`{"id":42}`),
}

func testClaim(t *testing.T, f fixture) {
	k1, k2 := newKey(t), newKey(t)
	a := begin(t, f.Store, k1, fingerprint("a"), long, store.Claimed)
	b := begin(t, f.Store, k2, fingerprint("a"), long, store.Claimed)
	if a.Owner == b.Owner {
		t.Fatalf("Begin on two keys gave the same owner %x", a.Owner)
	}
}

func testInProgress(t *testing.T, f fixture) {
	k := newKey(t)
	begin(t, f.Store, k, fingerprint("a"), long, store.Claimed)
	begin(t, f.Store, k, fingerprint("a"), long, store.InProgress)
	begin(t, f.Store, k, fingerprint("a"), long, store.InProgress)
}

func testMismatch(t *testing.T, f fixture) {
	k := newKey(t)
	a := begin(t, f.Store, k, fingerprint("a"), long, store.Claimed)
	begin(t, f.Store, k, fingerprint("b"), long, store.Mismatch)
	complete(t, f.Store, k, a.Owner, testRecord, long)
	begin(t, f.Store, k, fingerprint("b"), long, store.Mismatch)
	res := begin(t, f.Store, k, fingerprint("a"), long, store.Completed)
	sameRecord(t, "Begin after mismatch", res.Record, testRecord)
}

func testCompleteReplay(t *testing.T, f fixture) {
	k := newKey(t)
	a := begin(t, f.Store, k, fingerprint("a"), long, store.Claimed)
	complete(t, f.Store, k, a.Owner, testRecord, long)
	for i := range 3 {
		res := begin(t, f.Store, k, fingerprint("a"), long, store.Completed)
		sameRecord(t, fmt.Sprintf("replay %d", i), res.Record, testRecord)
	}
}

func testRecordRoundTrip(t *testing.T, f fixture) {
	big := bytes.Repeat([]byte("0123456789abcdef\x00\xff"), 4000) // 72 kB, binary
	recs := []store.Record{
		{Status: 200},
		{Status: 204, Header: http.Header{}},
		{Status: 422, Body: []byte("x")},
		{Status: 999, Header: http.Header{"Vary": {"Accept", "Accept-Encoding"}, "Etag": {""}}, Body: big},
	}
	for i, rec := range recs {
		k := newKey(t)
		a := begin(t, f.Store, k, fingerprint("a"), long, store.Claimed)
		complete(t, f.Store, k, a.Owner, rec, long)
		res := begin(t, f.Store, k, fingerprint("a"), long, store.Completed)
		sameRecord(t, fmt.Sprintf("record %d", i), res.Record, rec)
	}
}

func testRelease(t *testing.T, f fixture) {
	k := newKey(t)
	a := begin(t, f.Store, k, fingerprint("a"), long, store.Claimed)
	if err := f.Store.Release(context.Background(), k, a.Owner); err != nil {
		t.Fatalf("Release error: %v", err)
	}
	// Released: the key is free again, for any fingerprint.
	b := begin(t, f.Store, k, fingerprint("b"), long, store.Claimed)
	if b.Owner == a.Owner {
		t.Fatalf("Begin after Release reused owner %x", a.Owner)
	}
	wantStale(t, "second Release by the old owner", f.Store.Release(context.Background(), k, a.Owner))
	begin(t, f.Store, k, fingerprint("b"), long, store.InProgress)
}

func testStaleOwner(t *testing.T, f fixture) {
	ctx := context.Background()
	k := newKey(t)
	a := begin(t, f.Store, k, fingerprint("a"), long, store.Claimed)
	other := store.NewOwner()
	wantStale(t, "Complete by a stranger", f.Store.Complete(ctx, k, other, testRecord, long))
	wantStale(t, "Release by a stranger", f.Store.Release(ctx, k, other))
	wantStale(t, "Complete of an unknown key", f.Store.Complete(ctx, newKey(t), a.Owner, testRecord, long))
	wantStale(t, "Release of an unknown key", f.Store.Release(ctx, newKey(t), a.Owner))
	// The stranger changed nothing.
	begin(t, f.Store, k, fingerprint("a"), long, store.InProgress)
	complete(t, f.Store, k, a.Owner, testRecord, long)
	// Once completed, the owner holds no lock any more.
	wantStale(t, "second Complete", f.Store.Complete(ctx, k, a.Owner, store.Record{Status: 500}, long))
	wantStale(t, "Release after Complete", f.Store.Release(ctx, k, a.Owner))
	res := begin(t, f.Store, k, fingerprint("a"), long, store.Completed)
	sameRecord(t, "Begin after rejected calls", res.Record, testRecord)
}

// testLockExpiry is crash recovery: a claim whose owner vanished becomes
// claimable after the lock timeout, and the vanished owner's late
// completion is rejected.
func testLockExpiry(t *testing.T, f fixture) {
	ctx := context.Background()
	ttl := short(f)
	k := newKey(t)
	a := begin(t, f.Store, k, fingerprint("a"), ttl, store.Claimed)
	b := expire(t, f, k, fingerprint("a"), ttl)
	if b.Owner == a.Owner {
		t.Fatalf("reclaim after lock expiry reused owner %x", a.Owner)
	}
	wantStale(t, "late Complete by the vanished owner", f.Store.Complete(ctx, k, a.Owner, store.Record{Status: 200, Body: []byte("late")}, long))
	wantStale(t, "late Release by the vanished owner", f.Store.Release(ctx, k, a.Owner))
	begin(t, f.Store, k, fingerprint("a"), long, store.InProgress)
	complete(t, f.Store, k, b.Owner, testRecord, long)
	res := begin(t, f.Store, k, fingerprint("a"), long, store.Completed)
	sameRecord(t, "replay after crash recovery", res.Record, testRecord)
}

func testCompleteAfterLockExpiry(t *testing.T, f fixture) {
	ctx := context.Background()
	ttl := short(f)
	k, probe := newKey(t), newKey(t)
	a := begin(t, f.Store, k, fingerprint("a"), ttl, store.Claimed)
	begin(t, f.Store, probe, fingerprint("a"), ttl, store.Claimed)
	expire(t, f, probe, fingerprint("a"), ttl) // k's lock, as old, has expired too
	// Nobody reclaimed k, but a's lock has expired: its renewal and its
	// completion are rejected all the same (it may already be racing a
	// reclaim; a renewal must not revive it).
	wantStale(t, "Extend after lock expiry", f.Store.Extend(ctx, k, a.Owner, long))
	wantStale(t, "Complete after lock expiry", f.Store.Complete(ctx, k, a.Owner, testRecord, long))
	wantStale(t, "Release after lock expiry", f.Store.Release(ctx, k, a.Owner))
	// The reclaim is the new request's, fingerprint and all: the old
	// request's retry is another request's (Mismatch), the new one's
	// retry waits (InProgress).
	begin(t, f.Store, k, fingerprint("other"), long, store.Claimed)
	begin(t, f.Store, k, fingerprint("a"), long, store.Mismatch)
	begin(t, f.Store, k, fingerprint("other"), long, store.InProgress)
}

func testRetentionExpiry(t *testing.T, f fixture) {
	ttl := short(f)
	k := newKey(t)
	a := begin(t, f.Store, k, fingerprint("a"), long, store.Claimed)
	complete(t, f.Store, k, a.Owner, testRecord, ttl)
	if f.Advance != nil {
		f.Advance(ttl - time.Second)
		res := begin(t, f.Store, k, fingerprint("a"), long, store.Completed)
		sameRecord(t, "replay just before retention ends", res.Record, testRecord)
		f.Advance(time.Second)
		begin(t, f.Store, k, fingerprint("b"), long, store.Claimed)
	} else {
		expire(t, f, k, fingerprint("b"), ttl)
	}
	// The expired record's fingerprint went with it.
	begin(t, f.Store, k, fingerprint("a"), long, store.Mismatch)
}

// testScopeIsolation: two IDs of one scope (their first 8 bytes equal) are
// two keys: a record stored for one is not the other's, and the owner of
// one cannot complete the other.
func testScopeIsolation(t *testing.T, f fixture) {
	alice := newKey(t)
	bob := alice
	copy(bob[8:], rand.Text())
	a := begin(t, f.Store, alice, fingerprint("a"), long, store.Claimed)
	complete(t, f.Store, alice, a.Owner, testRecord, long)
	b := begin(t, f.Store, bob, fingerprint("a"), long, store.Claimed)
	wantStale(t, "Complete of one key with the owner of another", f.Store.Complete(context.Background(), alice, b.Owner, store.Record{Status: 200}, long))
	res := begin(t, f.Store, alice, fingerprint("a"), long, store.Completed)
	sameRecord(t, "the first key's replay", res.Record, testRecord)
}

func testConcurrentClaims(t *testing.T, f fixture) {
	const n = 50
	k := newKey(t)
	counts := concurrentBegins(t, f.Store, k, n)
	if counts[store.Claimed] != 1 || counts[store.InProgress] != n-1 {
		t.Fatalf("%d concurrent Begins on a new key: %v, want 1 claimed and %d in progress", n, counts, n-1)
	}
	// Nobody got the owner back here; claim a second key to complete.
	k2 := newKey(t)
	a := begin(t, f.Store, k2, fingerprint("a"), long, store.Claimed)
	complete(t, f.Store, k2, a.Owner, testRecord, long)
	counts = concurrentBegins(t, f.Store, k2, n)
	if counts[store.Completed] != n {
		t.Fatalf("%d concurrent Begins on a completed key: %v, want %d completed", n, counts, n)
	}
}

func concurrentBegins(t *testing.T, s store.Store, k store.ID, n int) map[store.Outcome]int {
	t.Helper()
	var (
		mu     sync.Mutex
		counts = map[store.Outcome]int{}
		wg     sync.WaitGroup
		start  = make(chan struct{})
		errs   = make(chan error, n)
	)
	for range n {
		wg.Go(func() {
			<-start
			res, err := s.Begin(context.Background(), k, fingerprint("a"), long)
			if err != nil {
				errs <- err
				return
			}
			mu.Lock()
			counts[res.Outcome]++
			mu.Unlock()
		})
	}
	close(start)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("concurrent Begin error: %v", err)
	}
	return counts
}

func testConcurrentKeys(t *testing.T, f fixture) {
	const n = 32
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		wg.Go(func() {
			ctx := context.Background()
			k := newKey(t)
			rec := store.Record{Status: 200, Body: fmt.Appendf(nil, "response %d", i)}
			res, err := f.Store.Begin(ctx, k, fingerprint("a"), long)
			if err != nil || res.Outcome != store.Claimed {
				errs <- fmt.Errorf("Begin(key %d) = %v, %v; want claimed", i, res.Outcome, err)
				return
			}
			if err := f.Store.Complete(ctx, k, res.Owner, rec, long); err != nil {
				errs <- fmt.Errorf("Complete(key %d): %v", i, err)
				return
			}
			res, err = f.Store.Begin(ctx, k, fingerprint("a"), long)
			if err != nil || res.Outcome != store.Completed || !bytes.Equal(res.Record.Body, rec.Body) {
				errs <- fmt.Errorf("Begin(key %d) after Complete = %v %q, %v; want completed %q", i, res.Outcome, res.Record.Body, err, rec.Body)
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

func testCanceledContext(t *testing.T, f fixture) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	k := newKey(t)
	if _, err := f.Store.Begin(ctx, k, fingerprint("a"), long); err == nil {
		t.Fatal("Begin with a canceled context: nil error")
	}
	// Nothing was claimed.
	begin(t, f.Store, k, fingerprint("a"), long, store.Claimed)
}

func extend(t *testing.T, s store.Store, k store.ID, o store.Owner, ttl time.Duration) {
	t.Helper()
	if err := s.Extend(context.Background(), k, o, ttl); err != nil {
		t.Fatalf("Extend(%x, %v) error: %v", k, ttl, err)
	}
}

// testExtend: an extended lock outlives its first TTL (fake clock only: on
// real time that would take a wait that proves nothing when it passes).
func testExtend(t *testing.T, f fixture) {
	k := newKey(t)
	a := begin(t, f.Store, k, fingerprint("a"), time.Minute, store.Claimed)
	extend(t, f.Store, k, a.Owner, long)
	if f.Advance != nil {
		f.Advance(2 * time.Minute)
		begin(t, f.Store, k, fingerprint("a"), long, store.InProgress)
	}
	// Still the owner's lock: it completes.
	complete(t, f.Store, k, a.Owner, testRecord, long)
	res := begin(t, f.Store, k, fingerprint("a"), long, store.Completed)
	sameRecord(t, "replay after Extend", res.Record, testRecord)
}

// testExtendShortens: Extend sets the lock's end from now, shorter or
// longer; a lock shortened to a short TTL expires after it.
func testExtendShortens(t *testing.T, f fixture) {
	ttl := short(f)
	k := newKey(t)
	a := begin(t, f.Store, k, fingerprint("a"), long, store.Claimed)
	extend(t, f.Store, k, a.Owner, ttl)
	b := expire(t, f, k, fingerprint("a"), ttl)
	if b.Owner == a.Owner {
		t.Fatalf("reclaim after the shortened lock expired reused owner %x", a.Owner)
	}
	wantStale(t, "Extend by the expired owner", f.Store.Extend(context.Background(), k, a.Owner, long))
}

func testExtendStale(t *testing.T, f fixture) {
	ctx := context.Background()
	k := newKey(t)
	a := begin(t, f.Store, k, fingerprint("a"), long, store.Claimed)
	wantStale(t, "Extend by a stranger", f.Store.Extend(ctx, k, store.NewOwner(), long))
	wantStale(t, "Extend of an unknown key", f.Store.Extend(ctx, newKey(t), a.Owner, long))
	complete(t, f.Store, k, a.Owner, testRecord, long)
	wantStale(t, "Extend after Complete", f.Store.Extend(ctx, k, a.Owner, long))
	res := begin(t, f.Store, k, fingerprint("a"), long, store.Completed)
	sameRecord(t, "record after a stale Extend", res.Record, testRecord)
	k2 := newKey(t)
	b := begin(t, f.Store, k2, fingerprint("a"), long, store.Claimed)
	if err := f.Store.Release(ctx, k2, b.Owner); err != nil {
		t.Fatalf("Release: %v", err)
	}
	wantStale(t, "Extend after Release", f.Store.Extend(ctx, k2, b.Owner, long))
}

// testCompleteResent: a Complete executed twice (its first reply lost)
// succeeds both times; a second Complete with another record does not.
func testCompleteResent(t *testing.T, f fixture) {
	ctx := context.Background()
	k := newKey(t)
	a := begin(t, f.Store, k, fingerprint("a"), long, store.Claimed)
	complete(t, f.Store, k, a.Owner, testRecord, long)
	resent := store.Record{Status: testRecord.Status, Header: testRecord.Header.Clone(), Body: bytes.Clone(testRecord.Body)}
	if err := f.Store.Complete(ctx, k, a.Owner, resent, long); err != nil {
		t.Fatalf("Complete resent with the same record: %v", err)
	}
	other := resent
	other.Body = []byte(`{"id":43}`)
	wantStale(t, "second Complete with another record", f.Store.Complete(ctx, k, a.Owner, other, long))
	wantStale(t, "resent Complete by a stranger", f.Store.Complete(ctx, k, store.NewOwner(), testRecord, long))
	res := begin(t, f.Store, k, fingerprint("a"), long, store.Completed)
	sameRecord(t, "record after a resent Complete", res.Record, testRecord)
}

// testBodyOmitted: a record whose body was not kept round-trips with its
// mark; one that claims both a body and its omission is refused.
func testBodyOmitted(t *testing.T, f fixture) {
	ctx := context.Background()
	k := newKey(t)
	a := begin(t, f.Store, k, fingerprint("a"), long, store.Claimed)
	bad := store.Record{Status: 201, Body: []byte("x"), BodyOmitted: true}
	if err := f.Store.Complete(ctx, k, a.Owner, bad, long); err == nil || errors.Is(err, store.ErrStaleOwner) {
		t.Fatalf("Complete(a record with a body and BodyOmitted) error = %v, want a refusal", err)
	}
	rec := store.Record{Status: 201, Header: http.Header{"Location": {"/payments/42"}}, BodyOmitted: true}
	complete(t, f.Store, k, a.Owner, rec, long)
	res := begin(t, f.Store, k, fingerprint("a"), long, store.Completed)
	sameRecord(t, "body-omitted record", res.Record, rec)
}

// testMillisecondTTL: a lock of 1 ms, the shortest the middleware allows,
// is kept (not rounded to nothing or refused) and expires.
func testMillisecondTTL(t *testing.T, f fixture) {
	k := newKey(t)
	a := begin(t, f.Store, k, fingerprint("a"), time.Millisecond, store.Claimed)
	b := expire(t, f, k, fingerprint("a"), time.Millisecond)
	if b.Owner == a.Owner {
		t.Fatalf("reclaim after a 1 ms lock reused owner %x", a.Owner)
	}
}
