// Package limit bounds the attempts in flight to one destination by a
// limit it learns from the destination's latency and drops, and can
// throttle calls locally (client-side adaptive throttling), so that a
// client sends what the destination can serve: after an outage its
// backlog and new calls go out as fast as the destination takes them, not
// at a rate remembered from before, and a cold client finds the capacity
// in a few round trips.
//
// Share one [Limiter] among every call to the destination in the process.
// Each attempt takes a [Permit] with [Limiter.Acquire] before it is sent
// and gives it back with [Limiter.Release] when it ends, saying whether it
// was dropped: timed out, cancelled, or answered with an overload (503,
// 429, a shed answer).
//
// # The limit
//
// The limit is learned in windows of about one round trip (the smoothed
// latency, at least 1 ms and at least min(4, limit/2) outcomes). It is a
// gradient limiter (the family of Netflix's Gradient and of TCP Vegas),
// with TCP's slow start in front:
//
//   - Baseline: the no-load latency, the lowest latency sample of the last
//     minute of healthy traffic (six 10 s buckets). Buckets of an incident
//     (more than 1% drops, no sample, or no sample below twice the
//     baseline) do not push healthy ones out, so the baseline holds
//     through an incident instead of drifting up to its latency; it rises
//     only as healthy buckets age out, or after 5 minutes of continuous
//     incident (then the incident's latency is the new normal; a spell
//     without traffic longer than a bucket, 10 s, does not count towards
//     them).
//   - Slow start: a cold limiter starts at min(Config.Max, 10) and doubles
//     its limit every window in which the attempts in flight reached half
//     the limit and the mean latency stayed within 1.5 times the baseline.
//     When the latency leaves the baseline it steps to limit·baseline/
//     latency (what Little's law says the destination serves without a
//     queue) plus the queue allowance below, and the gradient takes over;
//     a drop halves the limit (undoing the last doubling).
//   - Gradient: each window with latency samples and no drop moves the
//     limit halfway to limit·g + sqrt(limit), where g = reference/mean
//     latency, clamped to [0.5, 1], and sqrt(limit) (at most limit/2) is
//     the queue the limit allows above the measured capacity. The limit
//     grows only in windows that used at least half of it. The reference
//     is the baseline, or, when higher, the latency the destination
//     showed in the last window run at a low limit (a limit in force, a
//     cap included, of at most 5 or an eighth of the last healthy limit;
//     the gradient alone does not take the limit below 4): latency that
//     stays high while this client sends little is the destination's (a
//     slower service, other clients' queue), not this client's queue, so
//     the limit settles at what the slower destination serves instead of
//     collapsing to 1.
//   - Throughput probe: latency above the baseline is not always a queue
//     at the destination (a round trip also spends time in the network
//     and in the client's own work, more of it on a loaded machine), and
//     the gradient alone then settles below the attempts in flight the
//     destination needs for its full throughput. The rate served
//     (attempts completed per second: acquired, less the growth of the
//     attempts in flight, so that a climbing limit does not read more
//     than the destination answers) is measured over periods of at least
//     64 attempts and 4 round trips; the reading that starts a step is
//     the rate over the period and up to 3 before it while the limit
//     moved by less than half a step over each (answers that come in
//     bursts then swing it less by where a boundary falls), and only a
//     reading over 4 periods raises the peak. When the reading is below
//     95% of its peak while the limit binds (rate times latency at least
//     80% of it), the mean latency is below twice the reference and the
//     gradient would lower the limit, the limit grows by sqrt(limit), and
//     again each period as long as a step raises the period's rate by at
//     least half the step's share without raising the smoothed latency by
//     more than a quarter of it;
//     the last limit that did is a floor clean windows do not lower the
//     limit below (it never raises it). A step that does not raise the
//     rate ends the probe. Drops forget the floor and the peak; a period
//     at less than half the peak forgets the floor.
//   - Drops: a dropped attempt is never a latency sample. A window with
//     drops multiplies the limit by max(0.5, 1 − share of drops); one with
//     half or more drops (an outage, a hang) halves it. Nothing in a
//     window with drops raises the limit: a hang lowers it, window after
//     window, down to 1.
//   - Ceiling: with Config.Timeout set, a latency sample (see below: every
//     attempt while at least half the limit is in flight and the limit is
//     under 64, fewer otherwise) released after half the timeout or later
//     counts as a drop, so that latency sitting near the callers' timeout
//     (with no attempt actually timing out) lowers the limit instead of
//     raising it. Below half the limit, where the limit does not bind,
//     one attempt in 16 is a sample, and slow attempts lower the limit
//     window by window more gently than drops released as such.
//   - Recovery: after an outage window, the first clean window ends the
//     recovery. If it is near the baseline, it restores the last healthy
//     limit (the limit of the last clean, used window near the baseline;
//     the initial limit if there is none): a limit slow start was still
//     doubling resumes slow start (it doubles in that window, back to the
//     limit that ran before the outage, and on while the latency stays
//     near the baseline); one the gradient held, the destination's
//     measure, is restored as it is and the gradient goes on from it (a
//     destination that takes 80 at once, whose limit held 58, gets 58
//     again, not 116). If it is not near (the destination's first answers
//     after the outage are slow), nothing is restored and the limit
//     regrows by the gradient from the outage's. If the restored limit
//     meets drops at once, the remembered healthy limit halves, below the
//     initial limit too: a destination that drops a share of every round
//     trip keeps the limit low, restored to less each time.
//
// The gradient family rather than Vegas's additive steps: after an outage
// or a capacity change the limit must move to the destination's capacity
// in a round trip or two, and limit·baseline/latency is that capacity by
// Little's law, where Vegas moves by a few attempts per round trip. Slow
// start covers what a gradient cannot see, a limit far below the
// capacity (latency at the baseline says nothing of how much more the
// destination takes). The guards above address the gradient's known
// failures: a baseline that drifts up during long incidents
// (failsafe-go#127) and a limit that grows while latency sits at the
// timeout (concurrency-limits#137).
//
// In the package's tests, against a simulated destination of 50 servers
// of 10 ms each (5,000 attempts per second) loaded by 400 callers, a cold
// limiter reaches the capacity (50 in flight) in 3 round trips (200 in
// 5 to 7, 1000 in 7 to 9, up to about twice that in rare runs: which calls
// it samples follows the scheduler's order of the callers) and then holds
// 57 or 58 (the allowance; 65 to 78 in 3 of 90 runs under -race on a
// loaded machine, 86 once in a CI run, for the same reason); a 2 s outage or a
// 10 s hang takes it down to 1 and it is back at the capacity about 3
// round trips after the destination is; an 80% capacity cut takes it to
// 13 or 14 (capacity 10) while the destination serves 99.9% of its reduced
// capacity; a 5x slower service for 60 s leaves the baseline at 10 ms
// while the limit stays near 57 (the same servers, 5 times slower; under
// -race, a dip to 38 or 46 for a moment in 2 of 32 runs, again for the
// scheduler's order of the callers).
//
// What it cannot tell: the baseline is the fastest answer, so a
// destination whose answers mix cheap ones (a 404 from a front proxy, a
// cache hit) released as latency samples with costly ones sees the costly
// ones as queueing, and its limit settles lower than the destination
// could take (down to where the low-limit reference takes over). One
// limiter sees one process's attempts: many small clients of one
// destination each learn a limit, and none binds the sum (package fleet's
// Config.Limit gates each one, with [Limiter.SetRate], at its share of a
// fleet-wide rate).
//
// Latency is measured on a sample of the attempts, so that the common
// path reads no clock: every attempt while the limit is under 64 and at
// least half of it is in flight, about 32 to 64 per round trip above, and
// one in 16 when less than half is in flight. Drops released as such
// (Release's dropped) are counted on every attempt; the ceiling's, on the
// samples.
//
// # Waiting
//
// A call that finds the limit reached (or calls already waiting) waits for
// a slot, in a list bounded by Config.Waiting; a release hands its slot to
// the first waiter. Calls with a deadline come first, earliest deadline
// first; calls without one wait behind them, first come first served,
// except that while both kinds wait one slot in 8 goes to the oldest call
// without a deadline: deadline calls that keep coming cannot starve it,
// and it takes at most an eighth of the slots from them. A waiting call
// holds no lock and starts no goroutine (one timer, for a call with a
// deadline once a latency is known), and joins the list in O(log n) steps
// whatever its deadline (a short one behind 100,000 long ones included).
// Calls that cannot make their
// deadline fail fast with [ErrLimited] and the reason, not at their
// deadline: at once when more calls with a deadline wait ahead than twice
// the limit's measured rate serves before the deadline (behind more than
// 4,096 waiting calls, it counts 4,097 ahead: a call whose turn lies
// deeper in the queue is not refused at once, and fails while waiting,
// at the latest when its deadline comes within the baseline latency) (the rate the
// destination is actually served at: the highest of the attempts
// acquired per second in the last window, their smoothed rate, and limit
// per smoothed round trip, the limit being, while slow start or recovery
// may still raise it, the highest it can reach: Config.Max or the cap),
// and while waiting when the deadline comes within the baseline latency
// (a slot granted later could not be answered in time) or when, at the
// end of a round trip, the waiters ahead of it leave it no expected turn.
// And at its turn: a call whose slot comes with
// less time left than twice the destination's latency (the smoothed
// latency of its answers, or the last round trip's when lower; at least
// the baseline) fails then, and the slot goes on to the next in turn,
// when a later call has that much time left (or a call without a deadline
// waits) and the free slots are fewer than the calls waiting (with the
// rate gate on, whenever a token is due). Earliest deadline first is
// the order that serves every call when all can be served; when the
// destination slows down and they cannot, it hands each slot to the call
// with the least time left, whose answer then comes after its caller
// left: the destination serves abandoned work, every abandoned attempt
// is a drop that lowers the limit, and the calls served in time fall
// towards none (in the package's tests, a destination of 10 servers at
// 95% load made 5 times slower for 5 s answered 354 waiting callers of a
// possible 1,000, and served 160 answers after their caller left; with
// the check, 923 and none). The last call waiting gets its slot whatever
// its time left, and so does the first in turn when no later call has the
// time either. A call without a deadline is never hopeless: it waits
// until it gets a slot or its context ends. A call whose context
// ends while it waits leaves then, with an error wrapping ErrLimited and
// the context's error, and so does one whose slot comes as its context
// ends or at its deadline (the slot goes back unused): a call that waited
// never gets a slot it has no time to use. A call beyond Config.Waiting,
// or any call over the limit with waiting off, fails at once; so does one
// whose context is already done (with the context's error): pass a done
// context to take a slot only if one is free now.
//
// # Rate gate
//
// [Limiter.SetRate] adds a token bucket to the limit (off by default): an
// attempt then needs a token as well as a slot. With a token due, Acquire
// takes it by one compare-and-swap (no lock, no allocation); a call that
// finds none waits in the same earliest-deadline-first list, and one
// timer per Limiter wakes the list when the front waiter's token is due.
// A waiting call gets its token at a drawn point of the token's time that
// follows the token's own (the tokens stay a token's time apart), so that
// gates set alike at the same moment (a fleet's processes) do not keep
// sending in step. A call whose turn (the next token, plus a token's time
// per call waiting ahead of it, plus that token's draw) comes after its
// deadline less the baseline latency fails fast
// with ErrLimited ("no token"), on arrival or as soon as a lowered rate
// makes it so; SetRate reports how many did since its last call (a
// fleet counts them in its process's demand for the fleet-wide rate).
//
// # Throttling
//
// With Config.Throttle = K, Acquire first rejects locally a share
// max(0, (requests − K·accepts)/(requests + 1)) of the calls (Google SRE
// book, "Handling Overload"), over a 500 ms history; see [Config].
//
// # Time
//
// A Limiter reads the monotonic clock (time.Since its construction);
// inside a testing/synctest bubble it runs on the bubble's clock, so
// tests of code that uses it need no real sleeps. The throttle's random
// decisions come from its own generator, seeded at construction; no
// global state is used.
package limit
