package httpretry_test

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"

	"github.com/stormguard/stormguard/httpretry"
	"github.com/stormguard/stormguard/observe"
)

// TestBasePanicEndsAttemptAndCall: a base RoundTripper that panics, on the
// first attempt or on a retry after a 503, has its attempt and the call
// reported as ended (AttemptEnd "failure", GiveUp "panic") to the
// transport's observer, with a logger too, and the panic leaves RoundTrip
// with its value. Before, the events stopped at AttemptStart.
func TestBasePanicEndsAttemptAndCall(t *testing.T) {
	for _, tt := range []struct {
		name    string
		panicAt int
		logger  bool
	}{
		{"first attempt", 1, false},
		{"on a retry", 2, false},
		{"with a logger", 2, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var log eventLog
			opts := []httpretry.Option{httpretry.WithObserver(&log)}
			if tt.logger {
				opts = append(opts, httpretry.WithLogger(slog.New(slog.NewTextHandler(io.Discard, &slog.HandlerOptions{Level: slog.LevelDebug}))))
			}
			n := 0
			base := roundTripperFunc(func(r *http.Request) (*http.Response, error) {
				if n++; n == tt.panicAt {
					panic(http.ErrAbortHandler)
				}
				return &http.Response{StatusCode: 503, Body: io.NopCloser(strings.NewReader("busy")), Request: r}, nil
			})
			tr, _ := newTransport(t, base, opts...)
			got := func() (v any) {
				defer func() { v = recover() }()
				_, _ = tr.RoundTrip(newRequest(t, context.Background(), "GET", "http://payments.test/", nil))
				return nil
			}()
			if got != http.ErrAbortHandler {
				t.Fatalf("RoundTrip panicked with %v, want the base's http.ErrAbortHandler", got)
			}
			events := log.take()
			if len(events) < 3 {
				t.Fatalf("events %q, want the attempt's end and the give-up last", events)
			}
			msg := "retry: operation panicked: net/http: abort Handler"
			want := []string{
				ev(observe.Event{Kind: observe.AttemptEnd, Name: "payments.test", Attempt: tt.panicAt, Outcome: "failure", Err: errText(msg)}),
				ev(observe.Event{Kind: observe.GiveUp, Name: "payments.test", Attempt: tt.panicAt, Reason: "panic", Err: errText(msg)}),
			}
			last := events[len(events)-2:]
			// The attempt's elapsed time is real: leave it out.
			last[0] = dropElapsed(last[0])
			if last[0] != dropElapsed(want[0]) || last[1] != want[1] {
				t.Errorf("last events\n%s\n%s\nwant\n%s\n%s", last[0], last[1], dropElapsed(want[0]), want[1])
			}
		})
	}
}

type errText string

func (e errText) Error() string { return string(e) }

// dropElapsed removes the elapsed field of an eventLog line.
func dropElapsed(s string) string {
	i := strings.Index(s, " elapsed=")
	j := strings.Index(s, " reason=")
	if i < 0 || j < i {
		return s
	}
	return s[:i] + s[j:]
}
