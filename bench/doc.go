// Package bench holds side-by-side benchmarks of stormguard against other Go
// retry and circuit-breaker libraries: cenkalti/backoff v5, avast/retry-go
// v4 and v5, sethvargo/go-retry, failsafe-go and sony/gobreaker v2. It is
// its own module so that the root module stays standard-library only.
//
// Run every comparison in one invocation:
//
//	go test -run='^$' -bench=. -benchmem -count=5
//
// Each library is set up the way its documentation recommends for reuse:
// policies, retriers and executors are built once outside the timed loop
// wherever the library allows it; where it does not (avast v4 applies its
// options per call, sethvargo's WithMaxRetries backoff is single-use,
// cenkalti's Retry builds its state per call) the benchmark says so. Every
// library runs the same operation: it returns nil, or for the one-retry
// benchmarks it fails once with a retryable error (a 503) and then returns
// nil, with a zero delay configured in each library.
//
// The package has no API; the tests check that every benchmarked setup
// does what its benchmark claims (one call, or one failure and one retry).
package bench
