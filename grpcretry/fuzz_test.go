package grpcretry

import (
	"strconv"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/stormguard/stormguard/wire"
)

func TestParsePushback(t *testing.T) {
	tests := []struct {
		vals          []string
		after         time.Duration
		present, stop bool
	}{
		{nil, 0, false, false},
		{[]string{"0"}, 0, true, false},
		{[]string{"1500"}, 1500 * time.Millisecond, true, false},
		{[]string{" 20\t"}, 0, true, true}, // grpc-go's Atoi refuses spaces
		{[]string{"007"}, 7 * time.Millisecond, true, false},
		{[]string{"-1"}, 0, true, true},
		{[]string{"-0"}, 0, true, false},
		{[]string{"+5"}, 5 * time.Millisecond, true, false},
		{[]string{"9223372036854775807"}, maxPushback, true, false},
		{[]string{"9223372036854775808"}, 0, true, true},
		{[]string{""}, 0, true, true},
		{[]string{"1.5"}, 0, true, true},
		{[]string{"5", "5"}, 0, true, true},
		{[]string{"99999999999999999999999999"}, 0, true, true},
	}
	for _, tt := range tests {
		after, present, stop := parsePushback(tt.vals)
		if after != tt.after || present != tt.present || stop != tt.stop {
			t.Errorf("parsePushback(%q) = %v, %v, %v; want %v, %v, %v", tt.vals, after, present, stop, tt.after, tt.present, tt.stop)
		}
	}
}

// FuzzPushback: any trailer value parses to a bounded, non-negative floor
// or a stop, without panicking, as grpc-go reads it: a stop exactly when
// strconv.Atoi fails or gives a negative number, else Atoi's value.
func FuzzPushback(f *testing.F) {
	for _, s := range []string{"0", "1500", "-1", "", "abc", " 7 ", "18446744073709551616", "1e3"} {
		f.Add(s)
	}
	for _, s := range []string{"+5", "-0", " 5", "007", "9223372036854775808"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, v string) {
		after, present, stop := parsePushback([]string{v})
		if !present || after < 0 || after > maxPushback || (stop && after != 0) {
			t.Fatalf("parsePushback(%q) = %v, %v, %v", v, after, present, stop)
		}
		n, err := strconv.Atoi(v)
		if want := err != nil || n < 0; stop != want {
			t.Fatalf("parsePushback(%q) stop %v; grpc-go's reading (Atoi %d, %v) stops: %v", v, stop, n, err, want)
		}
		if !stop && after != min(time.Duration(n)*time.Millisecond, maxPushback) && int64(n) <= int64(maxPushback/time.Millisecond) {
			t.Fatalf("parsePushback(%q) = %v, want %d ms", v, after, n)
		}
		h := serverHint(metadata.MD{wire.PushbackMetadata: {v}}, nil)
		if h.stop != stop || (!stop && h.after != after) {
			t.Fatalf("serverHint(%q) = %+v, parsePushback %v %v", v, h, after, stop)
		}
	})
}

// FuzzRetryInfo: any status details, as they come over the wire, give a
// bounded, non-negative hint or none, without panicking.
func FuzzRetryInfo(f *testing.F) {
	add := func(d *durationpb.Duration) {
		st, _ := status.New(codes.Unavailable, "x").WithDetails(&errdetails.RetryInfo{RetryDelay: d})
		b, _ := proto.Marshal(st.Proto())
		f.Add(b)
	}
	add(durationpb.New(time.Second))
	add(&durationpb.Duration{Seconds: -1})
	add(&durationpb.Duration{Seconds: 1 << 62})
	add(&durationpb.Duration{Nanos: 2e9})
	garbage, _ := anypb.New(&errdetails.ErrorInfo{Reason: "r"})
	b, _ := proto.Marshal(&spb.Status{Code: 14, Details: []*anypb.Any{garbage, {TypeUrl: "type.googleapis.com/google.rpc.RetryInfo", Value: []byte{0xff}}}})
	f.Add(b)
	f.Fuzz(func(t *testing.T, data []byte) {
		var p spb.Status
		if proto.Unmarshal(data, &p) != nil {
			return
		}
		d, ok := retryInfo(status.FromProto(&p))
		if d < 0 || d > maxPushback || (!ok && d != 0) {
			t.Fatalf("retryInfo = %v, %v", d, ok)
		}
		h := serverHint(nil, status.FromProto(&p))
		if h.stop || h.set != ok || h.after != d {
			t.Fatalf("serverHint = %+v, retryInfo %v %v", h, d, ok)
		}
	})
}
