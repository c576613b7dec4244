package httpretry_test

import (
	"bytes"
	"context"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"

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

func TestLogger(t *testing.T) {
	srv, _ := serve(t, func(w http.ResponseWriter, r *http.Request, n int) { w.WriteHeader(503) })
	var buf syncBuffer
	logger := slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
	tr, _ := newTransport(t, srv.Client().Transport, httpretry.WithLogger(logger), httpretry.WithBreaker(tripFast()))
	resp, err := tr.RoundTrip(newRequest(t, context.Background(), "GET", srv.URL, nil))
	if err != nil {
		t.Fatal(err)
	}
	readClose(t, resp)
	u, _ := url.Parse(srv.URL)
	out := buf.String()
	for _, want := range []string{
		"host=" + u.Host,
		"circuit breaker state change",
		"from=closed to=open",
		"retry: giving up",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("log lacks %q:\n%s", want, out)
		}
	}
}
