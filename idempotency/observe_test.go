package idempotency_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stormguard/stormguard/idempotency"
	"github.com/stormguard/stormguard/idempotency/store"
	"github.com/stormguard/stormguard/observe"
)

// eventLog is an observer that keeps every event; safe for concurrent use.
type eventLog struct {
	mu     sync.Mutex
	events []observe.Event
}

func (l *eventLog) Observe(_ context.Context, e observe.Event) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.events = append(l.events, e)
}

func (l *eventLog) take() []observe.Event {
	l.mu.Lock()
	defer l.mu.Unlock()
	evs := l.events
	l.events = nil
	return evs
}

// errDown is the error of a store that is down.
var errDown = errors.New("connection refused")

// slowStore is a memory store behind a network with fixed delays per call
// (on the synctest clock), which can be switched down.
type slowStore struct {
	*idempotency.MemoryStore
	down atomic.Bool
}

// Delays of slowStore's calls.
const (
	beginDelay    = 1 * time.Millisecond
	completeDelay = 2 * time.Millisecond
	releaseDelay  = 4 * time.Millisecond
)

func (s *slowStore) Begin(ctx context.Context, k store.ID, fp store.Fingerprint, ttl time.Duration) (store.Result, error) {
	time.Sleep(beginDelay)
	if s.down.Load() {
		return store.Result{}, errDown
	}
	return s.MemoryStore.Begin(ctx, k, fp, ttl)
}

func (s *slowStore) Complete(ctx context.Context, k store.ID, o store.Owner, rec store.Record, d time.Duration) error {
	time.Sleep(completeDelay)
	return s.MemoryStore.Complete(ctx, k, o, rec, d)
}

func (s *slowStore) Release(ctx context.Context, k store.ID, o store.Owner) error {
	time.Sleep(releaseDelay)
	return s.MemoryStore.Release(ctx, k, o)
}

// TestObserverEvents: the middleware reports one event per keyed request,
// in order, with the outcome, its name, the time spent in the store
// (exact: the store's delays on the synctest clock) and the store's error
// for a store error; none for a request without a key or an unguarded
// method.
func TestObserverEvents(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		mem, _ := idempotency.NewMemoryStore(idempotency.MemoryConfig{})
		slow := &slowStore{MemoryStore: mem}
		var log eventLog
		entered, proceed := make(chan struct{}), make(chan struct{})
		h := newMiddleware(t, slow, idempotency.WithObserver(&log), idempotency.WithName("charges"))(
			http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				switch r.Header.Get("X-Script") {
				case "block":
					entered <- struct{}{}
					<-proceed
				case "fail":
					w.WriteHeader(http.StatusInternalServerError)
					return
				}
				w.WriteHeader(http.StatusCreated)
				fmt.Fprint(w, "done")
			}))
		do := func(c call, script string) int {
			req := c.request()
			req.Header.Set("X-Script", script)
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			return rec.Code
		}
		type step struct {
			name   string
			run    func()
			events []observe.Event
		}
		ev := func(outcome string, elapsed time.Duration, err error) observe.Event {
			return observe.Event{Kind: observe.Idempotency, Name: "charges", Outcome: outcome, Elapsed: elapsed, Err: err}
		}
		steps := []step{
			{"no key", func() { do(call{}, "") }, nil},
			{"unguarded method", func() { do(call{method: http.MethodGet, keys: key("k1")}, "") }, nil},
			{"new", func() { do(call{keys: key("k1"), body: "a"}, "") },
				[]observe.Event{ev("new", beginDelay+completeDelay, nil)}},
			{"replay", func() { do(call{keys: key("k1"), body: "a"}, "") },
				[]observe.Event{ev("replay", beginDelay, nil)}},
			{"mismatch", func() { do(call{keys: key("k1"), body: "b"}, "") },
				[]observe.Event{ev("mismatch", beginDelay, nil)}},
			{"invalid key", func() { do(call{keys: key("bad\x01key")}, "") },
				[]observe.Event{ev("invalid", 0, nil)}},
			{"two keys", func() { do(call{keys: []string{"k1", "k2"}}, "") },
				[]observe.Event{ev("invalid", 0, nil)}},
			{"in progress, then the first ends", func() {
				done := make(chan struct{})
				go func() {
					defer close(done)
					do(call{keys: key("k2")}, "block")
				}()
				<-entered
				do(call{keys: key("k2")}, "")
				close(proceed)
				<-done
			}, []observe.Event{ev("in-progress", beginDelay, nil), ev("new", beginDelay+completeDelay, nil)}},
			{"status not stored: released", func() { do(call{keys: key("k3")}, "fail") },
				[]observe.Event{ev("new", beginDelay+releaseDelay, nil)}},
			{"store down", func() {
				slow.down.Store(true)
				defer slow.down.Store(false)
				if code := do(call{keys: key("k4")}, ""); code != http.StatusServiceUnavailable {
					t.Errorf("store down: status %d, want 503", code)
				}
			}, []observe.Event{ev("store-error", beginDelay, errDown)}},
		}
		for _, s := range steps {
			s.run()
			got := log.take()
			if len(got) != len(s.events) {
				t.Fatalf("%s: %d events %+v, want %d %+v", s.name, len(got), got, len(s.events), s.events)
			}
			for i, want := range s.events {
				g := got[i]
				gotErr, wantErr := g.Err, want.Err
				g.Err, want.Err = nil, nil
				if g != want {
					t.Errorf("%s: event %d = %+v, want %+v", s.name, i, g, want)
				}
				switch {
				case wantErr == nil && gotErr != nil:
					t.Errorf("%s: event %d has Err %v, want nil", s.name, i, gotErr)
				case wantErr != nil && (!errors.Is(gotErr, wantErr) || !errors.Is(gotErr, idempotency.ErrStoreUnavailable)):
					t.Errorf("%s: event %d has Err %v, want one wrapping %v and ErrStoreUnavailable", s.name, i, gotErr, wantErr)
				}
			}
		}
	})
}

// TestObserverAllocations: an observer costs the replay and new paths no
// allocation (the events are values), and without one nothing is measured.
func TestObserverAllocations(t *testing.T) {
	var n atomic.Int64
	count := observe.Func(func(context.Context, observe.Event) { n.Add(1) })
	for _, path := range []string{"replay", "new"} {
		allocs := make(map[bool]float64)
		for _, observed := range []bool{false, true} {
			mem, _ := idempotency.NewMemoryStore(idempotency.MemoryConfig{MaxEntries: 1 << 20, MaxBytes: 1 << 30})
			opts := []idempotency.Option{idempotency.WithScope(userScope)}
			if observed {
				opts = append(opts, idempotency.WithObserver(count))
			}
			mw, err := idempotency.NewMiddleware(mem, opts...)
			if err != nil {
				t.Fatal(err)
			}
			h := mw(benchHandler)
			w := &discardWriter{h: make(http.Header)}
			i := 0
			req := func() *http.Request {
				k := "replay-key"
				if path == "new" {
					i++
					k = fmt.Sprint("key-", i)
				}
				r := call{keys: key(k), body: benchBody}.request()
				return r
			}
			h.ServeHTTP(w, req()) // the replay path needs a stored response
			reqs := make([]*http.Request, 200)
			for j := range reqs {
				reqs[j] = req()
			}
			j := 0
			allocs[observed] = testing.AllocsPerRun(100, func() {
				clear(w.h)
				h.ServeHTTP(w, reqs[j])
				j++
			})
		}
		if allocs[true] != allocs[false] {
			t.Errorf("%s path: %v allocations with an observer, %v without; want the same", path, allocs[true], allocs[false])
		}
		t.Logf("%s path: %v allocations per request, with or without an observer", path, allocs[false])
	}
	if n.Load() == 0 {
		t.Fatal("the observer saw no event")
	}
}

// TestCanceledRequestIsNoStoreError: a request whose context ended before
// the middleware claimed its key (the client went away after its body was
// read) takes the canceled path with the memory store too: the claim is
// not the request's (Guard.Run), so it is not a store failure.
func TestCanceledRequestIsNoStoreError(t *testing.T) {
	mem, err := idempotency.NewMemoryStore(idempotency.MemoryConfig{})
	if err != nil {
		t.Fatal(err)
	}
	var log eventLog
	mw, err := idempotency.NewMiddleware(mem,
		idempotency.WithScope(func(*http.Request) (string, error) { return "s", nil }),
		idempotency.WithObserver(&log))
	if err != nil {
		t.Fatal(err)
	}
	ran := false
	h := mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { ran = true; w.WriteHeader(http.StatusCreated) }))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	r := httptest.NewRequestWithContext(ctx, http.MethodPost, "/", nil)
	r.Header.Set("Idempotency-Key", "k")
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	for _, e := range log.take() {
		if e.Outcome == "store-error" || errors.Is(e.Err, idempotency.ErrStoreUnavailable) {
			t.Errorf("a canceled request reported as a store failure: %+v (answer %d %q)", e, w.Code, w.Body.String())
		}
	}
	if ran {
		t.Error("the handler ran for a request already gone")
	}
}
