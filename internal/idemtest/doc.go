// Package idemtest is an end-to-end harness for idempotent writes: it
// checks that a retrying client and the idempotency middleware ([idempotency.NewMiddleware]) together
// apply every logical operation exactly once over a network that loses
// requests and responses.
//
// [Run] starts one HTTP server per [store.Store] it is given (pass the
// same store twice, or two stores over one database, for two servers that
// share a store), each serving a payments handler that records every
// application in one shared [Ledger]. In front of the servers it puts a
// [Proxy]: a lossy loopback HTTP proxy that alternates between them and, by
// a seeded random sequence, resets the client's connection before
// forwarding some requests (the handler never sees them), resets it after
// the handler ran for others (the answer is lost) and, optionally, cuts
// answers mid-way (the server sees its client go away while it writes). A
// driver then makes many logical payments through an [http.Client] built
// with [httpretry.NewTransport] and [httpretry.WithAutoIdempotencyKey], and
// the [Result] reports the ledger's verdict: duplicates, lost payments,
// failed calls, answers or replays that differ from what the handler
// produced (the ledger records a hash of every answer), with the counts of
// every fault injected and every replay seen. [Hostile] adds the
// server-side faults: cuts, an [http.TimeoutHandler] in front of the
// middleware, slow handlers that overrun it or give up without a word,
// and a link to the store that blips when an answer is being stored
// ([Config.StoreBlipRate]).
//
// [TCPProxy] is a plain TCP proxy for the store tests, and for protocols
// other than HTTP/1 (gRPC): it blackholes a server, delays what clients
// send, cuts the reply to one chosen request, or resets and cuts
// connections at random ([TCPProxy.SetFaults]). [CompletionBlip] and
// [SlowRenewal] check, on any store, that a handler runs once when the
// store fails as its answer is stored, and when a lock renewal is slow.
//
// Every fault reaches the retrying transport under test: by default the
// harness keeps net/http from resending a failed request on its own
// ([Config.NetHTTPResend]). When the upstream servers answer every
// forwarded request (the normal case), the proxy's counts (requests,
// resets, drops) depend only on the seed and the number of payments, since
// the run ends at the Payments-th answer relayed: the figures of a run are
// reproducible.
//
// The package is standard library only (plus the stormguard packages) and
// is meant for tests: [RunTest] runs the harness and fails a test on a bad
// verdict. The store modules (idempotency/pgstore, idempotency/redisstore)
// run it against real servers.
package idemtest
