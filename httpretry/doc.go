// Package httpretry applies stormguard's retry rules to HTTP: a
// [Transport] (an [http.RoundTripper]) and [NewClient] that retry what is
// worth retrying, per destination host, behind a retry budget, a circuit
// breaker and a concurrency limiter, keeping retries to one layer with the
// header fields of package wire.
//
//	client, err := httpretry.NewClient(httpretry.WithTimeout(10 * time.Second))
//	...
//	resp, err := client.Get(url) // 503, 503, 200: the caller sees the 200
//
// What is retried (the rest is returned at once):
//
//	| outcome                                     | retried?                                   |
//	| ------------------------------------------- | ------------------------------------------ |
//	| timeout, reset, refused, closed connection  | yes, if the request is safe to repeat      |
//	| any other error without a response,         | yes, same condition; not the caller's      |
//	| whatever its wording (a pooled connection   | cancel, DNS "no such host", TLS            |
//	| closed under the request, an HTTP/2 stream  | certificate errors, bad URLs, a request    |
//	| reset or GOAWAY, a garbled answer)          | net/http refuses to send as it is          |
//	| 408, 429, 502, 503, 504                     | yes, same condition; Retry-After a floor   |
//	| 409 with Retry-After, for a keyed request   | yes: the key's first request still runs    |
//	| 500                                         | once, and only for an idempotent method    |
//	| 401                                         | no; optional credential refresh and resend |
//	| other 4xx, 1xx, 2xx, 3xx                    | no                                         |
//	| any response with "Stormguard-Retry: no"    | no                                         |
//
// A request is safe to repeat when its method is idempotent (GET, HEAD,
// OPTIONS, TRACE, PUT, DELETE) or it carries a non-empty Idempotency-Key (or
// X-Idempotency-Key; [WithAutoIdempotencyKey] adds one, once per request,
// reused on every attempt; [IdempotencyKey] tells the caller which), and its body can
// be sent again: a body with GetBody (as [http.NewRequest] sets for
// in-memory bodies) is replayed through it (called as soon as an attempt
// fails, the last one too: if it fails, the call ends there with that
// attempt's answer, which the breaker counts as it is: a failure response
// handed back as at any give-up, with the give-up reason not-retryable, or
// the send's error wrapped with GetBody's); a body without one is sent once,
// or buffered up to a bound with [WithBufferBodies]. A POST without a key
// gets exactly one attempt. An error the base RoundTripper returns without
// a response is taken for a failure on the way, whatever it says (and the
// host's breaker counts it); a base of the caller's that knows better
// marks its error with retry.Permanent.
//
// Delays: full-jitter backoff by default; a Retry-After on any failure the
// transport retries (408, 429, 500, 502, 503, 504 and an in-progress 409:
// not only the 429 and 503 it is defined for; a gateway's 502 that says
// when to come back is heeded too) (delay-seconds or any of the three HTTP-date forms, see
// [ParseRetryAfter]) is a floor, spread by up to half of it again so that
// clients told the same do not return in step (the spread is drawn from the
// backoff's random source: one that returns 0, given through [WithRetry],
// sleeps the hint exactly). If the wait would end past the deadline
// ([WithTimeout], or the request context's) or exceeds the maximum
// (retry.WithMaxRetryAfter, 1 minute by default), the transport gives up at
// once and returns that response.
//
// Giving up: on a retryable status the caller gets the last response with
// a nil error, so it can read the status and body; the transport marks it
// with wire.GiveUpHeader ("Stormguard-Gave-Up: attempts-exhausted;attempts=3",
// read with wire.ParseGiveUp); on a network error, or a call the breaker or the
// budget refused before any response, a [*retry.Error] that says why it
// stopped and wraps the cause. [WithStaleCache] serves instead the last good
// response to the same GET (stale-if-error, RFC 5861; marked with Age and
// Stormguard-Stale), and [WithFallback] a response of the caller's. Bodies of discarded responses are drained
// (up to 64 KiB, for at most 50 ms) and closed so their connections are
// reused; the connection pool is never closed.
//
// Each destination host (URL.Host) gets its own retry budget, circuit
// breaker and concurrency limiter (package limit; [WithBudget],
// [WithBreaker], [WithLimit], each on by default, nil for off), kept in a
// bounded table ([WithMaxHosts]); [Transport.Hosts] reads their state. A
// request that meets an open breaker waits for it when its deadline allows
// (see retry.WithGuards): nothing is sent while the breaker is open but a
// few probes. The limiter bounds the attempts in flight to the host by a
// limit it learns from the host's latency and drops (a cold one starts at
// 10 and doubles per round trip while the host keeps up); an attempt over
// it waits for a slot, earliest deadline first, requests without a
// deadline after those with one. After an outage, the requests that waited
// and the new ones go out as fast as the limiter finds the host takes
// them, not at a rate remembered from before.
//
// One layer retries: every retry carries wire.AttemptHeader
// ("Stormguard-Attempt: 2", 3, ...; a request without it is a first
// attempt; package admission reads it on the server). An attempt that the
// breaker let through to test the host (a probe, or the first send of a
// request released after waiting) also carries "Stormguard-Probe: 1"
// (wire.ProbeHeader), so that the host's admission does not refuse it as
// one retry too many; and every attempt with a deadline carries the time it
// has left, "Stormguard-Timeout-Ms: 950" (wire.TimeoutHeader: the earlier
// of the attempt timeout and the request's deadline, whole milliseconds),
// so that the host drops it rather than serve it after the caller left.
// Such an attempt is a copy of the request with its own header map (the
// caller's request is never modified). The one exception: the first
// attempt of a plain request (no [WithAttemptTimeout] nor [WithTimeout],
// no key made by the transport, no buffered body, no observer that tags
// attempts, and no attempt number or probe mark of the
// caller's under their canonical or lower-case names, as a proxy that
// forwards the fields of the request it got would send: those go as a copy
// without them, as do those under any other spelling on a copy) goes out unchanged,
// without the field, so that a request that succeeds at once costs no
// allocation; with
// [WithAttemptTimeout], as recommended, every attempt carries it. A
// response with the
// don't-retry signal ("Stormguard-Retry: no", see wire.DontRetry) is never
// retried. A shed answer's capacity hint ("Stormguard-Capacity: 40",
// wire.CapacityHeader, sent by the host's admission) caps the host's
// limiter for a while (see WithLimit). A
// handler whose own retries to a dependency stopped sends the don't-retry
// signal upward with admission.PushBack:
//
//	resp, err := client.Do(req.WithContext(r.Context()))
//	if admission.PushBack(w, resp, err) { // 503 + Stormguard-Retry: no
//		return
//	}
//
// The transport is silent unless given a logger ([WithLogger]: one Warn per
// breaker state change, per-call records at Debug) or an observer
// ([WithObserver]). Time is the system clock's, which a testing/synctest
// bubble fakes in tests.
package httpretry
