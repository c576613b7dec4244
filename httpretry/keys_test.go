package httpretry_test

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stormguard/stormguard/httpretry"
	"github.com/stormguard/stormguard/idempotency"
	"github.com/stormguard/stormguard/retry"
)

// TestEmptyKeyIsNoKey: an Idempotency-Key or X-Idempotency-Key field that
// is empty or blank is not a key: a POST carrying one is not retried. A
// non-empty one in either field is.
func TestEmptyKeyIsNoKey(t *testing.T) {
	tests := []struct {
		name     string
		header   http.Header
		attempts int
	}{
		{"empty Idempotency-Key", http.Header{"Idempotency-Key": {""}}, 1},
		{"blank Idempotency-Key", http.Header{"Idempotency-Key": {" \t "}}, 1},
		{"empty X-Idempotency-Key", http.Header{"X-Idempotency-Key": {""}}, 1},
		{"blank X-Idempotency-Key", http.Header{"X-Idempotency-Key": {"  "}}, 1},
		{"both blank", http.Header{"Idempotency-Key": {" "}, "X-Idempotency-Key": {" "}}, 1},
		{"Idempotency-Key", http.Header{"Idempotency-Key": {"k-1"}}, 3},
		{"X-Idempotency-Key", http.Header{"X-Idempotency-Key": {"k-1"}}, 3},
		{"blank Idempotency-Key, X- set", http.Header{"Idempotency-Key": {" "}, "X-Idempotency-Key": {"k-1"}}, 3},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv, obs := serve(t, func(w http.ResponseWriter, r *http.Request, n int) { w.WriteHeader(503) })
			tr, _ := newTransport(t, srv.Client().Transport)
			req := newRequest(t, context.Background(), "POST", srv.URL, strings.NewReader("body"))
			for k, v := range tt.header {
				req.Header[k] = v
			}
			resp, err := tr.RoundTrip(req)
			if err != nil {
				t.Fatalf("RoundTrip: %v", err)
			}
			readClose(t, resp)
			if obs.count() != tt.attempts {
				t.Errorf("POST with %v: %d attempts, want %d", tt.header, obs.count(), tt.attempts)
			}
			want := "attempts-exhausted"
			if tt.attempts == 1 {
				want = "not-retryable"
			}
			if g, _ := gaveUp(resp); g.Reason != want {
				t.Errorf("GaveUp reason = %v, want %v", g.Reason, want)
			}
		})
	}
	t.Run("auto key replaces a blank one", func(t *testing.T) {
		srv, obs := serve(t, failThenOK(1))
		tr, _ := newTransport(t, srv.Client().Transport, httpretry.WithAutoIdempotencyKey())
		req := newRequest(t, context.Background(), "POST", srv.URL, strings.NewReader("body"))
		req.Header.Set("Idempotency-Key", " ")
		resp, err := tr.RoundTrip(req)
		if err != nil {
			t.Fatalf("RoundTrip: %v", err)
		}
		readClose(t, resp)
		_, keys, _ := obs.snapshot()
		if len(keys) != 2 || keys[0] == "" || keys[0] != keys[1] || keys[0] != httpretry.IdempotencyKey(resp, nil) {
			t.Errorf("keys sent %q, Key = %q; want one generated key on both attempts", keys, httpretry.IdempotencyKey(resp, nil))
		}
	})
}

// TestInProgress409 retries a 409 that carries a Retry-After for a request
// with a key (its first request is still running), after the Retry-After;
// a 409 without Retry-After, or for a request without a key, is the
// caller's business.
func TestInProgress409(t *testing.T) {
	tests := []struct {
		name       string
		opts       []httpretry.Option
		method     string
		key        string
		retryAfter string
		attempts   int
	}{
		{"keyed POST, Retry-After", nil, "POST", "k-1", "3", 2},
		{"keyed POST, Retry-After as a date", nil, "POST", "k-1", "date", 2},
		{"auto-keyed POST, Retry-After", []httpretry.Option{httpretry.WithAutoIdempotencyKey()}, "POST", "", "3", 2},
		{"keyed PUT, Retry-After", nil, "PUT", "k-1", "3", 2},
		{"keyed GET, Retry-After", nil, "GET", "k-1", "3", 2},
		{"blank-keyed GET, Retry-After", nil, "GET", " ", "3", 1},
		{"keyed POST, no Retry-After", nil, "POST", "k-1", "", 1},
		// A Retry-After that does not parse is ignored, as if absent
		// (ParseRetryAfter): the 409 is then the caller's.
		{"keyed POST, unreadable Retry-After", nil, "POST", "k-1", "soon", 1},
		{"keyed POST, empty Retry-After", nil, "POST", "k-1", "empty", 1},
		{"unkeyed POST, Retry-After", nil, "POST", "", "3", 1},
		{"unkeyed GET, Retry-After", nil, "GET", "", "3", 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				srv, obs := serveMem(t, func(w http.ResponseWriter, r *http.Request, n int) {
					if n > 1 {
						w.WriteHeader(http.StatusCreated)
						return
					}
					switch tt.retryAfter {
					case "":
					case "empty":
						w.Header()["Retry-After"] = []string{""}
					case "date":
						w.Header().Set("Retry-After", time.Now().Add(3*time.Second).Format(http.TimeFormat))
					default:
						w.Header().Set("Retry-After", tt.retryAfter)
					}
					http.Error(w, "in progress", http.StatusConflict)
				})
				tr, clock := newTransport(t, srv.Client().Transport, tt.opts...)
				req := newRequest(t, context.Background(), tt.method, srv.URL, strings.NewReader("body"))
				if tt.key != "" {
					req.Header.Set(idempotency.Header, tt.key)
				}
				resp, err := tr.RoundTrip(req)
				if err != nil {
					t.Fatalf("RoundTrip: %v", err)
				}
				readClose(t, resp)
				sleeps := clock.Sleeps()
				if obs.count() != tt.attempts {
					t.Fatalf("%d attempts (sleeps %v), want %d", obs.count(), sleeps, tt.attempts)
				}
				if tt.attempts == 1 {
					if resp.StatusCode != http.StatusConflict || len(sleeps) != 0 {
						t.Errorf("RoundTrip = %d after sleeps %v, want the 409 at once", resp.StatusCode, sleeps)
					}
					return
				}
				if resp.StatusCode != http.StatusCreated || len(sleeps) != 1 {
					t.Fatalf("RoundTrip = %d after sleeps %v, want 201 after one sleep", resp.StatusCode, sleeps)
				}
				if sleeps[0] < 3*time.Second {
					t.Errorf("slept %v before the retry, want at least the Retry-After of 3s", sleeps[0])
				}
			})
		})
	}
}

// TestIdempotencyKey reads back the key a request was sent with, from the response
// and from the error.
func TestIdempotencyKey(t *testing.T) {
	srv, obs := serve(t, func(w http.ResponseWriter, r *http.Request, n int) {})
	tr, _ := newTransport(t, srv.Client().Transport, httpretry.WithAutoIdempotencyKey())

	t.Run("auto key, from the response", func(t *testing.T) {
		resp, err := tr.RoundTrip(newRequest(t, context.Background(), "POST", srv.URL, strings.NewReader("x")))
		if err != nil {
			t.Fatal(err)
		}
		readClose(t, resp)
		_, keys, _ := obs.snapshot()
		sent := keys[len(keys)-1]
		if k := httpretry.IdempotencyKey(resp, nil); k == "" || k != sent {
			t.Errorf("Key(resp, nil) = %q, want the key sent, %q", k, sent)
		}
		if _, err := idempotency.ParseKey(sent); err != nil {
			t.Errorf("the generated key %q does not parse: %v", sent, err)
		}
	})
	t.Run("caller's keys", func(t *testing.T) {
		for _, field := range []string{"Idempotency-Key", "X-Idempotency-Key"} {
			req := newRequest(t, context.Background(), "POST", srv.URL, strings.NewReader("x"))
			req.Header.Set(field, " mine ")
			resp, err := tr.RoundTrip(req)
			if err != nil {
				t.Fatal(err)
			}
			readClose(t, resp)
			if k := httpretry.IdempotencyKey(resp, nil); k != "mine" {
				t.Errorf("Key with the caller's %s = %q, want %q", field, k, "mine")
			}
		}
	})
	t.Run("auto key, from the error", func(t *testing.T) {
		addr, refused, _ := refusedAddr(t)
		var sentKey string
		base := &recordingRT{base: refused}
		tr, _ := newTransport(t, base, httpretry.WithAutoIdempotencyKey())
		client := &http.Client{Transport: tr}
		resp, err := client.Post("http://"+addr, "text/plain", strings.NewReader("x"))
		if err == nil {
			readClose(t, resp)
			t.Fatalf("POST to a closed port succeeded")
		}
		sent := base.sent()
		if len(sent) != 3 {
			t.Errorf("%d attempts, want 3 (the key makes the POST retryable)", len(sent))
		}
		for _, r := range sent {
			if sentKey == "" {
				sentKey = r.Header.Get(idempotency.Header)
			}
			if got := r.Header.Get(idempotency.Header); got != sentKey {
				t.Errorf("attempt key %q, want %q on every attempt", got, sentKey)
			}
		}
		if k := httpretry.IdempotencyKey(nil, err); k == "" || k != sentKey {
			t.Errorf("Key(nil, %v) = %q, want the key sent, %q", err, k, sentKey)
		}
		if !errors.Is(err, retry.AttemptsExhausted) {
			t.Errorf("error %v does not say the attempts ran out", err)
		}
		var re *retry.Error
		if !errors.As(err, &re) {
			t.Errorf("error %v does not wrap a *retry.Error", err)
		}
	})
	t.Run("none", func(t *testing.T) {
		if k := httpretry.IdempotencyKey(nil, nil); k != "" {
			t.Errorf("Key(nil, nil) = %q", k)
		}
		if k := httpretry.IdempotencyKey(nil, errors.New("x")); k != "" {
			t.Errorf("Key(nil, plain error) = %q", k)
		}
		resp, err := tr.RoundTrip(newRequest(t, context.Background(), "GET", srv.URL, nil))
		if err != nil {
			t.Fatal(err)
		}
		readClose(t, resp)
		if k := httpretry.IdempotencyKey(resp, nil); k != "" {
			t.Errorf("Key of a GET = %q, want none", k)
		}
	})
}

// TestRefreshedResendOfUnsafeRequest: the resend after a 401 is part of
// the same attempt; for a request that may not be retried (a POST without
// a key), a transport failure of that resend ends the call like one of the
// first send: no further attempt.
func TestRefreshedResendOfUnsafeRequest(t *testing.T) {
	srv := countingServer(t, func(w http.ResponseWriter, r *http.Request, n int) {
		switch n {
		case 1:
			w.WriteHeader(http.StatusUnauthorized)
		case 2: // the refreshed resend: the connection drops before any answer
			conn, _, err := http.NewResponseController(w).Hijack()
			if err != nil {
				t.Errorf("Hijack: %v", err)
				return
			}
			_ = conn.Close()
		default:
			w.WriteHeader(http.StatusCreated)
		}
	})
	rec := &recordingRT{base: srv.Client().Transport}
	refresh := func(r *http.Request) (*http.Request, error) {
		r.Header.Set("Authorization", "Bearer new")
		return r, nil
	}
	tr, _ := newTransport(t, rec, httpretry.WithRefreshOn401(refresh))
	resp, err := tr.RoundTrip(newRequest(t, context.Background(), "POST", srv.URL, strings.NewReader("pay 100")))
	if err == nil {
		readClose(t, resp)
	}
	if n := len(rec.sent()); n != 2 {
		t.Errorf("unkeyed POST sent %d times (%v, %v), want 2: the first send and its refreshed resend, no retry", n, resp, err)
	}
	if !errors.Is(err, retry.NotRetryable) {
		t.Errorf("RoundTrip error = %v, want not retryable", err)
	}
}
