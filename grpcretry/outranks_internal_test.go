package grpcretry

import (
	"testing"

	"google.golang.org/grpc/metadata"

	"github.com/stormguard/stormguard/wire"
)

// A race whose copies all fail gives the loop the last failure, unless an
// earlier one carried more of the server's word: its don't-retry pushback,
// or a longer pushback (the floor of the next attempt). A later copy that
// failed without one no longer erases the server's answer.
func TestOutranks(t *testing.T) {
	pb := func(v ...string) end {
		if len(v) == 0 {
			return end{}
		}
		return end{trailer: metadata.MD{wire.PushbackMetadata: v}}
	}
	tests := []struct {
		name string
		a, b end
		want bool
	}{
		{"neither", pb(), pb(), false},
		{"earlier waits, later none", pb("2000"), pb(), true},
		{"earlier none, later waits", pb(), pb("2000"), false},
		{"earlier longer", pb("3000"), pb("1000"), true},
		{"equal", pb("1000"), pb("1000"), false},
		{"earlier stops", pb("-1"), pb("5000"), true},
		{"later stops", pb("5000"), pb("-1"), false},
		{"both stop", pb("-1"), pb("garbage"), false},
	}
	for _, tt := range tests {
		if got := outranks(tt.a, tt.b); got != tt.want {
			t.Errorf("%s: outranks = %v, want %v", tt.name, got, tt.want)
		}
	}
}
