package grpcretry_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	testpb "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/stormguard/stormguard/grpcretry"
	"github.com/stormguard/stormguard/limit"
	"github.com/stormguard/stormguard/observe"
	"github.com/stormguard/stormguard/retry"
	"github.com/stormguard/stormguard/wire"
)

// hedge2Server is a legServer with an EmptyCall (a method that is not hedged)
// that answers emptyCode with the pushback trailer emptyPush.
type hedge2Server struct {
	*legServer
	emptyCode codes.Code
	emptyPush []string
	// stream: StreamingOutputCall sends streamMsgs messages, then ends
	// with emptyCode and the emptyPush trailer.
	stream     bool
	streamMsgs int
}

func (s *hedge2Server) StreamingOutputCall(req *testpb.StreamingOutputCallRequest, ss testpb.TestService_StreamingOutputCallServer) error {
	if !s.stream {
		return s.legServer.StreamingOutputCall(req, ss)
	}
	for range s.streamMsgs {
		if err := ss.Send(&testpb.StreamingOutputCallResponse{}); err != nil {
			return err
		}
	}
	if s.emptyPush != nil {
		ss.SetTrailer(metadata.MD{wire.PushbackMetadata: s.emptyPush})
	}
	if s.emptyCode != codes.OK {
		return status.Error(s.emptyCode, "scripted "+s.emptyCode.String())
	}
	return nil
}

func (s *hedge2Server) EmptyCall(ctx context.Context, _ *testpb.Empty) (*testpb.Empty, error) {
	if s.emptyPush != nil {
		_ = grpc.SetTrailer(ctx, metadata.MD{wire.PushbackMetadata: s.emptyPush})
	}
	if s.emptyCode != codes.OK {
		return nil, status.Error(s.emptyCode, "scripted "+s.emptyCode.String())
	}
	return &testpb.Empty{}, nil
}

// DOC docs/hedging.md "The first good answer wins": "A copy that fails
// while others are in flight is held; no further hedge goes in that race;
// if every copy fails, the retry loop gets the last failure and retries as
// usual." (hedge_race.go settle's comment: "or the last failure if every
// copy fails"); doc.go: "status.Code(err) is the last attempt's code".
//
// The hedge fails first (at 60ms) with an answer that is not retried; the
// first copy fails last (at 200ms) with UNAVAILABLE, which is. (A hedge's
// don't-retry pushback is the server's word, and stands whenever it came:
// TestAttackHedgeEarlierHedgeHintStands.) The last
// failure is the first copy's: the loop should retry (and the retry
// succeeds). The race hands the loop the hedge's earlier failure instead.
func TestAttackHedge2LastFailureIsTheLatest(t *testing.T) {
	for _, tt := range []struct {
		name  string
		hedge legAnswer
	}{
		{"hedge RESOURCE_EXHAUSTED without a hint", legAnswer{delay: 10 * time.Millisecond, code: codes.ResourceExhausted}},
		{"hedge DEADLINE_EXCEEDED from the server", legAnswer{delay: 10 * time.Millisecond, code: codes.DeadlineExceeded}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				srv := &legServer{answer: func(i int) legAnswer {
					switch i {
					case 0:
						return legAnswer{delay: 200 * time.Millisecond, code: codes.Unavailable}
					case 1:
						return tt.hedge
					}
					return legAnswer{delay: time.Millisecond}
				}}
				c := serveInMemory(t, srv, newClient(t, grpcretry.WithHedging(50*time.Millisecond, 0, 1, unaryMethod),
					grpcretry.WithIdempotentMethods(unaryMethod), grpcretry.WithRetry(retry.WithBackoff(noJitter(0))),
					withGuards(retry.Guards{Budget: newBudget(t)}))...)
				reply, took, err := hedgeCall(t.Context(), c)
				if err != nil || reply != "call-2" {
					t.Errorf("UnaryCall = %q after %v, %v (code %v), %d server calls %q; want the retry's answer call-2: the last failure (the first copy's UNAVAILABLE at 200ms) is retried",
						reply, took, err, status.Code(err), srv.n(), srv.calls())
				}
				srv.settle(t)
			})
		})
	}
}

// DOC doc.go: "status.Code(err) is the last attempt's code"; docs/hedging.md:
// "if every copy fails, the retry loop gets the last failure". One attempt
// allowed: the hedge fails at 60ms with RESOURCE_EXHAUSTED, the first copy
// at 200ms with UNAVAILABLE; the call's code should be UNAVAILABLE.
func TestAttackHedge2LastFailureCode(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := &legServer{answer: func(i int) legAnswer {
			if i == 0 {
				return legAnswer{delay: 200 * time.Millisecond, code: codes.Unavailable}
			}
			return legAnswer{delay: 10 * time.Millisecond, code: codes.ResourceExhausted}
		}}
		c := serveInMemory(t, srv, newClient(t, grpcretry.WithHedging(50*time.Millisecond, 0, 1, unaryMethod),
			grpcretry.WithRetry(retry.WithMaxAttempts(1)), withGuards(retry.Guards{Budget: newBudget(t)}))...)
		_, took, err := hedgeCall(t.Context(), c)
		if status.Code(err) != codes.Unavailable || took != 200*time.Millisecond {
			t.Errorf("UnaryCall = %v (code %v) after %v; want UNAVAILABLE, the last failure's code, after 200ms", err, status.Code(err), took)
		}
		srv.settle(t)
	})
}

// DOC WithHedging: no hedge while "the target has not pushed back in the
// last 5 s to any call ... (RESOURCE_EXHAUSTED, or a failure but ABORTED
// with a pushback trailer or a RetryInfo ...)"; doc.go's table: "any other
// code | no | success": a NOT_FOUND is the target's answer, not a failure
// (hedge.go good: "a code that is the target's answer rather than a
// failure to answer"). The hedged method's own NOT_FOUND with a pushback
// does not hold hedges; the same answer to another method of the target
// should not either.
func TestAttackHedge2AnswerWithPushbackHoldsHedges(t *testing.T) {
	for _, tt := range []struct {
		name   string
		via    string // "other": EmptyCall (not hedged); "same": the hedged method's first copy; "stream", "stream1": a server stream of an idempotent method, failing before / after one message; "ustream": of a method not safe to repeat
		code   codes.Code
		push   []string
		wantOK bool // a hedge should go afterwards
	}{
		{"other method NOT_FOUND pushback 2000", "other", codes.NotFound, []string{"2000"}, true},
		{"other method INVALID_ARGUMENT pushback 0", "other", codes.InvalidArgument, []string{"0"}, true},
		{"same method NOT_FOUND pushback 2000", "same", codes.NotFound, []string{"2000"}, true},
		{"other method OK pushback 2000", "other", codes.OK, []string{"2000"}, true},
		{"other method UNAVAILABLE pushback 2000 (holds)", "other", codes.Unavailable, []string{"2000"}, false},
		{"stream NOT_FOUND pushback 2000 before its first message", "stream", codes.NotFound, []string{"2000"}, true},
		{"stream NOT_FOUND pushback 2000 after a message", "stream1", codes.NotFound, []string{"2000"}, true},
		{"unguarded stream UNAVAILABLE pushback 2000", "ustream", codes.Unavailable, []string{"2000"}, true},
		{"stream UNAVAILABLE pushback 2000 before its first message (holds)", "stream", codes.Unavailable, []string{"2000"}, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				ls := &legServer{}
				srv := &hedge2Server{legServer: ls, emptyCode: tt.code, emptyPush: tt.push}
				ls.answer = func(i int) legAnswer { // called with ls.mu held
					if tt.via == "same" && i == 0 {
						return legAnswer{delay: time.Millisecond, code: tt.code, pushback: tt.push}
					}
					if ls.prev[i] != "" { // a hedge
						return legAnswer{delay: 10 * time.Millisecond}
					}
					return legAnswer{delay: time.Second}
				}
				opts := []grpcretry.Option{grpcretry.WithHedging(50*time.Millisecond, 0, 1, unaryMethod),
					grpcretry.WithRetry(retry.WithMaxAttempts(1)), withGuards(retry.Guards{Budget: newBudget(t)})}
				if strings.HasPrefix(tt.via, "stream") {
					opts = append(opts, grpcretry.WithIdempotentMethods(outMethod))
				}
				srv.stream = strings.HasSuffix(tt.via, "stream") || tt.via == "stream1"
				if tt.via == "stream1" {
					srv.streamMsgs = 1
				}
				c := serveInMemory(t, srv, newClient(t, opts...)...)
				if srv.stream {
					st, err := c.StreamingOutputCall(t.Context(), &testpb.StreamingOutputCallRequest{})
					for err == nil {
						_, err = st.Recv()
					}
					if status.Code(err) != tt.code {
						t.Fatalf("stream = %v, want %v", err, tt.code)
					}
				} else if tt.via == "other" {
					_, err := c.EmptyCall(t.Context(), &testpb.Empty{})
					if status.Code(err) != tt.code {
						t.Fatalf("EmptyCall = %v, want %v", err, tt.code)
					}
				} else {
					if _, _, err := hedgeCall(t.Context(), c); status.Code(err) != tt.code {
						t.Fatalf("first call = %v, want %v", err, tt.code)
					}
				}
				time.Sleep(time.Second) // within the 5 s hold
				n := ls.n()
				_, took, err := hedgeCall(t.Context(), c)
				hedged := ls.n()-n == 2
				if err != nil || hedged != tt.wantOK {
					t.Errorf("after a %v with pushback %q (%s): UnaryCall = %v after %v, %d server calls; want a hedge: %v",
						tt.code, tt.push, tt.via, err, took, ls.n()-n, tt.wantOK)
				}
				ls.settle(t)
			})
		})
	}
}

// DOC docs/hedging.md: "Each hedge gets its own attempt timeout from its
// own start"; WithAttemptTimeout: "An attempt that fails because its own
// timeout fired, while the call still has time, is retried like
// UNAVAILABLE"; WithHedging: "a retry after it carries the number after
// the hedges'". (Expected to pass: a probe of the boundaries.)
func TestAttackHedge2AttemptTimeoutBoundaries(t *testing.T) {
	for _, tt := range []struct {
		name      string
		timeout   time.Duration
		deadline  time.Duration // 0: none
		answer    func(int) legAnswer
		wantReply string
		wantTook  time.Duration
		wantCalls string
	}{
		// Attempt timeout == delay: the attempt ends as the hedge would
		// go: no race; the retry (after a backoff of 10ms) answers.
		{"timeout equals delay", 50 * time.Millisecond, 0, delays(time.Second, time.Millisecond), "call-1", 61 * time.Millisecond, "|1"},
		// Caller deadline == delay: no race, no retry, DEADLINE_EXCEEDED.
		{"deadline equals delay", 0, 50 * time.Millisecond, delays(time.Second), "", 50 * time.Millisecond, ""},
		// Timeout 60ms, delay 50ms: first copy cut at 60ms, hedge (sent at
		// 50ms) answers at 80ms, within its own timeout (until 110ms).
		{"first cut, hedge in own timeout", 60 * time.Millisecond, 0, delays(time.Second, 30*time.Millisecond), "call-1", 80 * time.Millisecond, "|1"},
		// Both copies cut (60ms and 110ms): the retry (wire number 3) at
		// 120ms (a backoff of 10ms) answers at 121ms.
		{"both cut, retry numbered after the hedge", 60 * time.Millisecond, 0, delays(time.Second, time.Second, time.Millisecond), "call-2", 121 * time.Millisecond, "|1|2"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				srv := &legServer{answer: tt.answer}
				opts := []grpcretry.Option{grpcretry.WithHedging(50*time.Millisecond, 0, 1, unaryMethod),
					grpcretry.WithIdempotentMethods(unaryMethod), grpcretry.WithRetry(retry.WithBackoff(noJitter(0))),
					withGuards(retry.Guards{Budget: newBudget(t)})}
				if tt.timeout > 0 {
					opts = append(opts, grpcretry.WithAttemptTimeout(tt.timeout))
				}
				c := serveInMemory(t, srv, newClient(t, opts...)...)
				ctx := t.Context()
				if tt.deadline > 0 {
					var cancel context.CancelFunc
					ctx, cancel = context.WithTimeout(ctx, tt.deadline)
					defer cancel()
				}
				reply, took, err := hedgeCall(ctx, c)
				if reply != tt.wantReply || took != tt.wantTook || srv.calls() != tt.wantCalls {
					t.Errorf("UnaryCall = %q after %v, %v; server calls %q; want %q after %v, calls %q", reply, took, err, srv.calls(), tt.wantReply, tt.wantTook, tt.wantCalls)
				}
				srv.settle(t)
			})
		})
	}
}

// DOC WithHedging: "an observer hears its own AttemptStart and AttemptEnd
// (Event.Hedge set; a canceled loser ends with Outcome "canceled")"; the
// loop's events carry the loop's number. Every AttemptStart has exactly one
// AttemptEnd with the same (Attempt, Hedge), across races, retries and a
// storm of concurrent calls; the limiter gets every slot back.
func TestAttackHedge2ObserverPairsAndSlots(t *testing.T) {
	for _, withLim := range []bool{false, true} {
		t.Run(fmt.Sprintf("limiter=%v", withLim), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				var mu sync.Mutex
				open := map[string]int{}
				var starts, ends, hedgeStarts int
				var bad []string
				obs := observe.Func(func(ctx context.Context, e observe.Event) {
					if e.Kind != observe.AttemptStart && e.Kind != observe.AttemptEnd {
						return
					}
					mu.Lock()
					defer mu.Unlock()
					if e.Kind == observe.AttemptStart {
						starts++
						if e.Hedge {
							hedgeStarts++
						}
						return
					}
					ends++
					if e.Outcome == "" {
						bad = append(bad, fmt.Sprintf("end %d hedge=%v without outcome", e.Attempt, e.Hedge))
					}
				})
				_ = open
				g := retry.Guards{Budget: newBudget(t)}
				var lim *limit.Limiter
				opts := []grpcretry.Option{grpcretry.WithHedging(50*time.Millisecond, 0.5, 3, unaryMethod),
					grpcretry.WithIdempotentMethods(unaryMethod), grpcretry.WithAttemptTimeout(400 * time.Millisecond),
					grpcretry.WithRetry(retry.WithBackoff(noJitter(0))), grpcretry.WithObserver(obs)}
				if withLim {
					var err error
					lim, err = limit.New(limit.Config{Max: 1000})
					if err != nil {
						t.Fatal(err)
					}
					g.Limiter = lim
				} else {
					opts = append(opts, grpcretry.WithLimit(nil))
				}
				opts = append(opts, withGuards(g))
				srv := &legServer{answer: func(i int) legAnswer {
					switch i % 13 {
					case 0:
						return legAnswer{delay: 300 * time.Millisecond, code: codes.Unavailable}
					case 1:
						return legAnswer{delay: 60 * time.Millisecond, code: codes.Unavailable}
					case 2, 5, 8:
						return legAnswer{delay: time.Second}
					case 3:
						return legAnswer{delay: 5 * time.Millisecond, code: codes.NotFound}
					}
					return legAnswer{delay: time.Duration(i%5+1) * 20 * time.Millisecond}
				}}
				c := serveInMemory(t, srv, newClient(t, opts...)...)
				var wg sync.WaitGroup
				for g := range 30 {
					wg.Go(func() {
						for k := range 10 {
							ctx, cancel := context.WithTimeout(t.Context(), time.Duration(200+100*((g+k)%9))*time.Millisecond)
							hedgeCall(ctx, c)
							cancel()
							time.Sleep(time.Duration(g%3) * time.Millisecond)
						}
					})
				}
				wg.Wait()
				srv.settle(t)
				mu.Lock()
				defer mu.Unlock()
				if starts != ends || len(bad) > 0 {
					t.Errorf("%d AttemptStart, %d AttemptEnd (%d hedges); want pairs; %v", starts, ends, hedgeStarts, bad)
				}
				if hedgeStarts == 0 && lim == nil { // the learned limit may fall to 1 or 2: no room for hedges
					t.Errorf("no hedge went")
				}
				if lim != nil {
					if free := glFree(lim); free != lim.Limit() {
						t.Errorf("after the storm %d slots free of %d", free, lim.Limit())
					}
					t.Logf("limit %d", lim.Limit())
				}
				t.Logf("%d server calls, %d starts, %d hedges", srv.n(), starts, hedgeStarts)
			})
		})
	}
}

// DOC WithHedging: "a longer hint holds for as long": the longer of the
// pushback and the RetryInfo (doc.go: "with both, the longer one").
// (Probe of the hold's length.)
func TestAttackHedge2PushbackHoldLength(t *testing.T) {
	for _, tt := range []struct {
		name     string
		push     []string
		info     time.Duration // 0: none
		code     codes.Code
		quietFor time.Duration // no hedge before this
	}{
		{"pushback 7000", []string{"7000"}, 0, codes.Unavailable, 7 * time.Second},
		{"pushback +7000", []string{"+7000"}, 0, codes.Unavailable, 7 * time.Second},
		{"pushback 6000, RetryInfo 8s", []string{"6000"}, 8 * time.Second, codes.Unavailable, 8 * time.Second},
		{"RESOURCE_EXHAUSTED RetryInfo 9s", nil, 9 * time.Second, codes.ResourceExhausted, 9 * time.Second},
		{"malformed pushback", []string{"7 000"}, 0, codes.Unavailable, 5 * time.Second},
		{"two values", []string{"7000", "8000"}, 0, codes.Unavailable, 5 * time.Second},
	} {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				ls := &legServer{}
				srv := &hedge2Server{legServer: ls, emptyCode: tt.code, emptyPush: tt.push}
				ls.answer = func(i int) legAnswer { // called with ls.mu held
					if ls.prev[i] != "" { // a hedge
						return legAnswer{delay: 10 * time.Millisecond}
					}
					return legAnswer{delay: time.Second}
				}
				var infoSrv *hedge2InfoServer
				var c testpb.TestServiceClient
				opts := newClient(t, grpcretry.WithHedging(50*time.Millisecond, 0, 1, unaryMethod),
					grpcretry.WithRetry(retry.WithMaxAttempts(1)), withGuards(retry.Guards{Budget: newBudget(t)}))
				if tt.info > 0 {
					infoSrv = &hedge2InfoServer{hedge2Server: srv, code: tt.code, info: tt.info}
					c = serveInMemory(t, infoSrv, opts...)
				} else {
					c = serveInMemory(t, srv, opts...)
				}
				t0 := time.Now()
				_, err := c.EmptyCall(t.Context(), &testpb.Empty{})
				if status.Code(err) != tt.code {
					t.Fatalf("EmptyCall = %v", err)
				}
				time.Sleep(tt.quietFor - 100*time.Millisecond - time.Since(t0))
				n := ls.n()
				if _, took, _ := hedgeCall(t.Context(), c); ls.n()-n != 1 {
					t.Errorf("%v after the pushback: %d server calls (took %v); want no hedge until %v", time.Since(t0), ls.n()-n, took, tt.quietFor)
				}
				time.Sleep(tt.quietFor - time.Since(t0) + 10*time.Millisecond)
				n = ls.n()
				if _, took, _ := hedgeCall(t.Context(), c); ls.n()-n != 2 {
					t.Errorf("%v after the pushback: %d server calls (took %v); want a hedge after %v", time.Since(t0), ls.n()-n, took, tt.quietFor)
				}
				ls.settle(t)
			})
		})
	}
}

// hedge2InfoServer answers EmptyCall with code, a RetryInfo of info and the
// hedge2Server's pushback trailer.
type hedge2InfoServer struct {
	*hedge2Server
	code codes.Code
	info time.Duration
}

func (s *hedge2InfoServer) EmptyCall(ctx context.Context, _ *testpb.Empty) (*testpb.Empty, error) {
	a := answer{code: s.code, retryInfo: s.info}
	if s.emptyPush != nil {
		a.pushback = s.emptyPush
	}
	return nil, a.err(ctx)
}

// DOC doc.go "One layer retries": "grpc-previous-rpc-attempts: N ...
// absent on a first attempt, and removed from a first attempt whose
// outgoing metadata carried one"; "stormguard-probe: 1" only on an attempt
// the breaker let through to test the target; WithHedging: each hedge
// "carries the next grpc-previous-rpc-attempts number"; "a retry after it
// carries the number after the hedges'". A caller whose outgoing metadata
// carries an attempt count and a probe mark from elsewhere (a proxy): the
// first copy goes without them, the hedges 1 and 2, the retry 3 and its
// hedge 4; no copy carries the probe mark. (Expected to pass.)
func TestAttackHedge2InheritedMarksOnHedges(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var mu sync.Mutex
		var probes []string
		ls := &legServer{}
		ls.answer = func(i int) legAnswer {
			switch {
			case i < 3:
				return legAnswer{delay: 200 * time.Millisecond, code: codes.Unavailable}
			case i == 3:
				return legAnswer{delay: time.Second}
			}
			return legAnswer{delay: 10 * time.Millisecond}
		}
		probe := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
			md, _ := metadata.FromOutgoingContext(ctx)
			mu.Lock()
			probes = append(probes, strings.Join(md["stormguard-probe"], ","))
			mu.Unlock()
			return invoker(ctx, method, req, reply, cc, opts...)
		}
		var lmu sync.Mutex
		var loopStarts []string
		obs := observe.Func(func(_ context.Context, e observe.Event) {
			if e.Kind == observe.AttemptStart {
				lmu.Lock()
				loopStarts = append(loopStarts, fmt.Sprintf("%d/%v", e.Attempt, e.Hedge))
				lmu.Unlock()
			}
		})
		c := serveInMemory(t, ls, append(newClient(t, grpcretry.WithHedging(50*time.Millisecond, 0, 2, unaryMethod),
			grpcretry.WithIdempotentMethods(unaryMethod), grpcretry.WithRetry(retry.WithBackoff(noJitter(0))),
			grpcretry.WithObserver(obs), withGuards(retry.Guards{Budget: newBudget(t)})), grpc.WithChainUnaryInterceptor(probe))...)
		ctx := metadata.AppendToOutgoingContext(t.Context(), wire.PreviousAttemptsMetadata, "7", "stormguard-probe", "1")
		reply, took, err := hedgeCall(ctx, c)
		ls.settle(t)
		if err != nil || reply != "call-4" {
			t.Errorf("UnaryCall = %q after %v, %v; want call-4 (the retry's hedge)", reply, took, err)
		}
		if got := ls.calls(); got != "|1|2|3|4" {
			t.Errorf("attempt metadata %q, want %q", got, "|1|2|3|4")
		}
		mu.Lock()
		if strings.Join(probes, "") != "" {
			t.Errorf("probe marks on the copies: %q, want none", probes)
		}
		mu.Unlock()
		lmu.Lock()
		t.Logf("AttemptStart events (attempt/hedge): %v", loopStarts)
		lmu.Unlock()
	})
}

// DOC doc.go "Delays and server hints": "A negative or malformed pushback,
// or several pushback values, mean "do not retry" ... (strconv.Atoi: a
// sign is read, a space or a number beyond 64 bits is malformed)"; "A hint
// ... above the maximum (retry.WithMaxRetryAfter, 1 minute by default),
// ends the call at once (Reason retry.Deadline)". End to end over gRPC.
// (Probe.)
func TestAttackHedge2PushbackValuesEndToEnd(t *testing.T) {
	for _, tt := range []struct {
		v         []string
		wantCalls int
		wantTook  time.Duration
	}{
		{[]string{"100"}, 2, 100 * time.Millisecond},
		{[]string{"+100"}, 2, 100 * time.Millisecond},
		{[]string{"-0"}, 2, 10 * time.Millisecond}, // a floor of 0: the backoff's 10ms
		{[]string{"00100"}, 2, 100 * time.Millisecond},
		{[]string{" 100"}, 1, 0},
		{[]string{"100 "}, 1, 0},
		{[]string{"1e3"}, 1, 0},
		{[]string{""}, 1, 0},
		{[]string{"-1"}, 1, 0},
		{[]string{"-100"}, 1, 0},
		{[]string{"9223372036854775808"}, 1, 0},
		{[]string{"100", "100"}, 1, 0},
		{[]string{"9223372036854775807"}, 1, 0}, // past the maximum: ends at once
		{[]string{"60001"}, 1, 0},               // past the maximum: ends at once
		{[]string{"60000"}, 2, time.Minute},
	} {
		t.Run(strings.Join(tt.v, ","), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				srv := &legServer{answer: func(i int) legAnswer {
					if i == 0 {
						return legAnswer{code: codes.Unavailable, pushback: tt.v}
					}
					return legAnswer{}
				}}
				c := serveInMemory(t, srv, newClient(t, grpcretry.WithIdempotentMethods(unaryMethod),
					grpcretry.WithRetry(retry.WithBackoff(noJitter(0))))...)
				_, took, err := hedgeCall(t.Context(), c)
				if srv.n() != tt.wantCalls || took != tt.wantTook || (tt.wantCalls == 2) != (err == nil) {
					t.Errorf("pushback %q: %d server calls after %v, %v; want %d calls after %v", tt.v, srv.n(), took, err, tt.wantCalls, tt.wantTook)
				}
				srv.settle(t)
			})
		})
	}
}

// DOC WithHedging: no hedge while the target pushed back "(RESOURCE_EXHAUSTED,
// or a failure but ABORTED with a pushback trailer or a RetryInfo, a
// don't-retry pushback included; a longer hint holds for as long ...)".
// A RESOURCE_EXHAUSTED carrying a RetryInfo of 10 s and a don't-retry
// pushback: is the RetryInfo's 10 s held? (Probe of an edge the docs leave
// open: the don't-retry pushback discards the RetryInfo.)
func TestAttackHedge2DontRetryWithLongRetryInfo(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ls := &legServer{}
		srv := &hedge2Server{legServer: ls, emptyPush: []string{"-1"}}
		ls.answer = func(i int) legAnswer { // called with ls.mu held
			if ls.prev[i] != "" {
				return legAnswer{delay: 10 * time.Millisecond}
			}
			return legAnswer{delay: time.Second}
		}
		c := serveInMemory(t, &hedge2InfoServer{hedge2Server: srv, code: codes.ResourceExhausted, info: 10 * time.Second},
			newClient(t, grpcretry.WithHedging(50*time.Millisecond, 0, 1, unaryMethod),
				grpcretry.WithRetry(retry.WithMaxAttempts(1)), withGuards(retry.Guards{Budget: newBudget(t)}))...)
		if _, err := c.EmptyCall(t.Context(), &testpb.Empty{}); status.Code(err) != codes.ResourceExhausted {
			t.Fatalf("EmptyCall = %v", err)
		}
		time.Sleep(7 * time.Second)
		n := ls.n()
		if _, took, _ := hedgeCall(t.Context(), c); ls.n()-n != 1 {
			t.Errorf("7s after a RetryInfo of 10s (with a don't-retry pushback): %d server calls (took %v); want no hedge", ls.n()-n, took)
		}
		ls.settle(t)
	})
}
