//go:build !plan9

package retry_test

import (
	"errors"
	"fmt"
	"syscall"
	"testing"

	"github.com/stormguard/stormguard/retry"
)

// TestIsRetryableErrno covers broken connections by their system error.
// (Plan 9 has no errno values; its errors are strings.)
func TestIsRetryableErrno(t *testing.T) {
	tests := []struct {
		name string
		err  error
		want bool
	}{
		{"connection reset", opErr(syscall.ECONNRESET), true},
		{"connection refused", opErr(syscall.ECONNREFUSED), true},
		{"connection aborted", opErr(syscall.ECONNABORTED), true},
		{"broken pipe", opErr(syscall.EPIPE), true},
		{"other errno", opErr(syscall.ENOENT), false},
		{"Permanent deep in chain", fmt.Errorf("x: %w", retry.Permanent(syscall.ECONNRESET)), false},
		{"joined with a reset", errors.Join(errors.New("a"), opErr(syscall.ECONNRESET)), true},
	}
	for _, tt := range tests {
		if got := retry.IsRetryable(tt.err); got != tt.want {
			t.Errorf("IsRetryable(%s: %v) = %v, want %v", tt.name, tt.err, got, tt.want)
		}
	}
}
