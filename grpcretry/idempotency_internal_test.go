package grpcretry

import (
	"slices"
	"testing"

	"google.golang.org/grpc/codes"
)

// TestDefaultStoredCode lists the codes stored by default.
func TestDefaultStoredCode(t *testing.T) {
	var stored []string
	for c := codes.OK; c <= codes.Unauthenticated; c++ {
		if defaultStoredCode(c) {
			stored = append(stored, c.String())
		}
	}
	want := []string{"OK", "InvalidArgument", "NotFound", "AlreadyExists", "PermissionDenied", "FailedPrecondition", "OutOfRange", "Unimplemented"}
	if !slices.Equal(stored, want) {
		t.Fatalf("stored codes %v, want %v", stored, want)
	}
}
