package retry_test

import (
	"context"
	"errors"
	"net/http"
	"runtime"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/observe"
	"github.com/stormguard/stormguard/retry"
)

// doRecover runs p.Do with op on ctx and returns what Do panicked with.
func doRecover(p *retry.Policy, ctx context.Context, op func(context.Context, int) error) (v any) {
	defer func() { v = recover() }()
	_ = p.Do(ctx, op)
	return nil
}

// TestPanicEndsAttemptAndCall: an operation that panics, on its first
// attempt or on a retry, with an observer, a tagging observer, a breaker
// and an attempt timeout in any mix, has its attempt and its call reported
// as ended (AttemptEnd with Outcome "failure", GiveUp with Reason "panic",
// Err naming the panic) on the attempt's own context, and the panic goes
// on with its value unchanged. Before, the events stopped at AttemptStart
// and a span started for the attempt was never ended.
func TestPanicEndsAttemptAndCall(t *testing.T) {
	type value struct{ n int } // a panic value that is not an error
	tests := []struct {
		name       string
		opts       []retry.Option
		tagging    bool
		failFirst  bool // attempt 1 fails, attempt 2 panics
		value      any
		wantErrMsg string
	}{
		{"observer", nil, false, false, "boom", "retry: operation panicked: boom"},
		{"tagging observer", nil, true, false, "boom", "retry: operation panicked: boom"},
		{"on a retry", nil, false, true, value{7}, "retry: operation panicked: {7}"},
		{"with a breaker and an attempt timeout", []retry.Option{retry.WithAttemptTimeout(time.Second)}, true, true,
			http.ErrAbortHandler, "retry: operation panicked: net/http: abort Handler"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				tg := &tagger{}
				var obs observe.Observer = tg.observer()
				if tt.tagging {
					obs = tg
				}
				brk, err := breaker.New(breaker.Config{MinCalls: 100})
				if err != nil {
					t.Fatal(err)
				}
				opts := append([]retry.Option{retry.WithObserver(obs), retry.WithGuards(retry.Guards{Breaker: brk}), retry.WithName("db")}, tt.opts...)
				p := mustNew(t, opts...)
				var attemptCtx context.Context
				got := doRecover(p, context.Background(), func(ctx context.Context, attempt int) error {
					if tt.failFirst && attempt == 1 {
						return err503
					}
					attemptCtx = ctx
					time.Sleep(10 * time.Millisecond)
					panic(tt.value)
				})
				if got != tt.value {
					t.Fatalf("Do panicked with %v, want %v (the operation's value)", got, tt.value)
				}
				if attemptCtx.Err() == nil && len(tt.opts) > 0 {
					t.Errorf("the attempt's context is still live after the panic, want it released")
				}
				evs := tg.take()
				n := len(evs)
				if n < 3 {
					t.Fatalf("events %+v, want at least start, end and give-up", evs)
				}
				attempt := 1
				if tt.failFirst {
					attempt = 2
				}
				end, giveUp := evs[n-2], evs[n-1]
				wantOutcome := "failure"
				if tt.tagging {
					wantOutcome += ", tag " + string(rune('0'+attempt)) // ended on the attempt's context
				}
				if end.Kind != observe.AttemptEnd || end.Attempt != attempt || end.Outcome != wantOutcome || end.Elapsed != 10*time.Millisecond ||
					end.Err == nil || end.Err.Error() != tt.wantErrMsg {
					t.Errorf("second to last event %+v, want AttemptEnd of attempt %d, outcome %q, 10ms, Err %q", end, attempt, wantOutcome, tt.wantErrMsg)
				}
				if giveUp.Kind != observe.GiveUp || giveUp.Attempt != attempt || giveUp.Reason != "panic" || giveUp.Name != "db" || giveUp.Err != end.Err {
					t.Errorf("last event %+v, want GiveUp after %d attempts, reason panic, the AttemptEnd's Err", giveUp, attempt)
				}
				if err, ok := tt.value.(error); ok && !errors.Is(end.Err, err) {
					t.Errorf("errors.Is(%v, the panic's error) = false, want true", end.Err)
				}
				if s := brk.Snapshot(); s.Failures != 1+btoi(tt.failFirst) {
					t.Errorf("breaker failures = %d, want %d (the panic counts as one)", s.Failures, 1+btoi(tt.failFirst))
				}
			})
		})
	}
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// TestGoexitEndsAttemptAndCall: an operation that calls runtime.Goexit (as
// t.FailNow does) has its attempt and call reported as ended too, and the
// goroutine still exits.
func TestGoexitEndsAttemptAndCall(t *testing.T) {
	var ev events
	p := mustNew(t, retry.WithObserver(ev.observer()))
	done := make(chan bool)
	go func() {
		returned := false
		defer func() { done <- returned }()
		_ = p.Do(context.Background(), func(ctx context.Context, attempt int) error { runtime.Goexit(); return nil })
		returned = true
	}()
	if <-done {
		t.Fatal("Do returned after its operation called runtime.Goexit")
	}
	evs := ev.take()
	if len(evs) != 3 || evs[1].Kind != observe.AttemptEnd || evs[1].Outcome != "failure" || evs[2].Kind != observe.GiveUp || evs[2].Reason != "panic" ||
		evs[2].Err == nil || evs[2].Err.Error() != "retry: operation exited without returning (runtime.Goexit)" {
		t.Errorf("events %+v, want start, end (failure) and give-up (panic, Goexit)", evs)
	}
}

// TestClassifierPanicEndsAttemptAndCall: a classifier that panics (or calls
// runtime.Goexit) ends the call as an operation's panic does, whether it
// panics as the attempt's end is reported (the first time it is asked) or
// as the loop decides whether to retry (a later time for the same
// attempt): the observer hears the attempt's end once and a GiveUp with
// Reason "panic", and the panic goes on. The first once left the attempt
// without its end (a span never ended); the later one, the call without
// its GiveUp.
func TestClassifierPanicEndsAttemptAndCall(t *testing.T) {
	for _, tt := range []struct {
		name    string
		panicAt int // the classifier call that panics
		goexit  bool
	}{
		{"at the attempt's end", 1, false},
		{"at the retry's decision", 2, false},
		{"Goexit at the attempt's end", 1, true},
		{"Goexit at the retry's decision", 2, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var ev events
			calls := 0
			p := mustNew(t, retry.WithObserver(ev.observer()), retry.WithClassifier(func(error) bool {
				calls++
				if calls == tt.panicAt {
					if tt.goexit {
						runtime.Goexit()
					}
					panic("classifier")
				}
				return true
			}))
			done := make(chan any, 1)
			go func() {
				var v any = "exited"
				defer func() { done <- v }()
				v = doRecover(p, context.Background(), func(context.Context, int) error { return err503 })
			}()
			v := <-done
			if want := any("classifier"); tt.goexit {
				if v != "exited" {
					t.Errorf("Do with a classifier calling Goexit: %v, want the goroutine to exit", v)
				}
			} else if v != want {
				t.Errorf("Do panicked with %v, want %v", v, want)
			}
			var kinds []string
			ends := 0
			for _, e := range ev.take() {
				k := string(e.Kind)
				if e.Kind == observe.AttemptEnd {
					ends++
					k += ":" + e.Outcome
				}
				if e.Kind == observe.GiveUp {
					k += ":" + e.Reason
				}
				kinds = append(kinds, k)
			}
			if n := len(kinds); n < 3 || ends != 1 || kinds[n-1] != "give-up:panic" || kinds[n-2] != "attempt-end:failure" {
				t.Errorf("events %v, want the attempt's end once (failure), then GiveUp panic", kinds)
			}
		})
	}
}
