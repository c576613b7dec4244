// Black-box attacks with extreme and hostile values: pushback trailers
// (negative, huge, junk, several values), option values at their edges,
// and the idempotency interceptor's pushback at its edge.

package grpcretry_test

import (
	"context"
	"errors"
	"math"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	testpb "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/stormguard/stormguard/backoff"
	"github.com/stormguard/stormguard/grpcretry"
	"github.com/stormguard/stormguard/idempotency"
	"github.com/stormguard/stormguard/retry"
	"github.com/stormguard/stormguard/wire"
)

const ex2Year = 365 * 24 * time.Hour

// ex2ZeroJitter is a backoff whose random source returns 0: "a source that
// returns 0 sleeps the hint exactly" (package documentation).
func ex2ZeroJitter(t *testing.T) *backoff.Backoff {
	b, err := backoff.New(backoff.Config{Strategy: backoff.NoJitter, Base: time.Millisecond, Cap: time.Millisecond,
		Rand: func() float64 { return 0 }})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// Package doc, Delays and server hints: "A server hint is a floor on the
// next wait ... a source that returns 0 sleeps the hint exactly. A hint
// past the call's deadline, or above the maximum (retry.WithMaxRetryAfter,
// 1 minute by default), ends the call at once". retry.WithMaxRetryAfter
// accepts up to 150 years ("A d above 150 years counts as 150 years"), and
// "A hint is a floor: the loop never retries sooner than the server
// asked". A 50-year hint under a 100-year maximum, on a call without a
// deadline, must be slept in full.
func TestAttackExtremes2HintBeyond35YearsIsAFloor(t *testing.T) {
	const hint = 50 * ex2Year
	cases := map[string]answer{
		"pushback":  fail(codes.Unavailable).push(strconv.FormatInt(int64(hint/time.Millisecond), 10)),
		"retryinfo": fail(codes.Unavailable).info(hint),
	}
	for name, a := range cases {
		t.Run(name, func(t *testing.T) {
			srv := &testServer{script: []answer{a, ok()}}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			tl := newTimeline()
			tl.onRetry = cancel // the planned sleep is what counts: end the call there
			c := serveInMemory(t, srv, newClient(t, grpcretry.WithIdempotentMethods(unaryMethod),
				grpcretry.WithObserver(tl), grpcretry.WithBudget(nil), grpcretry.WithBreaker(nil),
				grpcretry.WithRetry(retry.WithMaxRetryAfter(100*ex2Year), retry.WithBackoff(ex2ZeroJitter(t))))...)
			_, err := c.UnaryCall(ctx, &testpb.SimpleRequest{})
			d := tl.Sleeps()
			if len(d) != 1 {
				t.Fatalf("retries %v, err %v: want one retry planned after the hint", d, err)
			}
			if d[0] < hint {
				t.Errorf("a %v hint (%.1f years) under a maximum of 100 years: the retry was planned after %v (%.1f years), before the server's floor",
					hint, hint.Hours()/24/365, d[0], d[0].Hours()/24/365)
			}
		})
	}
}

// Package doc: "A negative or malformed pushback, or several pushback
// values, mean "do not retry": the call stops with that answer, as
// grpc-go's own retry reads it (strconv.Atoi: a sign is read, a space or a
// number beyond 64 bits is malformed)". RESOURCE_EXHAUSTED is retried only
// with a pushback >= 0; UNAVAILABLE always unless told to stop.
func TestAttackExtremes2PushbackValues(t *testing.T) {
	type tc struct {
		values []string
		retry  bool // a second attempt is made
	}
	zeros := strings.Repeat("0", 100)
	cases := map[string]tc{
		"zero":          {[]string{"0"}, true},
		"minus zero":    {[]string{"-0"}, true},
		"plus zero":     {[]string{"+0"}, true},
		"plus one":      {[]string{"+1"}, true},
		"leading zeros": {[]string{zeros + "1"}, true},
		"minus one":     {[]string{"-1"}, false},
		"min int64":     {[]string{"-9223372036854775808"}, false},
		"max+1":         {[]string{"9223372036854775808"}, false},
		"20 nines":      {[]string{"99999999999999999999"}, false},
		"empty":         {[]string{""}, false},
		"sign only":     {[]string{"+"}, false},
		"minus only":    {[]string{"-"}, false},
		"space before":  {[]string{" 1"}, false},
		"space after":   {[]string{"1 "}, false},
		"tab":           {[]string{"1\t"}, false},
		"underscore":    {[]string{"1_0"}, false},
		"hex":           {[]string{"0x10"}, false},
		"exp":           {[]string{"1e3"}, false},
		"float":         {[]string{"1.5"}, false},
		"double sign":   {[]string{"--1"}, false},
		"plus minus":    {[]string{"+-1"}, false},
		"arabic digit":  {[]string{"\u0663"}, false},
		"fullwidth":     {[]string{"\uff11"}, false},
		"two same":      {[]string{"0", "0"}, false},
		"two mixed":     {[]string{"0", "-1"}, false},
		"many":          {strings.Split(strings.Repeat("0,", 100)[:199], ","), false},
	}
	for name, c := range cases {
		for _, code := range []codes.Code{codes.Unavailable, codes.ResourceExhausted} {
			t.Run(name+"/"+code.String(), func(t *testing.T) {
				srv := &testServer{script: []answer{fail(code).push(c.values...), ok()}}
				cl := serveInMemory(t, srv, newClient(t, grpcretry.WithIdempotentMethods(unaryMethod),
					grpcretry.WithRetry(retry.WithBackoff(quick())))...)
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				_, err := cl.UnaryCall(ctx, &testpb.SimpleRequest{})
				calls := srv.Calls()
				if c.retry {
					if err != nil || calls != 2 {
						t.Fatalf("pushback %q: %d calls, err %v; want a retry that succeeds", c.values, calls, err)
					}
					return
				}
				if calls != 1 || status.Code(err) != code {
					t.Fatalf("pushback %q: %d calls, err %v; want the one answer, not retried", c.values, calls, err)
				}
			})
		}
	}
}

// A hint at the very top of the range (the largest 64-bit number of
// milliseconds): "above the maximum ... ends the call at once (Reason
// retry.Deadline)", never a sleep, never an overflow into a short wait.
func TestAttackExtremes2PushbackMaxInt64EndsAtOnce(t *testing.T) {
	for _, v := range []string{"9223372036854775807", "+9223372036854775807", "0009223372036854775807", "1099511627776", "1099511627777"} {
		t.Run(v, func(t *testing.T) {
			srv := &testServer{script: []answer{fail(codes.Unavailable).push(v), ok()}}
			tl := newTimeline()
			cl := serveInMemory(t, srv, newClient(t, grpcretry.WithIdempotentMethods(unaryMethod), grpcretry.WithObserver(tl),
				grpcretry.WithRetry(retry.WithBackoff(quick())))...)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			start := time.Now()
			_, err := cl.UnaryCall(ctx, &testpb.SimpleRequest{})
			if el := time.Since(start); el > 5*time.Second {
				t.Fatalf("took %v", el)
			}
			if srv.Calls() != 1 || !errors.Is(err, retry.Deadline) || status.Code(err) != codes.Unavailable {
				t.Fatalf("%d calls, err %v; want one attempt, Reason Deadline, UNAVAILABLE", srv.Calls(), err)
			}
			if s := tl.Sleeps(); len(s) != 0 {
				t.Fatalf("sleeps %v", s)
			}
		})
	}
}

// RetryInfo at its extremes: the largest valid google.protobuf.Duration
// (315576000000 s) ends the call at once with Reason Deadline; a negative
// or invalid one is ignored (the call is retried as plain UNAVAILABLE).
func TestAttackExtremes2RetryInfoExtremes(t *testing.T) {
	cases := map[string]struct {
		d     *durationpb.Duration
		retry bool
	}{
		"max valid":    {&durationpb.Duration{Seconds: 315576000000, Nanos: 999999999}, false},
		"invalid huge": {&durationpb.Duration{Seconds: math.MaxInt64}, true},
		"negative":     {&durationpb.Duration{Seconds: -1}, true},
		"mixed signs":  {&durationpb.Duration{Seconds: 1, Nanos: -1}, true},
		"nanos only":   {&durationpb.Duration{Nanos: 1}, true},
		"nil delay":    {nil, true},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			srv := &testServer{script: []answer{fail(codes.Unavailable), ok()}}
			srv.handler = func(ctx context.Context, n int) error {
				if n > 0 {
					return nil
				}
				st, _ := status.New(codes.Unavailable, "hinted").WithDetails(&errdetails.RetryInfo{RetryDelay: c.d})
				return st.Err()
			}
			cl := serveInMemory(t, srv, newClient(t, grpcretry.WithIdempotentMethods(unaryMethod),
				grpcretry.WithRetry(retry.WithBackoff(quick())))...)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_, err := cl.UnaryCall(ctx, &testpb.SimpleRequest{})
			if c.retry {
				if err != nil || srv.Calls() != 2 {
					t.Fatalf("%d calls, err %v: want a retry", srv.Calls(), err)
				}
				return
			}
			if srv.Calls() != 1 || !errors.Is(err, retry.Deadline) {
				t.Fatalf("%d calls, err %v: want one attempt, Reason Deadline", srv.Calls(), err)
			}
		})
	}
}

// WithKeyPushback: "the client waits at least d before its next attempt.
// d must be positive". The largest positive d must go on the wire as a
// pushback of at least d (or the largest the wire holds), never as a
// negative number, which reads as "do not retry" (a different answer:
// the layer below said stop).
func TestAttackExtremes2KeyPushbackHugeIsNotDontRetry(t *testing.T) {
	for _, d := range []time.Duration{math.MaxInt64, math.MaxInt64 - 1, math.MaxInt64 - time.Millisecond/2, 1<<63 - 1 - 999_998} {
		t.Run(strconv.FormatInt(int64(d), 10), func(t *testing.T) {
			mem, err := idempotency.NewMemoryStore(idempotency.MemoryConfig{})
			if err != nil {
				t.Fatal(err)
			}
			g, err := idempotency.NewGuard(mem)
			if err != nil {
				t.Fatal(err)
			}
			ic, err := grpcretry.IdempotencyUnaryServerInterceptor(g, sharedKeyScope, grpcretry.WithKeyPushback(d))
			if err != nil {
				t.Fatalf("a positive d refused: %v", err)
			}
			release := make(chan struct{})
			entered := make(chan struct{}, 1)
			handler := func(ctx context.Context, req any) (any, error) {
				entered <- struct{}{}
				<-release
				return &testpb.SimpleResponse{}, nil
			}
			info := &grpc.UnaryServerInfo{FullMethod: unaryMethod}
			key := idempotency.NewKey()
			ctx := metadata.NewIncomingContext(context.Background(), metadata.Pairs(keyMD, key))
			var wg sync.WaitGroup
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, _ = ic(ctx, &testpb.SimpleRequest{}, info, handler)
			}()
			<-entered
			// The second call with the key: ABORTED with the pushback. Its
			// trailer goes through a fake server stream.
			ss := &ex2ServerStream{}
			ctx2 := grpc.NewContextWithServerTransportStream(metadata.NewIncomingContext(context.Background(), metadata.Pairs(keyMD, key)), ss)
			_, err = ic(ctx2, &testpb.SimpleRequest{}, info, handler)
			close(release)
			wg.Wait()
			if status.Code(err) != codes.Aborted {
				t.Fatalf("second call: %v, want ABORTED", err)
			}
			vs := ss.trailer()[wire.PushbackMetadata]
			if len(vs) != 1 {
				t.Fatalf("trailer %v", ss.trailer())
			}
			ms, perr := strconv.ParseInt(vs[0], 10, 64)
			if perr != nil || ms < 0 || time.Duration(ms) < d/time.Millisecond {
				t.Errorf("WithKeyPushback(%v): the trailer says %s: %q, a don't-retry pushback (negative) instead of a wait of at least %d ms",
					d, wire.PushbackMetadata, vs[0], int64(d/time.Millisecond))
			}
		})
	}
}

// ex2ServerStream is a grpc.ServerTransportStream that records the trailer.
type ex2ServerStream struct {
	mu sync.Mutex
	md metadata.MD
}

func (s *ex2ServerStream) Method() string               { return unaryMethod }
func (s *ex2ServerStream) SetHeader(metadata.MD) error  { return nil }
func (s *ex2ServerStream) SendHeader(metadata.MD) error { return nil }
func (s *ex2ServerStream) SetTrailer(md metadata.MD) error {
	s.mu.Lock()
	s.md = metadata.Join(s.md, md)
	s.mu.Unlock()
	return nil
}
func (s *ex2ServerStream) trailer() metadata.MD {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.md.Copy()
}

// Option values at their edges: errors where the docs say so, never a
// panic; accepted values work.
func TestAttackExtremes2OptionEdges(t *testing.T) {
	bad := map[string]grpcretry.Option{
		"hedge q 1":         grpcretry.WithHedging(0, 1, 1, unaryMethod),
		"hedge q -tiny":     grpcretry.WithHedging(0, -math.SmallestNonzeroFloat64, 1, unaryMethod),
		"hedge q NaN":       grpcretry.WithHedging(0, math.NaN(), 1, unaryMethod),
		"hedge q +Inf":      grpcretry.WithHedging(0, math.Inf(1), 1, unaryMethod),
		"hedge max 9":       grpcretry.WithHedging(time.Millisecond, 0.5, 9, unaryMethod),
		"hedge max -1":      grpcretry.WithHedging(time.Millisecond, 0.5, -1, unaryMethod),
		"hedge max minint":  grpcretry.WithHedging(time.Millisecond, 0.5, math.MinInt, unaryMethod),
		"hedge delay -1":    grpcretry.WithHedging(-1, 0.5, 1, unaryMethod),
		"hedge no method":   grpcretry.WithHedging(time.Millisecond, 0.5, 1),
		"hedge empty":       grpcretry.WithHedging(time.Millisecond, 0.5, 1, ""),
		"hedge slash":       grpcretry.WithHedging(time.Millisecond, 0.5, 1, "/"),
		"hedge 2 slashes":   grpcretry.WithHedging(time.Millisecond, 0.5, 1, "//"),
		"hedge no method2":  grpcretry.WithHedging(time.Millisecond, 0.5, 1, "/a/"),
		"hedge 3 parts":     grpcretry.WithHedging(time.Millisecond, 0.5, 1, "/a/b/c"),
		"hedge no lead":     grpcretry.WithHedging(time.Millisecond, 0.5, 1, "a/b"),
		"idem empty":        grpcretry.WithIdempotentMethods(""),
		"idem slash":        grpcretry.WithIdempotentMethods("/"),
		"idem 3 parts":      grpcretry.WithIdempotentMethods("/a/b/c"),
		"attempt timeout<0": grpcretry.WithAttemptTimeout(math.MinInt64),
		"buffer 0":          grpcretry.WithBufferMessages(0),
		"buffer minint":     grpcretry.WithBufferMessages(math.MinInt),
		"nil guards":        grpcretry.WithGuards(nil),
	}
	for name, o := range bad {
		t.Run("bad/"+name, func(t *testing.T) {
			defer func() {
				if r := recover(); r != nil {
					t.Fatalf("panic: %v", r)
				}
			}()
			if opts, err := grpcretry.DialOptions(o); err == nil || opts != nil {
				t.Fatalf("accepted: %v %v", opts, err)
			}
		})
	}
	good := map[string]grpcretry.Option{
		"hedge q just below 1": grpcretry.WithHedging(0, math.Nextafter(1, 0), 8, unaryMethod),
		"hedge q tiny":         grpcretry.WithHedging(0, math.SmallestNonzeroFloat64, 8, unaryMethod),
		"hedge delay max":      grpcretry.WithHedging(math.MaxInt64, 0.5, 8, unaryMethod),
		"hedge delay 1ns":      grpcretry.WithHedging(1, 0.5, 8, unaryMethod),
		"idem unicode":         grpcretry.WithIdempotentMethods("/ü.S/é"),
		"attempt timeout max":  grpcretry.WithAttemptTimeout(math.MaxInt64),
		"buffer maxint":        grpcretry.WithBufferMessages(math.MaxInt),
	}
	for name, o := range good {
		t.Run("good/"+name, func(t *testing.T) {
			srv := &testServer{script: []answer{fail(codes.Unavailable), ok()}}
			cl := serveInMemory(t, srv, newClient(t, grpcretry.WithIdempotentMethods(unaryMethod),
				grpcretry.WithRetry(retry.WithBackoff(quick())), o)...)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if _, err := cl.UnaryCall(ctx, &testpb.SimpleRequest{}); err != nil {
				t.Fatalf("%v (%d calls)", err, srv.Calls())
			}
			if srv.Calls() < 2 {
				t.Fatalf("%d calls", srv.Calls())
			}
		})
	}
}

// WithAttemptTimeout(1ns): every attempt is cut by its own timeout, which
// "while the call still has time, is retried like UNAVAILABLE": the call
// ends AttemptsExhausted after the 3 default attempts, DEADLINE_EXCEEDED,
// quickly, and never hangs.
func TestAttackExtremes2AttemptTimeoutOneNanosecond(t *testing.T) {
	srv := &testServer{}
	cl := serveInMemory(t, srv, newClient(t, grpcretry.WithIdempotentMethods(unaryMethod), grpcretry.WithAttemptTimeout(1),
		grpcretry.WithBudget(nil), grpcretry.WithRetry(retry.WithBackoff(quick())))...)
	for range 5 {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		start := time.Now()
		_, err := cl.UnaryCall(ctx, &testpb.SimpleRequest{})
		cancel()
		if el := time.Since(start); el > 5*time.Second {
			t.Fatalf("took %v", el)
		}
		if status.Code(err) != codes.DeadlineExceeded || !errors.Is(err, retry.AttemptsExhausted) {
			t.Fatalf("err %v: want DEADLINE_EXCEEDED after the attempts ran out", err)
		}
	}
}
