package grpcretry_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	testpb "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/stormguard/stormguard/grpcretry"
	"github.com/stormguard/stormguard/idempotency"
	"github.com/stormguard/stormguard/retry"
)

// callKind is how safe a call is to repeat.
type callKind int

const (
	plain      callKind = iota // not idempotent, no key: one attempt
	keyed                      // not idempotent, with an idempotency key
	idempotent                 // the method is declared idempotent
)

func (k callKind) String() string {
	return [...]string{"plain", "keyed", "idempotent"}[k]
}

// TestCodeTable runs every row of the code table against a live server
// that always answers with the row's code, for a call of each kind, and
// counts the attempts the server saw.
func TestCodeTable(t *testing.T) {
	const attempts = 3
	type row struct {
		name string
		a    answer
		want [3]int // attempts seen, by callKind
	}
	rows := []row{
		{"UNAVAILABLE", fail(codes.Unavailable), [3]int{1, attempts, attempts}},
		{"RESOURCE_EXHAUSTED without hint", fail(codes.ResourceExhausted), [3]int{1, 1, 1}},
		{"RESOURCE_EXHAUSTED with pushback", fail(codes.ResourceExhausted).push("5"), [3]int{1, attempts, attempts}},
		{"RESOURCE_EXHAUSTED with RetryInfo", fail(codes.ResourceExhausted).info(5 * time.Millisecond), [3]int{1, attempts, attempts}},
		{"DEADLINE_EXCEEDED from the server", fail(codes.DeadlineExceeded), [3]int{1, 1, 1}},
		{"INTERNAL", fail(codes.Internal), [3]int{1, 1, 2}},
		{"ABORTED", fail(codes.Aborted), [3]int{1, 1, attempts}},
		{"ABORTED with pushback", fail(codes.Aborted).push("5"), [3]int{1, attempts, attempts}},
		{"UNAVAILABLE with pushback -1", fail(codes.Unavailable).push("-1"), [3]int{1, 1, 1}},
		{"UNAVAILABLE with malformed pushback", fail(codes.Unavailable).push("soon"), [3]int{1, 1, 1}},
		{"UNAVAILABLE with two pushbacks", fail(codes.Unavailable).push("5", "6"), [3]int{1, 1, 1}},
		{"UNAVAILABLE with empty pushback", fail(codes.Unavailable).push(""), [3]int{1, 1, 1}},
		// grpc-go reads the value with strconv.Atoi: a space or a number
		// beyond 64 bits is malformed, a sign is not.
		{"UNAVAILABLE with a pushback in spaces", fail(codes.Unavailable).push(" 5 "), [3]int{1, 1, 1}},
		{"UNAVAILABLE with a pushback beyond 64 bits", fail(codes.Unavailable).push("99999999999999999999999"), [3]int{1, 1, 1}},
		{"UNAVAILABLE with pushback +5", fail(codes.Unavailable).push("+5"), [3]int{1, attempts, attempts}},
		{"UNAVAILABLE with pushback -0", fail(codes.Unavailable).push("-0"), [3]int{1, attempts, attempts}},
	}
	for _, c := range []codes.Code{codes.Canceled, codes.Unknown, codes.InvalidArgument, codes.NotFound,
		codes.AlreadyExists, codes.PermissionDenied, codes.FailedPrecondition, codes.OutOfRange,
		codes.Unimplemented, codes.DataLoss, codes.Unauthenticated} {
		rows = append(rows, row{c.String(), fail(c), [3]int{1, 1, 1}})
	}
	for _, r := range rows {
		for kind := plain; kind <= idempotent; kind++ {
			t.Run(r.name+"/"+kind.String(), func(t *testing.T) {
				srv := &testServer{script: []answer{r.a}}
				addr := serve(t, srv)
				opts := []grpcretry.Option{grpcretry.WithRetry(retry.WithBackoff(quick()), retry.WithMaxAttempts(attempts))}
				if kind == idempotent {
					opts = append(opts, grpcretry.WithIdempotentMethods(unaryMethod))
				}
				client := dial(t, addr, newClient(t, opts...)...)
				ctx := t.Context()
				if kind == keyed {
					ctx = metadata.AppendToOutgoingContext(ctx, idempotency.Header, "key-1")
				}
				_, err := client.UnaryCall(ctx, &testpb.SimpleRequest{})
				if got := status.Code(err); got != r.a.code {
					t.Errorf("UnaryCall: code %v (%v), want %v", got, err, r.a.code)
				}
				if got, want := srv.Calls(), r.want[kind]; got != want {
					t.Errorf("server saw %d attempts, want %d", got, want)
				}
				var e *grpcretry.Error
				var re *retry.Error
				if !errors.As(err, &e) || !errors.As(err, &re) {
					t.Fatalf("UnaryCall error %T is not a *grpcretry.Error around a *retry.Error", err)
				}
				if re.Attempts != srv.Calls() {
					t.Errorf("retry.Error.Attempts = %d, server saw %d", re.Attempts, srv.Calls())
				}
			})
		}
	}
}

// TestAttemptTimeoutRetried: a DEADLINE_EXCEEDED from the attempt's own
// timeout is retried while the call has time; the caller's own deadline
// never is.
func TestAttemptTimeoutRetried(t *testing.T) {
	hold := make(chan struct{})
	defer close(hold)
	t.Run("attempt timeout", func(t *testing.T) {
		srv := &testServer{hold: hold}
		c := newClient(t, grpcretry.WithAttemptTimeout(50*time.Millisecond), grpcretry.WithIdempotentMethods(unaryMethod),
			grpcretry.WithRetry(retry.WithBackoff(quick())))
		client := dial(t, serve(t, srv), c...)
		_, err := client.UnaryCall(t.Context(), &testpb.SimpleRequest{})
		if status.Code(err) != codes.DeadlineExceeded || !errors.Is(err, retry.AttemptsExhausted) {
			t.Errorf("UnaryCall = %v, want DEADLINE_EXCEEDED after attempts exhausted", err)
		}
		if n := srv.Calls(); n != 3 {
			t.Errorf("server saw %d attempts, want 3", n)
		}
	})
	t.Run("caller deadline", func(t *testing.T) {
		srv := &testServer{hold: hold}
		c := newClient(t, grpcretry.WithIdempotentMethods(unaryMethod), grpcretry.WithRetry(retry.WithBackoff(quick())))
		client := dial(t, serve(t, srv), c...)
		ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
		defer cancel()
		_, err := client.UnaryCall(ctx, &testpb.SimpleRequest{})
		// The server may notice the deadline a moment before the client
		// does: the call then stops as not retryable rather than at the
		// deadline, but it stops either way.
		if status.Code(err) != codes.DeadlineExceeded || !(errors.Is(err, retry.Deadline) || errors.Is(err, retry.NotRetryable)) {
			t.Errorf("UnaryCall = %v, want DEADLINE_EXCEEDED, reason deadline or not retryable", err)
		}
		if n := srv.Calls(); n != 1 {
			t.Errorf("server saw %d attempts, want 1", n)
		}
	})
}
