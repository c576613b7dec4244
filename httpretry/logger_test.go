package httpretry_test

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stormguard/stormguard/httpretry"
)

// syncBuffer is a bytes.Buffer safe for the logger's concurrent writes.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestLogger: one Warn per breaker state change, with the host; the
// per-call records at Debug, with the host too.
func TestLogger(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv, endOutage := outage(t)
		var buf syncBuffer
		logger := slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
		tr, _ := newTransport(t, srv.Client().Transport, httpretry.WithLogger(logger), httpretry.WithBreaker(tripFast()))
		_, _ = getClose(t, tr, srv.URL) // 503: trips the breaker
		endOutage()
		time.Sleep(time.Hour)
		for range 3 {
			_, _ = getClose(t, tr, srv.URL) // the probes: close the breaker
		}

		type record struct {
			Level, Msg, Host, From, To string
		}
		var warns []record
		debugs := map[string]int{}
		for _, line := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
			var r record
			if err := json.Unmarshal([]byte(line), &r); err != nil {
				t.Fatalf("log line %q: %v", line, err)
			}
			if r.Host != hostOf(t, srv.URL) {
				t.Errorf("record %q has host %q, want %q", line, r.Host, hostOf(t, srv.URL))
			}
			switch r.Level {
			case "WARN":
				warns = append(warns, r)
			case "DEBUG":
				debugs[r.Msg]++
			default:
				t.Errorf("record at %s: %s", r.Level, line)
			}
		}
		msg := "httpretry: circuit breaker state change"
		want := []record{
			{"WARN", msg, hostOf(t, srv.URL), "closed", "open"},
			{"WARN", msg, hostOf(t, srv.URL), "open", "half-open"},
			{"WARN", msg, hostOf(t, srv.URL), "half-open", "closed"},
		}
		if !slices.Equal(warns, want) {
			t.Errorf("Warn records = %+v, want one per state change: %+v", warns, want)
		}
		if debugs["retry: giving up"] != 1 {
			t.Errorf("Debug records = %v, want the one give-up", debugs)
		}
	})
}
