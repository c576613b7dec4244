package retry

import (
	"context"
	"errors"
	"fmt"
	"testing"
)

// TestDropped: what the loop gives back to the limiter as a drop (a
// timeout, a caller gone, a retryable failure) and what as a latency
// sample (a success, an answer of a healthy dependency).
func TestDropped(t *testing.T) {
	canceled, cancel := context.WithCancel(context.Background())
	cancel()
	tests := []struct {
		name    string
		ctx     context.Context
		err     error
		expired bool
		want    bool
	}{
		{"success", context.Background(), nil, false, false},
		{"success as the caller leaves", canceled, nil, false, false},
		{"not retryable: an answer", context.Background(), errors.New("404"), false, false},
		{"permanent retryable: overload all the same", context.Background(), Permanent(context.DeadlineExceeded), false, true},
		{"retryable: overload", context.Background(), context.DeadlineExceeded, false, true},
		{"attempt timed out", context.Background(), errors.New("cut off"), true, true},
		{"caller went away", canceled, errors.New("aborted"), false, true},
		{"wrapped retryable", context.Background(), fmt.Errorf("dial: %w", context.DeadlineExceeded), false, true},
	}
	p, err := New()
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range tests {
		if got := p.dropped(tt.ctx, tt.err, tt.expired); got != tt.want {
			t.Errorf("%s: dropped = %v, want %v", tt.name, got, tt.want)
		}
	}
}
