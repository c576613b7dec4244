package admission_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"

	"github.com/stormguard/stormguard/admission"
	"github.com/stormguard/stormguard/wire"
)

// A provider puts the middleware in front of its handlers. Here the window
// holds 20 originals, so with the default ratio (10%) and floor (1 retry
// per second over 10 s) it admits 0.1·20 + 10 = 12 retries; the other
// retries are refused before the handler runs, with 503, a jittered
// Retry-After and the don't-retry signal.
func ExampleController_Wrap() {
	ctl, err := admission.New(admission.Config{
		MaxInFlight: 100,
		Rand:        func() float64 { return 0.5 }, // pins the jitter: 1 s + 0.5·10 s
	})
	if err != nil {
		panic(err)
	}
	handled := 0
	h := ctl.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		handled++
		fmt.Fprintln(w, "paid")
	}))

	send := func(attempt string) *httptest.ResponseRecorder {
		r := httptest.NewRequest(http.MethodPost, "/pay", nil)
		if attempt != "" {
			r.Header.Set(wire.AttemptHeader, attempt)
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w
	}
	for range 20 {
		send("") // originals carry no attempt header
	}
	var last *httptest.ResponseRecorder
	for range 15 {
		last = send("2")
	}
	fmt.Println("handled:", handled)
	fmt.Println("last retry:", last.Code, "Retry-After:", last.Header().Get("Retry-After"),
		"Stormguard-Retry:", last.Header().Get("Stormguard-Retry"))
	s := ctl.Stats()
	fmt.Printf("originals %d, retries %d, refused %d\n", s.Originals, s.Retries, s.Outcomes[admission.RetryRefused])
	// Output:
	// handled: 32
	// last retry: 503 Retry-After: 6 Stormguard-Retry: no
	// originals 20, retries 15, refused 3
}

// The protocol-neutral core: Acquire returns a Permit to release when the
// request is done, or a Decision saying why not, when to come back and
// whether to tell the client not to retry.
func ExampleController_Acquire() {
	ctl, err := admission.New(admission.Config{
		MaxInFlight: 1,
		MaxQueue:    -1, // no queue: shed as soon as the slot is taken
		Rand:        func() float64 { return 0.25 },
	})
	if err != nil {
		panic(err)
	}
	ctx := context.Background()

	p, d := ctl.Acquire(ctx, 1)
	fmt.Println("first:", d.Outcome)

	_, d = ctl.Acquire(ctx, 1)
	fmt.Println("second:", d.Outcome, "retry after", d.RetryAfter, "don't retry:", d.DontRetry)

	_, d = ctl.Acquire(ctx, 2) // a retry that meets a full server is told to stop
	fmt.Println("a retry:", d.Outcome, "don't retry:", d.DontRetry)

	p.Release()
	p, d = ctl.Acquire(ctx, 1)
	fmt.Println("after release:", d.Outcome)
	p.Release()
	// Output:
	// first: admitted
	// second: queue-full retry after 3.5s don't retry: false
	// a retry: queue-full don't retry: true
	// after release: admitted
}
