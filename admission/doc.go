// Package admission is the provider's side of retry control: middleware for
// a server, or the gateway in front of it, that sees the retries of a whole
// fleet of clients and keeps them, and the work in progress, bounded.
//
// A client's own retry budget (package budget) binds that one client. A
// thousand low-volume clients each stay within their own floor and
// together can still send a retry for every failure. The provider is the one
// place that sees them all, so a [Controller] applies the same rule there,
// and adds a limit on work in progress:
//
//	ctl, err := admission.New(admission.Config{MaxInFlight: 100})
//	...
//	http.ListenAndServe(addr, ctl.Wrap(mux))
//
// # The model
//
// Every request is classified by its attempt number. Over HTTP that is the
// Stormguard-Attempt request header (package wire's AttemptHeader): a
// request without it, or with a value that is not a number from 1 up, is an
// original; 2 or more is a retry. Each request then goes through three
// steps, in this order:
//
//  1. The caller's deadline. A request whose caller has already left is
//     dropped at once, before anything else runs, counted as [Canceled]:
//     503 with "Stormguard-Retry: no" (the don't-retry signal of package
//     wire) when its deadline passed (an original whose caller went away
//     otherwise, its context canceled, gets the 503 without it; a retry
//     gets it as every refused retry does, see [Decision]). The deadline is the request context's (over
//     gRPC, the call's own deadline) or, over HTTP, the earliest of the
//     times the request's Stormguard-Timeout-Ms field (wire.TimeoutHeader,
//     which package httpretry sends on every attempt with a deadline) and
//     Envoy's x-envoy-expected-rq-timeout-ms say, counted from when the
//     request is read (a field sent on several lines, or as a
//     comma-separated list, says the earliest of its valid values;
//     malformed ones are ignored).
//
//  2. Retry ratio. Originals are counted in a sliding window. A retry is
//     admitted only while, over the window,
//
//     retries + 1 <= RetryRatio·originals + MinRetriesPerSecond·Window.Seconds()
//
//     (package budget's rule, on one budget for the whole fleet). A retry
//     beyond it is refused at once: HTTP 503 with the don't-retry signal
//     that package httpretry's Transport honours, so the client does not
//     retry on top. During an outage the handler then sees about
//     (1 + RetryRatio) times the originals, not the 3x that three attempts
//     each would bring.
//
//     A retry marked as a circuit breaker's probe (wire.ProbeHeader,
//     "stormguard-probe" over gRPC; packages httpretry and grpcretry mark
//     the probes their breakers send and the first send of a call released
//     after waiting) skips the ratio: it neither spends nor earns
//     allowance, so the clients that wait for this server see it back when
//     it is (see [Controller.AcquireProbe]). The bound on the mark: it
//     skips the ratio only onto an idle slot (one free at once, nobody
//     queued); otherwise the request is a retry like any other, refused
//     (with RetryAfterBase and without the don't-retry signal, so that the
//     client goes back to waiting) when the ratio does not admit it.
//
//  3. Work in progress. At most MaxInFlight requests run at once. A request
//     that finds them all busy waits in a queue of at most MaxQueue
//     requests, originals before retries (below); it runs as soon as a slot
//     frees, or is refused with 503 when the queue is full ([QueueFull]),
//     its time in the queue is over ([QueueTimeout]), or its context ends
//     or its caller's deadline comes ([Canceled]). Such a refusal carries
//     the don't-retry signal if the request was itself a retry (an original
//     may come back once, a retry that meets an overloaded server should
//     stop) or if its caller's deadline ended it.
//
// # Originals before retries
//
// The queue has two classes: originals and retries (attempt 2 or more,
// including a request whose idempotency key was seen). A freed slot goes to
// the oldest queued original, and to the oldest queued retry only while no
// original waits; a retry takes a free slot at once only when nobody is
// queued, an original when no original is. An original that finds the
// queue full takes the place of the oldest queued retry, which is refused
// ([QueueFull], with the don't-retry signal, but a marked probe's refusal
// without it: see [Controller.AcquireProbe]). Each class has its own delay
// control (next section), so retries that stand in their list waiting for
// a gap do not shorten the originals' wait. Within a class, first come
// first served.
//
// Why: after a trigger (an outage, a hang, a slowdown) ends, the payments
// started during it are still being resent by their clients until their
// deadline, and most clients (every one not built on stormguard) send no
// attempt header, no deadline and ignore the don't-retry signal. With one
// first-come-first-served queue, the retries the ratio admits fill the
// capacity the originals leave (10% at 90% load), the queue stands, and
// its delay control sheds new originals; their payments' resends are then
// retries too, competing with the backlog's thousands for the same
// allowance, and the server stays in that state until the backlog's
// deadlines pass and longer (the resends of the new payments it shed
// sustain it). TestNaiveClientsRecover shows it in a synctest bubble: 450
// payments a second on 500/s of capacity, cut to 100/s for 10 s. With
// clients resending every second for 20 s, the payments started 2 to 19 s
// after the cut succeed at 75-99% a second with one queue, at 100% with
// originals first (and the key table below); with go-retryablehttp's
// policy (4 retries, Retry-After honoured), at 86-97% and 96-100% (with
// the key table's memory of a Retry-After, below). Originals first
// costs the backlog nothing it could have had: it is served from the
// capacity the originals leave, as before; and nothing on the admitted
// path, which does not queue. What it does not do: it cannot tell an
// unkeyed client's resend from an original (see "What a lying client
// can and cannot do").
//
// # The queue holds no more than its callers wait for
//
// A queue absorbs bursts; a queue that stands only delays every request by
// its length, and under overload fills with work for callers who have
// left. Three rules keep it short:
//
//   - Delay control, CoDel-style (Nichols and Jacobson 2012, with the
//     action of Facebook's "Fail at Scale", 2015), per class: a request
//     that joins its class's list when, within the last MaxQueueWait/5
//     (the interval), it has been empty or given a slot to a request that
//     waited no longer than MaxQueueWait/100 (the target) may wait up to
//     MaxQueueWait: the list is absorbing a burst. One that joins a list
//     whose requests all waited longer than the target for a whole
//     interval (a standing queue) waits at most 25 turns, a turn being
//     the mean time between two slots the queue hands over, but no less
//     than the target and no more than the interval, and is then shed.
//     With the default 500 ms: 500 ms, or 5 to 100 ms under a standing
//     queue (50 ms for 10 slots of 20 ms). The turns matter: a server
//     near its capacity runs with a queue of a few requests, each waiting
//     a few turns; with 5 ms under any queue that had not been empty for
//     100 ms, 0.5-4% of the originals at 90% load were shed with no
//     trigger at all, and after a trigger their resends, retries, met an
//     allowance the backlog had taken (TestNoShedAtNormalLoad, 10 slots
//     of 20 ms: none shed now). The interval still caps the wait: a server
//     whose turn is longer than a 25th of it (4 ms at the default
//     MaxQueueWait: few slots, slow requests) queues past it at 90% load
//     now and then, and sheds those requests (0.5-2.4% of the originals
//     measured with 4 slots of 50 ms, 10 of 50 ms exponential and 20 of
//     200 ms); a larger MaxQueueWait moves the cap.
//   - A request waits no longer than its caller's deadline; it is then
//     dropped ([Canceled], don't retry).
//   - A request whose caller's time left is no more than the last queued
//     request of its class waited for its slot (while requests of its
//     class still wait) is dropped on arrival: it would be served after its
//     caller left.
//
// So the handler is never started for a request whose caller's deadline,
// as the caller sent it, had passed when the request got its slot. (The
// work may still outlast that deadline: the handler's context is not given
// it. A request without a deadline is held only as long as the queue's own
// limits allow.)
//
// # An adaptive limit
//
// With Config.LatencyCeiling set (say, the clients' attempt timeout), the
// in-flight limit is learned instead of fixed: it starts at MaxInFlight,
// its ceiling, and moves between 1 and it by the time the admitted
// requests take to run (from their slot to Release):
//
//   - a request that ran for LatencyCeiling or longer is a drop, never a
//     latency sample, and so is one that ran longer than the reference
//     (below) and ended past its caller's deadline or with its context
//     ended: the limit is cut by a tenth, at most once per
//     LatencyCeiling/10 (a hang, whose requests all end as drops, lowers
//     it and never raises it);
//   - a request whose caller left but that ran within the reference is no
//     sample: it neither grows the limit nor cuts it. Its caller's time
//     went before its slot (the queue, the network, a lagging client),
//     which fewer slots only make worse: as drops, such requests cut the
//     limit, the waits grew, more callers left, and the limit fell to 1
//     and stayed there after a hang, every request it admitted being for a
//     caller who left;
//   - a request that ran longer than the reference, LatencyCeiling/2,
//     shrinks the limit by a fifth of its excess, limit·(1 - (1 -
//     ref/latency)/5); a faster one grows it by 1/√limit while the limit is
//     in use (at least half of it in flight).
//
// The reference is fixed, not learned: a learned baseline either drifts up
// to an incident's latency when it is re-learned, or, when it is not, takes
// a service that became slower for a queue and cuts its limit to a
// fraction of what it can serve. So the limit keeps the requests that run
// under half of what their callers wait, whatever their normal latency; a
// service whose requests take over LatencyCeiling/2 even alone is run one
// at a time, so set the ceiling above twice the slowest normal request. The
// capacity hint of a shed answer is the adaptive limit in force. A
// test (TestAdaptiveLimit) runs 300 callers on a provider of 10 cores
// (1000 requests/s): with a fixed limit every request takes 300 ms; with
// LatencyCeiling 200 ms they take about 70 ms, at about 950/s.
//
// # Shedding with a hint
//
// Every refusal carries a Retry-After drawn afresh for that refusal,
// RetryAfterBase + U·RetryAfterSpread with U uniform in [0, 1), so that
// clients refused in the same instant and honouring it come back spread
// over RetryAfterSpread instead of all at once. HTTP carries whole seconds
// only: the value is rounded down, at least 1 s, so the default 1 s base
// and 10 s spread send one of 1, 2, ..., 10 with equal chances.
// [Decision.RetryAfter] keeps the full resolution for protocols that carry
// milliseconds (gRPC's grpc-retry-pushback-ms). Over HTTP an answer that
// sheds a request for lack of room ([QueueFull], [QueueTimeout]) also
// carries the capacity hint "Stormguard-Capacity: <n>" (wire.CapacityHeader):
// n is the in-flight limit in force (MaxInFlight, or the adaptive limit
// when one is set), the requests this server runs at once. A client that is
// this server's only caller should keep fewer than n attempts in flight to
// it; it is a hint about capacity, not a grant.
//
// # Defaults
//
// Every zero field of a [Config] takes its default, so Config{} is valid:
//
//	MaxInFlight          1024 requests in progress (negative: no limit)
//	LatencyCeiling       none: the limit is fixed (positive: adaptive)
//	MaxQueue             as MaxInFlight (negative: no queue)
//	MaxQueueWait         500 ms (5-100 ms under a standing queue)
//	RetryRatio           0.1 retries per original (negative: 0)
//	MinRetriesPerSecond  1, so 10 retries per window (negative: 0)
//	Window               10 s, in ten 1 s slices
//	RetryAfterBase       1 s
//	RetryAfterSpread     10 s (negative: no jitter)
//
// The floor keeps a quiet service able to admit an occasional retry; at a
// provider with hundreds of requests a second the ratio dominates. A retry
// that passed the ratio but then found no slot still counts as a retry in
// the window: retries the fleet sends during overload are exactly what the
// ratio must see.
//
// # What a lying client can and cannot do
//
// The attempt header is the client's word. Over HTTP, a request with an
// idempotency key (Idempotency-Key or X-Idempotency-Key) that was last
// seen less than a Window ago, or less than the longest Retry-After the
// Controller sends plus a slice of the window if that is longer (13 s
// with the defaults; keys are remembered in whole slices of the window,
// so up to a slice longer: up to 14 s, and 66 s with a 60 s Window),
// counts as a retry whatever its attempt header says (a client that honoured a 10 s Retry-After and resends is still
// resending: with the window alone such resends passed for originals, 10%
// of the load after a trigger in TestNaiveClientsRecover's go-retryablehttp
// row), so a keyed client that sends no attempt header (every client not
// built on stormguard) or always says 1 meets the ratio with its resends,
// and queues behind the originals. The keys are kept in a fixed table of
// 16,384 slots (128 KiB per Controller) in buckets of 8 (a key may sit in
// any slot of its bucket; a new key takes the one seen longest ago): with
// 9,000 keys resending at once (450 payments a second, each resent for
// 20 s) 98% of the resends are recognised (TestKeyTableManyLiveKeys; 58%
// with one slot per key, as before, when two live keys that shared a slot
// both looked new at every resend, and the backlog's resends passed as
// originals). With more distinct keys at once than that, a resend may
// go unnoticed (it counts as the client says); a new request is taken for
// a resend only on a 40-bit hash collision in its bucket, or when its key
// was seen a multiple of 2^24 slices of the table ago (the slices are
// numbered in 24 bits: 194 days with the defaults; a tenth of Window, or
// a 4-millionth of the longest Retry-After if coarser). Config.Client's
// buckets count by the same 24-bit slice numbers: a client's counts of
// 2^24 slices of the window ago can come back in its bucket.
//
// With Config.Client, a function that names the client of a request (an
// API key, a tenant, an address), one client's retries cannot use the
// allowance of others: over HTTP a retry is admitted only if the global
// rule admits it and, over the same window, that client's retries + 1 <=
// RetryRatio·its originals + 1 (a floor of one retry per window per
// client, so that a quiet client can still retry once in a while). Clients
// are kept in a fixed table of 1,024 buckets (80 KiB) chosen by a hash of
// the name; names that share a bucket share one allowance, and the global
// rule still bounds them, so a collision never admits more than the global
// ratio. [Controller.Acquire] and AcquireProbe have no request and apply
// the global rule only, as does package grpcretry's server interceptor.
//
// Not promised: an unkeyed client that lies about its attempts is counted
// as sending originals. With Config.Client that raises its own allowance
// (and the global one by as much), not the others'; without it, it raises
// the allowance of every client, and one client's retries can use the
// allowance of others. A client that changes its name gets a fresh
// allowance per name, within the global rule. A client that marks every retry as a probe
// (wire.ProbeHeader) gets past the ratio only onto idle slots, never
// through the queue. A client that sends a far deadline, or none, is held
// only as long as the queue's limits allow.
//
// # Protocol-neutral core
//
// [Controller.Acquire] takes a context and an attempt number and returns a
// [Permit] to [Permit.Release] when the request is done, or a [Decision]
// that says why it was refused, the Retry-After and whether to send the
// don't-retry signal. [Controller.Wrap] is the HTTP middleware built on it;
// package grpcretry's AdmissionServerOptions maps the same decision to
// gRPC's status and metadata.
//
// # Pushing back
//
// A server that calls a dependency through a retrying client (package
// httpretry) tells its own caller not to retry on top once those retries
// stopped: [PushBack] answers 503 with the don't-retry signal when the
// client gave up for exhausted attempts, budget or an open breaker, and
// wire.SetDontRetry marks any answer of the handler's own the same way. With three services in a
// chain, each retrying up to 3 times, the bottom one then sees 3 attempts,
// not 27.
//
// # Observing
//
// [Controller.Stats] returns counters (requests in flight and queued now,
// originals and retries seen, final decisions by [Outcome]). Config.Observer, if
// set, hears of every decision through stormguard's one event seam
// (package observe, whose OpenTelemetry adapter turns the events into
// metrics): an [observe.Admission] event with Outcome "admitted",
// "queued", "shed-retry" or "shed-busy"; left nil it costs nothing.
//
// # Concurrency and cost
//
// A Controller is safe for concurrent use. An admission that does not queue
// takes no lock and allocates nothing: the window is lock-free (package
// budget), the slots are one atomic counter, the key table is atomic words,
// and the HTTP middleware reads the attempt header without copying it.
// Only requests that queue take the queue's mutex and allocate a waiter. Time comes from the monotonic clock
// and the runtime's timers, which a testing/synctest bubble fakes in tests.
package admission
