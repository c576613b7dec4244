package grpcretry_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	testpb "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/stormguard/stormguard/grpcretry"
	"github.com/stormguard/stormguard/idempotency"
	"github.com/stormguard/stormguard/idempotency/store"
)

// replayStore is a store that holds rec, completed, for every key: what a
// shared store holding anything at all would return.
type replayStore struct {
	store.Store
	rec store.Record
}

func (s replayStore) Begin(context.Context, store.ID, store.Fingerprint, time.Duration) (store.Result, error) {
	return store.Result{Outcome: store.Completed, Record: s.rec}, nil
}

// FuzzIdempotencyReplay: whatever record the store returns, the
// interceptor answers with a reply of the method's type or a status
// error, never panics, never runs the handler; a record of OK with a
// valid reply replays that reply.
func FuzzIdempotencyReplay(f *testing.F) {
	reply, _ := proto.Marshal(&testpb.SimpleResponse{Username: "run-1"})
	st, _ := proto.Marshal(status.New(codes.NotFound, "gone").Proto())
	f.Add(900, "header:x-charge", "ch-1", reply, false)
	f.Add(905, "trailer:x-ledger", "entry-1", st, false)
	f.Add(900, "", "", []byte(nil), true)
	f.Add(201, "Content-Type", "application/json", []byte(`{"id":1}`), false)
	f.Add(917, "header:", "", []byte{0xff, 0x01}, false)
	f.Add(905, "header:x", "y", reply, false)
	f.Fuzz(func(t *testing.T, code int, name, value string, body []byte, omitted bool) {
		rec := store.Record{Status: code, Body: body, BodyOmitted: omitted}
		if name != "" {
			rec.Header = http.Header{name: {value}}
		}
		g, err := idempotency.NewGuard(replayStore{rec: rec})
		if err != nil {
			t.Fatal(err)
		}
		ic, err := grpcretry.IdempotencyUnaryServerInterceptor(g, sharedKeyScope, grpcretry.WithReplayMetadata("x-charge", "x-ledger"))
		if err != nil {
			t.Fatal(err)
		}
		ctx := metadata.NewIncomingContext(context.Background(), metadata.Pairs(idempotency.Header, "k"))
		got, err := ic(ctx, &testpb.SimpleRequest{}, &grpc.UnaryServerInfo{FullMethod: unaryMethod}, func(context.Context, any) (any, error) {
			t.Fatal("the handler ran on a replay")
			return nil, nil
		})
		switch {
		case err == nil:
			r, ok := got.(*testpb.SimpleResponse)
			if !ok || code != 900 || omitted {
				t.Fatalf("record %+v replayed as %T %v, nil error; want a SimpleResponse only for an OK record with its reply", rec, got, got)
			}
			var want testpb.SimpleResponse
			if proto.Unmarshal(body, &want) != nil || !proto.Equal(r, &want) {
				t.Fatalf("record %+v replayed as %v", rec, r)
			}
		case got != nil:
			t.Fatalf("record %+v: reply %v with error %v", rec, got, err)
		default:
			if _, ok := status.FromError(err); !ok {
				t.Fatalf("record %+v: error %v is not a status", rec, err)
			}
		}
	})
}

// FuzzIdempotencyKeyMetadata: whatever the key metadata holds, the
// interceptor (key required) runs the handler once for a key that parses
// and answers INVALID_ARGUMENT otherwise; it never panics.
func FuzzIdempotencyKeyMetadata(f *testing.F) {
	f.Add("k", "", false)
	f.Add(`"quoted \" key"`, "", false)
	f.Add("a,b", "", false)
	f.Add("k1", "k2", true)
	f.Add("", "", false)
	f.Add("\x00", "", false)
	f.Fuzz(func(t *testing.T, v1, v2 string, two bool) {
		mem, _ := idempotency.NewMemoryStore(idempotency.MemoryConfig{})
		g, _ := idempotency.NewGuard(mem)
		ic, err := grpcretry.IdempotencyUnaryServerInterceptor(g, sharedKeyScope, grpcretry.WithKeyRequired())
		if err != nil {
			t.Fatal(err)
		}
		md := metadata.MD{keyMD: {v1}}
		if two {
			md[keyMD] = append(md[keyMD], v2)
		}
		runs := 0
		_, err = ic(metadata.NewIncomingContext(context.Background(), md), &testpb.SimpleRequest{},
			&grpc.UnaryServerInfo{FullMethod: unaryMethod}, func(context.Context, any) (any, error) {
				runs++
				return &testpb.SimpleResponse{}, nil
			})
		_, parseErr := idempotency.ParseKey(v1)
		valid := parseErr == nil && !two
		switch {
		case valid && (err != nil || runs != 1):
			t.Fatalf("key %q: %v, %d runs; want the handler run once", md[keyMD], err, runs)
		case !valid && (status.Code(err) != codes.InvalidArgument || runs != 0):
			t.Fatalf("key %q: %v, %d runs; want INVALID_ARGUMENT, no run", md[keyMD], err, runs)
		}
	})
}

// BenchmarkIdempotencyInterceptor measures the interceptor alone (called
// directly, no network) on the memory store: a new key (claim, run,
// store) and a replay, against the bare handler.
func BenchmarkIdempotencyInterceptor(b *testing.B) {
	resp := &testpb.SimpleResponse{Username: "ch_123", Payload: &testpb.Payload{Body: []byte(`{"id":"ch_123","status":"captured"}`)}}
	handler := func(context.Context, any) (any, error) { return resp, nil }
	req := &testpb.SimpleRequest{Payload: &testpb.Payload{Body: []byte(`{"amount":100,"currency":"EUR"}`)}}
	info := &grpc.UnaryServerInfo{FullMethod: unaryMethod}
	build := func(b *testing.B) grpc.UnaryServerInterceptor {
		mem, _ := idempotency.NewMemoryStore(idempotency.MemoryConfig{MaxEntries: 1 << 24, MaxBytes: 1 << 32})
		g, _ := idempotency.NewGuard(mem)
		ic, err := grpcretry.IdempotencyUnaryServerInterceptor(g, sharedKeyScope)
		if err != nil {
			b.Fatal(err)
		}
		return ic
	}
	keyed := func(n int) []context.Context {
		ctxs := make([]context.Context, n)
		for i := range ctxs {
			ctxs[i] = metadata.NewIncomingContext(context.Background(), metadata.Pairs(idempotency.Header, idempotency.NewKey()))
		}
		return ctxs
	}
	b.Run("bare", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_, _ = handler(context.Background(), req)
		}
	})
	b.Run("new", func(b *testing.B) {
		ic := build(b)
		ctxs := keyed(b.N)
		b.ReportAllocs()
		b.ResetTimer()
		for i := range b.N {
			if _, err := ic(ctxs[i], req, info, handler); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("replay", func(b *testing.B) {
		ic := build(b)
		ctx := keyed(1)[0]
		if _, err := ic(ctx, req, info, handler); err != nil {
			b.Fatal(err)
		}
		b.ReportAllocs()
		for b.Loop() {
			if _, err := ic(ctx, req, info, handler); err != nil {
				b.Fatal(err)
			}
		}
	})
}
