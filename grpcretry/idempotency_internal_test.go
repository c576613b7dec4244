package grpcretry

import (
	"slices"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"

	"github.com/stormguard/stormguard/idempotency"
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

// TestMetadataKeysAreHTTPNames: the key and replay metadata keys are the
// HTTP field names of package idempotency in lower case, as the docs say
// (users send and read them with idempotency.Header and ReplayHeader).
func TestMetadataKeysAreHTTPNames(t *testing.T) {
	if keyMetadata != strings.ToLower(idempotency.Header) || replayedMetadata != strings.ToLower(idempotency.ReplayHeader) {
		t.Fatalf("metadata keys %q, %q; want %q, %q", keyMetadata, replayedMetadata,
			strings.ToLower(idempotency.Header), strings.ToLower(idempotency.ReplayHeader))
	}
}
