package grpcretry_test

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	testpb "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/budget"
	"github.com/stormguard/stormguard/grpcretry"
	"github.com/stormguard/stormguard/limit"
	"github.com/stormguard/stormguard/observe"
	"github.com/stormguard/stormguard/retry"
	"github.com/stormguard/stormguard/wire"
)

// legAnswer is how a legServer answers one call: after delay, with code
// (OK: a reply naming the call) and a pushback trailer (nil: none).
type legAnswer struct {
	delay    time.Duration
	code     codes.Code
	pushback []string
}

// legServer is the test service for hedging, in a synctest bubble: its
// i-th unary call (from 0) answers as answer(i) says, or ends with its
// context's error when the client cancels it first. It records each
// call's metadata and which calls saw their context end, and counts the
// calls in flight.
type legServer struct {
	testpb.UnimplementedTestServiceServer
	answer func(i int) legAnswer

	mu       sync.Mutex
	prev     []string // grpc-previous-rpc-attempts of each call, "" for none
	keys     []string // idempotency-key of each call
	canceled []int    // the calls that saw their context end
	inflight atomic.Int64
}

// delays answers OK after ds[i] (the last one for any later call).
func delays(ds ...time.Duration) func(int) legAnswer {
	return func(i int) legAnswer { return legAnswer{delay: ds[min(i, len(ds)-1)]} }
}

func (s *legServer) UnaryCall(ctx context.Context, _ *testpb.SimpleRequest) (*testpb.SimpleResponse, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	s.mu.Lock()
	i := len(s.prev)
	s.prev = append(s.prev, strings.Join(md[wire.PreviousAttemptsMetadata], ","))
	s.keys = append(s.keys, strings.Join(md[keyMD], ","))
	a := s.answer(i)
	s.mu.Unlock()
	s.inflight.Add(1)
	defer s.inflight.Add(-1)
	t := time.NewTimer(a.delay)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
		s.mu.Lock()
		s.canceled = append(s.canceled, i)
		s.mu.Unlock()
		return nil, status.FromContextError(ctx.Err()).Err()
	}
	_ = grpc.SetHeader(ctx, metadata.Pairs("leg", strconv.Itoa(i)))
	_ = grpc.SetTrailer(ctx, metadata.Pairs("leg", strconv.Itoa(i)))
	if a.pushback != nil {
		_ = grpc.SetTrailer(ctx, metadata.MD{wire.PushbackMetadata: a.pushback})
	}
	if a.code != codes.OK {
		return nil, status.Error(a.code, "scripted "+a.code.String())
	}
	return &testpb.SimpleResponse{Username: "call-" + strconv.Itoa(i)}, nil
}

// StreamingOutputCall answers like UnaryCall, with one message.
func (s *legServer) StreamingOutputCall(_ *testpb.StreamingOutputCallRequest, ss testpb.TestService_StreamingOutputCallServer) error {
	r, err := s.UnaryCall(ss.Context(), nil)
	if err != nil {
		return err
	}
	return ss.Send(&testpb.StreamingOutputCallResponse{Payload: &testpb.Payload{Body: []byte(r.GetUsername())}})
}

// calls returns the attempt metadata of each call so far, joined by "|".
func (s *legServer) calls() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return strings.Join(s.prev, "|")
}

func (s *legServer) n() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.prev)
}

// canceledCalls returns the calls that saw their context end, sorted.
func (s *legServer) canceledCalls() []int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Sorted(slices.Values(s.canceled))
}

// settle lets every call end and checks that none is left in flight.
func (s *legServer) settle(t *testing.T) {
	t.Helper()
	time.Sleep(time.Minute)
	synctest.Wait()
	if n := s.inflight.Load(); n != 0 {
		t.Errorf("after the call: %d calls in flight on the server, want 0", n)
	}
}

// hedgeCall makes one unary call and returns the reply's name, the time it
// took and its error.
func hedgeCall(ctx context.Context, c testpb.TestServiceClient) (string, time.Duration, error) {
	start := time.Now()
	r, err := c.UnaryCall(ctx, &testpb.SimpleRequest{})
	return r.GetUsername(), time.Since(start), err
}

// withBudget supplies every target the guards g, their budget b, and
// returns the option.
func withGuards(g retry.Guards) grpcretry.Option {
	return grpcretry.WithGuards(func(string) (retry.Guards, error) { return g, nil })
}

func newBudget(t *testing.T) *budget.Budget {
	t.Helper()
	b, err := budget.New(budget.Config{})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestHedgeWinsAtDelay(t *testing.T) {
	tests := []struct {
		name         string
		max          int
		answer       func(int) legAnswer
		wantReply    string
		wantTook     time.Duration
		wantCalls    string // attempt metadata of each call the server got
		wantCanceled []int  // the calls the server saw canceled
	}{
		{"hedge at 50ms answers in 10ms", 1, delays(time.Second, 10*time.Millisecond), "call-1", 60 * time.Millisecond, "|1", []int{0}},
		{"attempt answers before the delay", 1, delays(10*time.Millisecond, time.Millisecond), "call-0", 10 * time.Millisecond, "", nil},
		{"attempt wins against its hedge", 1, delays(80*time.Millisecond, time.Second), "call-0", 80 * time.Millisecond, "|1", []int{1}},
		{"second hedge wins", 2, delays(time.Second, time.Second, 20*time.Millisecond), "call-2", 120 * time.Millisecond, "|1|2", []int{0, 1}},
		{"failed hedge, attempt still wins", 1, func(i int) legAnswer {
			if i == 1 {
				return legAnswer{delay: time.Millisecond, code: codes.Unavailable}
			}
			return legAnswer{delay: 200 * time.Millisecond}
		}, "call-0", 200 * time.Millisecond, "|1", nil},
		{"an answer that is not OK wins", 1, func(i int) legAnswer {
			if i == 1 {
				return legAnswer{delay: 10 * time.Millisecond, code: codes.NotFound}
			}
			return legAnswer{delay: time.Second}
		}, "", 60 * time.Millisecond, "|1", []int{0}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				srv := &legServer{answer: tt.answer}
				b := newBudget(t)
				c := serveInMemory(t, srv, newClient(t, grpcretry.WithHedging(50*time.Millisecond, 0, tt.max, unaryMethod), withGuards(retry.Guards{Budget: b}))...)
				reply, took, err := hedgeCall(t.Context(), c)
				wantCode := codes.OK
				if tt.wantReply == "" {
					wantCode = codes.NotFound
				}
				if status.Code(err) != wantCode || reply != tt.wantReply || took != tt.wantTook {
					t.Errorf("UnaryCall = %q after %v, %v; want %q after %v, %v", reply, took, err, tt.wantReply, tt.wantTook, wantCode)
				}
				if got := srv.calls(); got != tt.wantCalls {
					t.Errorf("attempt metadata %q, want %q", got, tt.wantCalls)
				}
				hedges := strings.Count(tt.wantCalls, "|")
				if r := b.Stats().Retries; r != hedges {
					t.Errorf("budget withdrawals %d, want %d (one per hedge)", r, hedges)
				}
				srv.settle(t)
				if got := srv.canceledCalls(); !slices.Equal(got, tt.wantCanceled) {
					t.Errorf("the server saw calls %v canceled, want %v", got, tt.wantCanceled)
				}
			})
		})
	}
}

// refuser is a retry budget that refuses every withdrawal, counting them.
type refuser struct{ asked atomic.Int64 }

func (r *refuser) Deposit()       {}
func (r *refuser) Withdraw() bool { r.asked.Add(1); return false }

// TestHedgeHeldBack: no hedge goes for a method not declared, without a
// budget or with one that refuses, with a half-open breaker, with the
// limiter at its limit, or within 5 s of a pushback.
func TestHedgeHeldBack(t *testing.T) {
	// pushedBack makes the server's first call end in a at once; the
	// client gives up on it.
	pushedBack := func(a legAnswer) func(*testing.T, testpb.TestServiceClient, *legServer) {
		return func(t *testing.T, c testpb.TestServiceClient, srv *legServer) {
			srv.answer = func(i int) legAnswer {
				if i == 0 {
					return a
				}
				return delays(time.Second, 10*time.Millisecond)(i - 1)
			}
			ctx, cancel := context.WithTimeout(t.Context(), 10*time.Millisecond)
			defer cancel()
			if _, _, err := hedgeCall(ctx, c); err == nil {
				t.Fatal("the pushed back call succeeded")
			}
			time.Sleep(4 * time.Second) // within the 5 s hold
		}
	}
	tests := []struct {
		name  string
		opts  func(t *testing.T) []grpcretry.Option
		setup func(t *testing.T, c testpb.TestServiceClient, srv *legServer)
	}{
		{"method not declared", func(*testing.T) []grpcretry.Option {
			return []grpcretry.Option{grpcretry.WithHedging(50*time.Millisecond, 0, 1, "/other.Service/Get")}
		}, nil},
		{"no budget", func(*testing.T) []grpcretry.Option { return []grpcretry.Option{grpcretry.WithBudget(nil)} }, nil},
		{"a nil *budget.Budget supplied", func(*testing.T) []grpcretry.Option {
			var none *budget.Budget
			return []grpcretry.Option{withGuards(retry.Guards{Budget: none})}
		}, nil},
		{"budget refuses", func(t *testing.T) []grpcretry.Option {
			r := &refuser{}
			t.Cleanup(func() {
				if r.asked.Load() != 1 {
					t.Errorf("budget asked %d times, want 1", r.asked.Load())
				}
			})
			return []grpcretry.Option{withGuards(retry.Guards{Budget: r})}
		}, nil},
		{"breaker half-open", func(t *testing.T) []grpcretry.Option {
			return []grpcretry.Option{grpcretry.WithBreaker(&breaker.Config{MinCalls: 1, OpenFor: time.Second, MaxOpenFor: time.Second})}
		}, func(t *testing.T, c testpb.TestServiceClient, srv *legServer) {
			// One UNAVAILABLE trips it; two seconds later it is half-open.
			pushedBack(legAnswer{delay: time.Millisecond, code: codes.Unavailable})(t, c, srv)
		}},
		{"limiter at its limit", func(*testing.T) []grpcretry.Option {
			return []grpcretry.Option{grpcretry.WithLimit(&limit.Config{Max: 1})}
		}, nil},
		{"RESOURCE_EXHAUSTED", nil, pushedBack(legAnswer{delay: time.Millisecond, code: codes.ResourceExhausted})},
		{"UNAVAILABLE with a pushback", nil, pushedBack(legAnswer{delay: time.Millisecond, code: codes.Unavailable, pushback: []string{"2000"}})},
		{"a don't-retry pushback", nil, pushedBack(legAnswer{delay: time.Millisecond, code: codes.Unavailable, pushback: []string{"-1"}})},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				srv := &legServer{answer: delays(time.Second, 10*time.Millisecond)}
				opts := []grpcretry.Option{grpcretry.WithHedging(50*time.Millisecond, 0, 1, unaryMethod), grpcretry.WithIdempotentMethods(unaryMethod)}
				if tt.opts != nil {
					opts = append(opts, tt.opts(t)...)
				}
				c := serveInMemory(t, srv, newClient(t, opts...)...)
				before := 0
				if tt.setup != nil {
					tt.setup(t, c, srv)
					before = srv.n()
				}
				reply, took, err := hedgeCall(t.Context(), c)
				if err != nil || took != time.Second || srv.n()-before != 1 {
					t.Errorf("UnaryCall = %q after %v, %v, %d server calls; want the attempt's answer after 1s, no hedge", reply, took, err, srv.n()-before)
				}
				srv.settle(t)
			})
		})
	}
}

// TestHedgeAfterPushbackHold: 5 s after a pushback, hedges go again; an
// UNAVAILABLE without a hint holds nothing back.
func TestHedgeAfterPushbackHold(t *testing.T) {
	for _, tt := range []struct {
		name string
		a    legAnswer
		wait time.Duration
	}{
		{"5s after RESOURCE_EXHAUSTED", legAnswer{delay: time.Millisecond, code: codes.ResourceExhausted}, 5 * time.Second},
		{"UNAVAILABLE without a hint", legAnswer{delay: time.Millisecond, code: codes.Unavailable}, 0},
	} {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				srv := &legServer{answer: func(i int) legAnswer {
					if i == 0 {
						return tt.a
					}
					return delays(time.Second, 10*time.Millisecond)(i - 1)
				}}
				c := serveInMemory(t, srv, newClient(t, grpcretry.WithHedging(50*time.Millisecond, 0, 1, unaryMethod),
					grpcretry.WithRetry(retry.WithMaxAttempts(1)))...)
				_, _, _ = hedgeCall(t.Context(), c)
				time.Sleep(tt.wait)
				if reply, took, err := hedgeCall(t.Context(), c); err != nil || reply != "call-2" || took != 60*time.Millisecond {
					t.Errorf("UnaryCall = %q after %v, %v; want the hedge's answer after 60ms", reply, took, err)
				}
				srv.settle(t)
			})
		})
	}
}

// TestHedgeLearnedDelay: with delay 0 no hedge goes until 20 answers are
// known; then the hedge goes at their p95 (here all 10ms: within a
// bucket, 12.5%).
func TestHedgeLearnedDelay(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := &legServer{answer: delays(10 * time.Millisecond)}
		c := serveInMemory(t, srv, newClient(t, grpcretry.WithHedging(0, 0.95, 1, unaryMethod))...)
		for range 19 {
			hedgeCall(t.Context(), c)
		}
		n := srv.n()
		srv.mu.Lock()
		srv.answer = delays(time.Second)
		srv.mu.Unlock()
		// 19 samples: no hedge. This answer is the 20th.
		if _, took, _ := hedgeCall(t.Context(), c); took != time.Second || srv.n() != n+1 {
			t.Fatalf("with 19 samples: took %v, %d server calls; want 1s, no hedge", took, srv.n()-n)
		}
		time.Sleep(100 * time.Millisecond) // the cached quantile refreshes
		n = srv.n()
		srv.mu.Lock()
		srv.answer = func(i int) legAnswer {
			if i == n {
				return legAnswer{delay: time.Second}
			}
			return legAnswer{delay: 10 * time.Millisecond}
		}
		srv.mu.Unlock()
		reply, took, err := hedgeCall(t.Context(), c)
		if err != nil || srv.n() != n+2 || took < 20*time.Millisecond || took > 22*time.Millisecond || reply != "call-"+strconv.Itoa(n+1) {
			t.Errorf("slow attempt with 20 samples: %q after %v with %d server calls, %v; want the hedge's, sent at about 10ms, answering 10ms later", reply, took, srv.n()-n, err)
		}
		srv.settle(t)
	})
}

// TestHedgeNumbersAndKey: a race that fails on every copy is retried, the
// retry numbered after the hedge; every copy carries the call's one
// idempotency key.
func TestHedgeNumbersAndKey(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := &legServer{answer: func(i int) legAnswer {
			switch i {
			case 0:
				return legAnswer{delay: 100 * time.Millisecond, code: codes.Unavailable}
			case 1:
				return legAnswer{delay: 10 * time.Millisecond, code: codes.Unavailable}
			}
			return legAnswer{delay: 10 * time.Millisecond}
		}}
		c := serveInMemory(t, srv, newClient(t, grpcretry.WithHedging(50*time.Millisecond, 0, 1, unaryMethod),
			grpcretry.WithAutoIdempotencyKey(), grpcretry.WithRetry(retry.WithBackoff(noJitter(0))))...)
		reply, _, err := hedgeCall(t.Context(), c)
		if err != nil || reply != "call-2" {
			t.Errorf("UnaryCall = %q, %v; want the retry's answer", reply, err)
		}
		if got := srv.calls(); got != "|1|2" {
			t.Errorf("attempt metadata %q, want %q (the retry numbered after the hedge)", got, "|1|2")
		}
		srv.mu.Lock()
		keys := slices.Clone(srv.keys)
		srv.mu.Unlock()
		if len(keys) != 3 || keys[0] == "" || keys[1] != keys[0] || keys[2] != keys[0] {
			t.Errorf("idempotency keys %q, want one key on every copy", keys)
		}
		srv.settle(t)
	})
}

// TestHedgeNotForStreams: a server-streaming call of a declared method is
// never hedged.
func TestHedgeNotForStreams(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := &legServer{answer: delays(time.Second, 10*time.Millisecond)}
		c := serveInMemory(t, srv, newClient(t, grpcretry.WithHedging(50*time.Millisecond, 0, 1, unaryMethod, outMethod))...)
		st, err := c.StreamingOutputCall(t.Context(), &testpb.StreamingOutputCallRequest{})
		if err != nil {
			t.Fatal(err)
		}
		if m, err := st.Recv(); err != nil || string(m.GetPayload().GetBody()) != "call-0" || srv.n() != 1 {
			t.Errorf("stream = %v, %v after %d server calls; want call-0 alone", m, err, srv.n())
		}
		srv.settle(t)
	})
}

// TestHedgeCallerCancels: the caller's cancel ends every copy, the server
// seeing each canceled.
func TestHedgeCallerCancels(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := &legServer{answer: delays(time.Hour)}
		c := serveInMemory(t, srv, newClient(t, grpcretry.WithHedging(50*time.Millisecond, 0, 2, unaryMethod), grpcretry.WithIdempotentMethods(unaryMethod))...)
		ctx, cancel := context.WithCancel(t.Context())
		time.AfterFunc(120*time.Millisecond, cancel)
		_, took, err := hedgeCall(ctx, c)
		if !errors.Is(err, context.Canceled) || status.Code(err) != codes.Canceled || took != 120*time.Millisecond || srv.n() != 3 {
			t.Errorf("canceled call = %v after %v with %d server calls; want canceled after 120ms, 3 calls", err, took, srv.n())
		}
		srv.settle(t)
		if got := srv.canceledCalls(); !slices.Equal(got, []int{0, 1, 2}) {
			t.Errorf("the server saw calls %v canceled, want all three", got)
		}
	})
}

func TestHedgeObserved(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var mu sync.Mutex
		var got []string
		obs := observe.Func(func(ctx context.Context, e observe.Event) {
			if e.Kind == observe.AttemptStart || e.Kind == observe.AttemptEnd {
				mu.Lock()
				got = append(got, string(e.Kind)+" "+strconv.Itoa(e.Attempt)+" "+strconv.FormatBool(e.Hedge)+" "+e.Outcome)
				mu.Unlock()
			}
		})
		srv := &legServer{answer: delays(100*time.Millisecond, time.Second)}
		c := serveInMemory(t, srv, newClient(t, grpcretry.WithHedging(50*time.Millisecond, 0, 1, unaryMethod), grpcretry.WithObserver(obs))...)
		hedgeCall(t.Context(), c)
		srv.settle(t)
		// The loser's end and the race's run on different goroutines: in
		// either order.
		mu.Lock()
		slices.Sort(got)
		s := strings.Join(got, "|")
		mu.Unlock()
		want := "attempt-end 1 false success|attempt-end 2 true canceled|attempt-start 1 false |attempt-start 2 true "
		if s != want {
			t.Errorf("events\n%s\nwant\n%s", s, want)
		}
	})
}

// TestHedgeWinnerAfterFailedFirstObserved: the first copy fails at
// 100 ms, the hedge sent at 50 ms answers OK at 150 ms and is the call's
// answer: the observer hears it end "success", not "canceled" (the
// outcome of a hedge that lost the race; it once was, since the first
// copy had answered).
func TestHedgeWinnerAfterFailedFirstObserved(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var mu sync.Mutex
		var got []string
		obs := observe.Func(func(ctx context.Context, e observe.Event) {
			if e.Kind == observe.AttemptEnd && e.Hedge {
				mu.Lock()
				got = append(got, e.Outcome)
				mu.Unlock()
			}
		})
		srv := &legServer{answer: func(i int) legAnswer {
			if i == 0 {
				return legAnswer{delay: 100 * time.Millisecond, code: codes.Internal}
			}
			return legAnswer{delay: 100 * time.Millisecond}
		}}
		c := serveInMemory(t, srv, newClient(t, grpcretry.WithHedging(50*time.Millisecond, 0, 1, unaryMethod), grpcretry.WithObserver(obs))...)
		if _, _, err := hedgeCall(t.Context(), c); err != nil {
			t.Fatalf("call: %v, want the hedge's OK", err)
		}
		srv.settle(t)
		mu.Lock()
		defer mu.Unlock()
		if !slices.Equal(got, []string{"success"}) {
			t.Errorf("the winning hedge's end: %v, want [success]", got)
		}
	})
}

// TestHedgeWinnerIsTheObservedSuccess: two hedges answer OK 10 ms apart
// while the first copy is in flight, and the observer is slow to hear the
// first hedge's end (until it has heard the second's, as an exporter may
// be). The caller's reply is the one the observer heard end "success",
// not the one it heard as a "canceled" loser (the second, whose end
// reached the race first, was the answer before).
func TestHedgeWinnerIsTheObservedSuccess(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var mu sync.Mutex
		ends := map[int]string{}
		heard3 := make(chan struct{})
		obs := observe.Func(func(ctx context.Context, e observe.Event) {
			if e.Kind != observe.AttemptEnd || !e.Hedge {
				return
			}
			if e.Attempt == 2 {
				select {
				case <-heard3:
				case <-time.After(time.Second):
				}
			}
			mu.Lock()
			ends[e.Attempt] = e.Outcome
			mu.Unlock()
			if e.Attempt == 3 {
				close(heard3)
			}
		})
		// Call 0 (the first copy) answers at 10 s; call 1, sent at 50 ms,
		// at 120 ms; call 2, sent at 100 ms, at 130 ms.
		srv := &legServer{answer: delays(10*time.Second, 70*time.Millisecond, 30*time.Millisecond)}
		c := serveInMemory(t, srv, newClient(t, grpcretry.WithHedging(50*time.Millisecond, 0, 2, unaryMethod), grpcretry.WithObserver(obs))...)
		name, _, err := hedgeCall(t.Context(), c)
		if err != nil {
			t.Fatalf("call: %v", err)
		}
		srv.settle(t)
		mu.Lock()
		defer mu.Unlock()
		var success []string
		for a, out := range ends {
			if out == "success" {
				success = append(success, "call-"+strconv.Itoa(a-1))
			}
		}
		if len(success) != 1 || success[0] != name {
			t.Errorf("the reply is %q, the observer heard success for %v (ends %v)", name, success, ends)
		}
	})
}

func TestWithHedgingBadValues(t *testing.T) {
	for _, o := range []grpcretry.Option{
		grpcretry.WithHedging(-time.Second, 0, 1, unaryMethod),
		grpcretry.WithHedging(0, 1, 1, unaryMethod),
		grpcretry.WithHedging(0, -0.5, 1, unaryMethod),
		grpcretry.WithHedging(0, 0, 9, unaryMethod),
		grpcretry.WithHedging(0, 0, -1, unaryMethod),
		grpcretry.WithHedging(0, 0, 1),
		grpcretry.WithHedging(0, 0, 1, "Get"),
		grpcretry.WithHedging(0, 0, 1, unaryMethod, ""),
		grpcretry.WithHedging(0, 0, 1, "/"),
		grpcretry.WithHedging(0, 0, 1, "//"),
		grpcretry.WithHedging(0, 0, 1, "/grpc.testing.TestService/"),
		grpcretry.WithHedging(0, 0, 1, "/UnaryCall"),
		grpcretry.WithHedging(0, 0, 1, "/a/b/c"),
		grpcretry.WithHedging(0, 0, 1, unaryMethod+"/"),
	} {
		if _, err := grpcretry.DialOptions(o); err == nil || !strings.Contains(err.Error(), "hedg") {
			t.Errorf("DialOptions with a bad hedging option = %v, want an error naming hedging", err)
		}
	}
}

// TestHedgeConcurrent: many callers racing at once through one client
// leave nothing in flight, and hedges stay within the budget.
func TestHedgeConcurrent(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := &legServer{answer: func(i int) legAnswer {
			switch i % 10 {
			case 0:
				return legAnswer{delay: time.Second}
			case 7:
				return legAnswer{delay: 30 * time.Millisecond, code: codes.Unavailable}
			}
			return legAnswer{delay: time.Duration(i%7+1) * 10 * time.Millisecond}
		}}
		b := newBudget(t)
		c := serveInMemory(t, srv, newClient(t, grpcretry.WithHedging(0, 0.9, 2, unaryMethod), grpcretry.WithIdempotentMethods(unaryMethod),
			withGuards(retry.Guards{Budget: b}), grpcretry.WithRetry(retry.WithBackoff(noJitter(0))))...)
		var wg sync.WaitGroup
		var failed, other atomic.Int64
		for g := range 20 {
			wg.Go(func() {
				for range 25 {
					if _, _, err := hedgeCall(t.Context(), c); err != nil {
						failed.Add(1)
						// Every tenth server call fails: a call may meet
						// three, or the budget spent on hedges.
						if !errors.Is(err, retry.BudgetExhausted) && !errors.Is(err, retry.AttemptsExhausted) {
							other.Add(1)
							t.Errorf("a call failed for another reason than the budget or its attempts: %v", err)
						}
					}
					time.Sleep(time.Duration(g) * time.Millisecond)
				}
			})
		}
		wg.Wait()
		st := b.Stats()
		if float64(st.Retries) > st.Limit {
			t.Errorf("budget: %d retries and hedges over a limit of %.1f", st.Retries, st.Limit)
		}
		if srv.n() <= 500 || other.Load() != 0 {
			t.Errorf("%d server calls for 500 calls, %d failed for another reason; want some hedges or retries, no such failure", srv.n(), other.Load())
		}
		t.Logf("500 calls: %d server calls, %d failed (budget or attempts exhausted), budget %+v", srv.n(), failed.Load(), st)
		srv.settle(t)
	})
}

// TestHedgeTakesALimiterSlot: with room under the limit a hedge goes, and
// every slot comes back (the limiter admits a full limit afterwards).
func TestHedgeTakesALimiterSlot(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		lim, err := limit.New(limit.Config{Max: 2})
		if err != nil {
			t.Fatal(err)
		}
		srv := &legServer{answer: delays(time.Second, 10*time.Millisecond)}
		c := serveInMemory(t, srv, newClient(t, grpcretry.WithHedging(50*time.Millisecond, 0, 1, unaryMethod),
			withGuards(retry.Guards{Budget: newBudget(t), Limiter: lim}))...)
		if reply, took, err := hedgeCall(t.Context(), c); err != nil || reply != "call-1" || took != 60*time.Millisecond {
			t.Errorf("UnaryCall = %q after %v, %v; want the hedge's answer after 60ms", reply, took, err)
		}
		srv.settle(t)
		var ps []limit.Permit
		for range lim.Limit() {
			p, err := lim.Acquire(context.Background())
			if err != nil {
				t.Fatalf("after the race the limiter refuses a slot within its limit %d: %v", lim.Limit(), err)
			}
			ps = append(ps, p)
		}
		for _, p := range ps {
			lim.Release(p, false)
		}
	})
}

// TestHedgeCallOptions: the caller's header, trailer and peer options are
// not shared by copies in flight together; they get the winner's.
func TestHedgeCallOptions(t *testing.T) {
	for _, tt := range []struct {
		name string
		ds   []time.Duration
		want string
	}{
		{"hedge wins", []time.Duration{time.Second, 10 * time.Millisecond}, "1"},
		{"first copy wins", []time.Duration{60 * time.Millisecond, time.Second}, "0"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				srv := &legServer{answer: delays(tt.ds...)}
				c := serveInMemory(t, srv, newClient(t, grpcretry.WithHedging(50*time.Millisecond, 0, 1, unaryMethod))...)
				var header, trailer metadata.MD
				var p peer.Peer
				_, err := c.UnaryCall(t.Context(), &testpb.SimpleRequest{}, grpc.Header(&header), grpc.Trailer(&trailer), grpc.Peer(&p))
				if err != nil || srv.n() != 2 {
					t.Fatalf("UnaryCall = %v after %d server calls; want success after a hedge", err, srv.n())
				}
				if h, tr := strings.Join(header["leg"], ","), strings.Join(trailer["leg"], ","); h != tt.want || tr != tt.want || p.Addr == nil {
					t.Errorf("header %q, trailer %q, peer %v; want the winner's, %q, and a peer", h, tr, p.Addr, tt.want)
				}
				srv.settle(t)
			})
		})
	}
}

// TestHedgeHeldBackWhenInflated: once the target's recent median latency
// is over 3 times its baseline, no hedge goes (a tail caused by overload
// is not helped by more load).
func TestHedgeHeldBackWhenInflated(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := &legServer{answer: delays(10 * time.Millisecond)}
		c := serveInMemory(t, srv, newClient(t, grpcretry.WithHedging(200*time.Millisecond, 0, 1, unaryMethod))...)
		set := func(f func(int) legAnswer) {
			srv.mu.Lock()
			srv.answer = f
			srv.mu.Unlock()
		}
		for range 20 { // the baseline: 10ms
			hedgeCall(t.Context(), c)
		}
		time.Sleep(10 * time.Second) // the window ends
		set(delays(50 * time.Millisecond))
		for range 32 { // the latest 32 answers: 50ms, 5 times the baseline
			hedgeCall(t.Context(), c)
		}
		time.Sleep(100 * time.Millisecond) // the cached reads refresh
		n := srv.n()
		set(func(i int) legAnswer {
			if i == n {
				return legAnswer{delay: time.Second}
			}
			return legAnswer{delay: 10 * time.Millisecond}
		})
		if _, took, err := hedgeCall(t.Context(), c); err != nil || took != time.Second || srv.n() != n+1 {
			t.Errorf("UnaryCall with latency 5 times the baseline = %v after %v, %d server calls; want the attempt's answer after 1s, no hedge", err, took, srv.n()-n)
		}
		srv.settle(t)
	})
}

// TestHedgeLoserIsNoDrop: a hedge that loses the race is released to the
// target's limiter as no drop, also when its cancellation lands after the
// caller has gone (the caller cancels its context as it returns); on the
// code before, each such loser counted as a drop and cut the limit.
func TestHedgeLoserIsNoDrop(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		lim, err := limit.New(limit.Config{Max: 100})
		if err != nil {
			t.Fatal(err)
		}
		srv := &legServer{}
		srv.answer = func(i int) legAnswer { // called with srv.mu held
			if srv.prev[i] != "" { // a hedge: it would answer after the first copy
				return legAnswer{delay: time.Second}
			}
			return legAnswer{delay: 60 * time.Millisecond}
		}
		// A canceled copy's invoker returns a millisecond late, as a
		// connection's goodbye takes a moment: after the caller has gone.
		slow := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
			err := invoker(ctx, method, req, reply, cc, opts...)
			if status.Code(err) == codes.Canceled {
				time.Sleep(time.Millisecond)
			}
			return err
		}
		c := serveInMemory(t, srv, append(newClient(t, grpcretry.WithHedging(50*time.Millisecond, 0, 1, unaryMethod),
			withGuards(retry.Guards{Budget: newBudget(t), Limiter: lim})), grpc.WithChainUnaryInterceptor(slow))...)
		for i := range 40 {
			ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
			_, took, err := hedgeCall(ctx, c)
			cancel()
			if err != nil || took != 60*time.Millisecond {
				t.Fatalf("call %d after %v, %v; want the first copy's answer after 60ms", i, took, err)
			}
			time.Sleep(10 * time.Millisecond) // the hedge's cancellation lands
		}
		if got := lim.Limit(); got < 10 {
			t.Errorf("after 40 races whose hedges lost, the limit is %d, below the cold limit of 10: losers counted as drops", got)
		}
		srv.mu.Lock()
		calls := len(srv.prev)
		srv.mu.Unlock()
		if calls < 45 {
			t.Errorf("%d calls reached the server, want at least 45: 40 first copies and 5 hedges (the due-share bound's floor)", calls)
		}
		srv.settle(t)
	})
}
