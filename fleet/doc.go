// Package fleet shares retry budgets and circuit breakers across the
// processes of a fleet through Redis, without a lock and without a round
// trip on the success path.
//
// A per-process budget does not bind a fleet of low-volume clients: each
// one's floor admits every retry, and each breaker rarely sees its minimum
// of calls. A [Fleet] gives every destination host one budget and one
// breaker for the whole fleet (every process that uses the same
// Config.Name on the same Redis):
//
//	client := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379", ContextTimeoutEnabled: true})
//	f, err := fleet.New(client, fleet.Config{Name: "pos-terminals"})
//	defer f.Close()
//	rt, err := httpretry.NewTransport(nil, httpretry.WithGuards(f.Guards))
//
// # The model
//
// Each process counts locally and syncs in the background: every
// Config.SyncEvery (100 ms by default) one goroutine per process flushes
// every host's counts (requests, and closed-state successes and failures of
// its breaker) and reads the fleet's windows back, in one call of one Lua
// script (EVALSHA): one round trip per interval per process, whatever the
// traffic (with Config.Limit, also the counts of attempts in flight: see
// The fleet's attempts in flight). The windows are sliding windows in slices, like package budget's
// and package breaker's, on the Redis server's clock (TIME inside the
// script), so the processes' clocks do not matter. All keys of a fleet
// share one hash tag, {Name}, so they live on one Redis Cluster node and
// one script can touch all of them.
//
// The budget. [Budget.Deposit] is an atomic add; the sync also passes the
// count on to the process's local budget. The fleet's rule is
// package budget's rule over the whole fleet:
//
//	retries + k <= Ratio·requests + MinPerSecond·Window.Seconds()
//
// checked by the script at every grant of k retries, where requests and
// retries are the fleet's in the window, and MinPerSecond·Window is a floor
// for the whole fleet, not for each process. Retries are granted as small
// leases: [Budget.Withdraw] spends one from the process's lease, and only
// an empty lease asks Redis for more (one request in flight per host,
// waited for at most Config.Timeout, or the caller's time left if
// shorter). A retry the fleet cannot charge in that time is refused, never
// granted from the local budget, and the request goes on to fill the lease
// for the next callers: every retry granted in fleet mode was counted in
// the fleet's window before it was sent, whatever the callers' deadlines.
// A lease asks for one retry at first, doubles its ask (up to 8 retries)
// each time a whole lease is spent and halves it when one expires unused,
// and asks for at least one per caller waiting for it (a burst of callers
// is served by one round trip, not by several).
// A lease ends with the window slice it was counted in (on the server's
// clock, mapped conservatively to the process's), so every retry is
// counted in the slice it is sent in, but for the one a reply keeps for
// the caller that asked, sent as the reply comes (up to the reply's
// one-way trip after its slice); the retries it did not spend are
// given back by the next sync. When a reply shows the fleet's budget spent,
// withdrawals are refused without asking until a sync shows room again.
// Requests reach the fleet's window up to one interval (and a one-way
// trip) late, and leave it as late: stricter at first, more lenient a
// window later; the bound in real time is in Config.Budget's
// documentation. While the host's breaker is not closed, a retry is
// granted without spending budget: it is not sent until the breaker admits
// it (a probe, or its turn in the release after the close), so the breaker
// bounds it; charging it would fail, with the budget spent in the first
// second of an outage, the calls that could have waited the outage out.
//
// The breaker. Each host's [breaker.Breaker] is a normal breaker with its
// own window (it still trips alone) and a [breaker.Shared] connection to
// the fleet: its outcomes are counted (an atomic add) and synced; when the
// fleet's window, or its current bucket alone, holds at least
// Config.MinCalls calls with failures >= FailureRatio·calls, the script
// opens the fleet's breaker and publishes the opening on the fleet's
// channel: every process trips its breaker ([breaker.Breaker.Trip]) as
// soon as it hears it, and at its next round trip (a sync, a lease
// request) if it missed it (see News on a channel). Failures are news:
// the first failure after a sync that carried none (of any host's) starts
// a sync at once, and while a process's unsent outcomes are mostly
// failures it syncs every tenth of an interval (a failure or a burst of
// them that ends sooner is sent a tenth after the sync before it; a
// failure among successes waits for the interval): about ten syncs per
// interval at most, whatever the number of hosts, and none early in local
// mode. So the fleet trips within a few round trips of an outage rather
// than a few intervals, while the calls that failed can still wait for the
// breaker. Successes, then, are slower news than failures: with
// Config.Limit (the fleet's rate, below), where a provider that sheds a
// little at its capacity is expected, the current bucket is judged with
// the one before it (a bucket's first reports, failures sent at once and
// few of the successes yet, are no majority of anything), and for a
// window of the rate after the fleet's breaker closes, while its window
// holds only the release's first outcomes, the window alone judges, its
// failures also at least FailureRatio of the calls the fleet's rate R
// sent since the close (a host down again fails the release at R's pace
// and trips it as before; live, with admission at the provider, the shed
// answers at the top of each release reopened the fleet's breaker 1-1.5 s
// after every close). Probes are fleet-wide: when
// a breaker's probe round is due it asks Redis, and while the fleet's
// breaker is open the whole fleet gets Config.ProbeRounds rounds per probe
// interval (Breaker.OpenFor), one per slot of OpenFor/ProbeRounds, so a
// thousand processes send a handful of probes, not a thousand (a process
// that starts calling a host, joining mid-outage, learns the fleet's
// state before its first call: [Fleet.Guards] of a new host waits for
// the sync it starts, at most Timeout, and so do the calls for that host
// that come while it waits), and a
// dependency that is back is found within about a slot. A round is one
// call by default (Breaker.Probes defaults to 1 in a
// fleet): the call that asked for it, so a low-volume process granted a
// round needs no other call to finish it. When a process's probes close
// its breaker, its next sync (started at once) tells the fleet, and every
// other process resets its breaker ([breaker.Breaker.Reset]) at its next
// sync or probe-round request; each releases its waiting calls at its own
// pace (see below). A process whose breaker opened on its own calls while
// the fleet's stayed closed probes on its own schedule: the fleet's limit
// on rounds is for the fleet's outage, not for one process's.
//
// The release after a close is paced by each process's breaker, starting
// from its own pre-outage rate, but never slower than Breaker.Probes per
// Breaker.OpenFor (one call per second by default): for a fleet of
// processes that each call less often than that, the fleet releases its
// backlog at the number of processes per second, faster than its
// pre-outage rate.
//
// # The fleet's rate
//
// With Config.Limit, each host also gets a [limit.Limiter] (in the
// retry.Guards of [Fleet.Guards]) that learns its own limit of attempts
// in flight as package limit says, and is gated ([limit.Limiter.SetRate])
// at this process's share of a fleet-wide rate R of attempt starts per
// second to the host. One limiter per process does not bind a fleet of
// small clients (a terminal with one call in flight never reaches a limit
// of 10), and slots of a fleet-wide limit of attempts in flight, handed
// over at syncs, starve them (a slot serves one process per sync
// interval, however short its attempts): a rate does neither, since a
// share of 0.4 calls a second is a token every 2.5 s. The rate learns in
// windows of SyncEvery or one second, whichever is longer (its rules count
// per window and were measured at one second; live, a fleet whose rate
// learned in windows of 250 ms stayed stuck after a hang and recovered 28 s
// after a 503, where at one second it recovered at once). Once per window
// a process's sync carries its report to the rate, per host: the limiter's
// calls waiting and the sum and number of its latency samples since the
// last report (sampled attempts that ended not dropped: about one in 16
// calls per process, more when loaded), and the breaker's outcomes since
// the last report, the fleet's successes and drops (what the breaker
// counts as a failure: timeouts, cancels, 503s); the syncs in between
// serve the breaker and the budget only, and the gate keeps the share of
// the last reply.
// The calls waiting include those its breaker holds: during an outage
// they are still demand (without them a process's share falls to the
// floor, and the calls it held are refused as hopeless when the breaker
// closes). Each report also carries the calls the limiter refused for want
// of a token since the last one: demand the process's share did not
// serve (without them, a process whose share is too small for its calls'
// deadlines refuses them all, reports no demand, and its share never
// grows). The script, on the server's clock, in windows of the rate:
//
//   - Learns R at the first sync of each window, from the last window's
//     reports of the whole fleet (which describe mostly the attempts of
//     the window before it: a report comes at the next sync). Cold (no
//     R yet: no gate), R becomes the demand per second (attempts done
//     plus calls waiting), at least 10, of the second window that
//     carries any: the first holds only part of the fleet's (each
//     process reports first a window after its first sync, at its own
//     phase of the window); live, a cold R of 12-190 a second for 450
//     offered left 1000 terminals owing a token each at their tiny
//     first shares, and no attempt started for two windows 4-6 s in
//     (docs/fleet.md, The cold rate from the second window). R never runs
//     ahead of what the host has shown it serves: a clean window (no
//     drops, mean latency at most 1.5x the baseline or 5% of a window
//     above it, or its fastest sample at most the baseline) never
//     leaves R above the ceiling, the highest rate
//     served near the baseline in the last 6 buckets of 10 windows
//     (each the mean of two successive windows, which cancels a report
//     that comes a window late, at most the R in force) plus 1/16, or
//     8% while calls wait for the rate (the fleet's demand reached R);
//     with no such window in the horizon, the last healthy rate. Cold,
//     until the first incident (drops, a queue) or the first window
//     whose demand R met from the third window with a rate on (the
//     first windows' reports are partial: each process reports at its
//     own sync), the margin is 2x (slow start). A clean window whose fleet's
//     demand reached 3/4 of R raises it to the higher of R+√R and
//     min(2R, 1.5 × demand), within the ceiling: once warm, by at most 8%
//     of the rate served a window (25% in the regains below), so a fleet
//     warm at a low demand follows
//     a jump in demand slowly (from 10 to 30 calls a second in about 14
//     windows; the gates refuse as hopeless the calls that cannot wait). Drops cut R by their
//     share, at most halving, and when they are a quarter of the
//     outcomes or more also to at most 1.1x the rate served (the higher
//     of this window's and the last one's: reports come a window late,
//     so for a smaller share that is the rate before the last raise, and
//     a provider's admission shedding 5-15% at its capacity undid every
//     raise); a window with a majority of drops is an outage. A window whose mean latency is
//     above twice the baseline, 10% of a window above it and 1 ms, and
//     whose fastest sample (the fastest of the processes' reports) is
//     above 1.5x the baseline and 5% of a window above it (the host
//     queues, and the queue stood the whole window: a few slow samples,
//     such as the clients' own delays, raise the mean, not the fastest;
//     a report without one counts as standing) brings R to 97% of the rate served (two windows'
//     mean, at most R) less the share that drains the queue (the mean
//     less the baseline) in two windows, at most halving. A window
//     where the host queued or dropped some attempts while R was at
//     least half the healthy rate is evidence of its ceiling: the
//     rate served then replaces the evidence of more, unless the next
//     window is an outage (that window was the outage's first, partial
//     one: the evidence before it stands). Neither cuts
//     again in the window right after a cut, whose reports still show
//     the old rate's attempts, and a queue does not cut again in the
//     three windows after a cut for a queue unless R rose since: the
//     queue the cut drains still shows in their latency, and a second
//     cut would take R well below the host's capacity. A window in
//     which the fleet's breaker was open at any time (at its start, at
//     its close, or opened in it) is an outage whatever its outcomes
//     (the breaker holds the calls; its probes are no evidence of
//     capacity, and what the rest of the window served is part of a
//     window's): no cut, no evidence of the host's ceiling, and a
//     window taken for a full host in the two before it was its first,
//     partial one. Nor does the window after it cut R or give evidence
//     (its reports are the outage's and the release's first). (Live, with admission at the provider, a window in
//     which the breaker opened and closed again on shed answers was
//     taken for a full host serving the 20-60 calls a second it let
//     through, and R fell to a tenth of the host's capacity.) The first
//     clean window near the
//     baseline after an outage restarts R from the last healthy rate
//     (the rate served, at most R, in the last clean window near the
//     baseline that used at least half of R), and until the next cut
//     the margin while calls wait is 25%, not 8% (the backlog goes out
//     at what the host takes, not at the rate before plus 8% a window);
//     so it is too, for 60 windows from an incident's first cut, while
//     R is below 90% of the healthy rate before the incident (after a
//     slowdown, R regains the host's rate in a few windows, not in 20); a cut before a window
//     run at that rate confirms it halves the healthy rate (the host
//     takes less than it did; a cut for drops under a quarter of the
//     outcomes takes it to the cut's rate instead). R stays within 1 per window and
//     Limit.Max per baseline latency (the most in flight the fleet may
//     have, by Little's law).
//   - Judges the probe that closes the fleet's breaker: a process whose
//     probes close its breaker reports to the rate with the close, and
//     the report carries the probe's time (from the fleet's grant of the
//     round, taken by a waiting call, to the close). A probe
//     slower than twice the baseline and 5% of a window above it found a
//     host that serves at a fraction of its speed (a slowdown, or a queue
//     still draining): for 10 windows from the open the fleet refuses the
//     close (it opens again, a new epoch, and the prober's breaker trips
//     at the reply), so the calls keep waiting for a host that serves at
//     its speed again instead of a release at the rate before the outage
//     into one that serves a fifth of it (live, at a x5 slowdown, that
//     release queued work the host served after the slowdown for callers
//     who had left: 7-8% of the work after it wasted). After 10 windows it
//     closes (a slowdown that lasts is served, and the rules above cut R
//     on the drops or the queue the release meets). A process between two
//     reports scales its share by R's change at each sync (a sync's reply
//     carries R).
//   - Keeps the baseline: the lowest mean latency of the windows without
//     drops whose mean is within twice it (or 1 ms), over the last 6
//     buckets of 10 windows. Windows with drops or a queue do not count,
//     so it cannot drift up during an incident: with no clean window in
//     the horizon it keeps its last value; after 300 windows without one,
//     the next window without drops sets it afresh (a slower normal).
//   - Shares R by demand, with a fair floor: each process's demand is
//     its attempts done and calls refused for want of a token since its
//     last report to the rate (once per window), plus the calls waiting at
//     the report (a count, not a rate), over the time since that report
//     (at least a window), per second, taken at once when it rises
//     and smoothed over about 4 windows when it falls, at least a tenth
//     of a call per window. Its share is its floor, min(demand, R/4n) for
//     the n processes known at the window's start, plus the rest of R
//     (R less the sum of the floors, at least 3R/4) in proportion to the
//     demands (D, their sum, the larger of the sums now and at the
//     window's start; the floors' sum likewise). No process gets less
//     than min(its demand, R/4n), whatever backlog the others hold; the
//     processes with more demand share at least 3/4 of R by it (a
//     larger floor holds more of R for processes that do not use it:
//     the rate served falls, and R with it).
//     Refused calls count in a process's demand, not in the fleet's
//     demand that R grows on (they say the share is too small, not that
//     the host takes more). A process not heard of for 10 windows is
//     forgotten; one that closes leaves at once.
//
// Each process sets its limiter's gate to its share, with a burst of
// max(1, share × min(SyncEvery, 100 ms)) tokens: a terminal that was idle
// sends its next call at once, and a process with a large share does not
// send a whole interval's worth at once. A call that finds no token waits for one, earliest
// deadline first, and fails fast with [limit.ErrLimited] when its turn
// comes after its deadline. When the breaker closes after an outage
// (the fleet's close, or its own probes), every process has calls waiting
// and a token; each then pushes its next token out by a phase of its own
// (a fraction of a token's time, fixed at New from its random id), so
// that the fleet's first calls are spread over a token's time instead of
// one per process at once, and the gate's draws (package limit: a waiting
// call gets its token at a drawn point of the token's time that follows)
// keep them spread: with each waiting call at its token's time to the
// dot, 1,000 processes released together kept sending together, in waves
// one token's time apart, for as long as their calls waited
// (docs/metastability.md).
//
// The bound: in fleet mode, the fleet's attempts in any span T are at
// most about R·T plus the bursts, Σ max(1, share × min(SyncEvery, 100 ms)):
// R·min(SyncEvery, 100 ms) plus one call per process whose share is below
// one call per 100 ms. About: a process's waiting calls take their tokens
// at a drawn point of the token's time that follows, so in a span one
// process may start one call more than its share and burst; the tokens'
// times stay a token's time apart.
// It is a rate, not a concurrency bound: attempts in flight are bounded
// per process by each limiter's own limit (at most Limit.Max), and for
// the fleet through R and latency (Little's law) and the hold below,
// which stops new attempts while the sum of the counts stands at its
// bound and no answer comes. Shares sum to R
// only at the window's start; a process whose demand rises meanwhile may
// take more until the next window. It does not cover processes in local
// mode, nor those not yet synced (a new host has no gate until the first
// sync's reply, which its first call waits for at most Timeout), nor the
// windows before the first R (cold). Latency is the attempts' as the limiters measure it,
// including any time spent in the client (a loaded machine, a
// contended scheduler): a process that is itself the bottleneck makes the
// fleet's rate fall. In local mode (a failed round trip: a sync, a
// lease, a probe round) the gates are lifted and each process's limiter
// decides alone, by its own learned limit (at most Limit.Max, never
// unlimited); the next sync that succeeds gates them again, and Close
// lifts them.
//
// What it costs: the success path with a token due is one more
// compare-and-swap (no lock, no allocation) and two channel sends that do
// not block (the counts' goroutine's kicks); each sync carries nine more
// arguments per host, and the script reads the host's registry of
// processes once per window; the counts of attempts in flight are about
// two round trips per call for a process with one call in flight at a
// time, at most about a hundred a second for a busy one.
//
// Many small processes. The model tests drive the real script with an
// explicit clock: 1000 processes, each a call every 2.2 s (455 a second
// offered), 20 s deadlines, a host that serves 500 a second at 20 ms,
// each outcome reported when its attempt ends
// (TestScriptFleetLimitLowVolume): 13,619 of 13,619 calls served, none
// failed, the host's queue at most 52 ms; R 464 a second from the second
// window with demand (cold), 684 in the slow start's next window, 489
// from window 4 (0.98 of the capacity). The same fleet against a host
// cut from 600 to 300 a second at 10 s (TestScriptFleetRateFullHost): R
// comes down to 0.84 of the new capacity on average over windows 20-44,
// at most 440 a second, and the host serves 0.82 of it; its queue
// reached 1.56 s while R reacted, at most 0.92 s in those windows; the
// calls beyond the capacity fail fast. With every attempt failing for
// 10 s (TestScriptFleetRateOutage): R back to 80% of the last healthy
// rate one window after the close, 26.3% of the calls started during
// the outage served (the test's physical bound is 20%) and the rest
// failed fast with more than 1 s left, every call made 5 to 15 s after
// the close served, the host's queue at most 270 ms. With the host 5x
// slower for 10 s and a queue of 2 s of work
// (TestScriptFleetRateSlowdown): 0.46 attempts per call offered during
// it, R at most 1.15x the capacity from 5 s after it, 0.1% of the host's
// work after it done for callers who left, every
// call made 5 to 15 s after it served. After an outage that leaves a
// backlog on some processes only (TestScriptFleetRateOutageBacklog: 100
// busy processes, a call every 0.5 s each, whose breakers hold their
// calls for 10 s; 900 quiet ones, a call every 4 s each, whose calls
// during it fail at once): every call on a quiet process made 3 to 15 s
// after the outage served, 2700 of 2700, none refused (with shares in
// proportion to demand alone, 2493 served and 207 refused as hopeless;
// with refused calls not counted either, 1470 and 1230). Those are
// models: the live rows are bench's (docs/metastability.md), on a
// loaded machine.
//
// # The fleet's attempts in flight
//
// The rate learns from timeouts and latency, a window late at the
// soonest; a host that hangs (no answer at all, its queue filling with
// work for callers who will have left by the time it is served) is known
// only when the first attempts time out, and a fleet of small processes
// sends a rate's worth of attempts into it before that (live, 1000
// terminals against a hung host: 2.4-2.7% of the host's work after the
// hang was for callers who had left). So, with Config.Limit, each process
// also sends its count of attempts in flight to each host (its limiter's)
// whenever it changes, from one goroutine of its own: kicked when a call
// starts its first attempt (Budget.Deposit) and when an outcome comes
// (Outcome), at most one send per 10 ms, and while the process has
// attempts in flight it looks again every 10 ms (a slot may go back
// after its outcome: an HTTP response's when its body is closed); a busy
// process sends about a hundred a second, a terminal two per call. The
// calls never wait for it. The script keeps the sum of the processes'
// counts and holds the fleet when the sum reaches B = max(8, 3·R·b)
// (b the baseline, R the fleet's rate: three times the attempts the
// fleet's rate keeps in flight at the baseline latency) and no process
// has reported a success for 4b (at least 20 ms), nor for twice the
// length of the last hold that a success ended: near its capacity a
// host's queue, and the sum, come and go, but its answers do not stop;
// and a host whose answers ended a hold after D answers, slowly, about
// every D, and is not held again between the bursts of its answers
// (that length is forgotten after three windows in a row near the
// baseline).
// The hold is published on the channel (see below) and every process
// caps its limiter at 0 ([limit.Limiter.SetCap]): no new attempt starts
// anywhere and calls wait, within their deadlines, as over any limit. It
// ends at the next success any process reports (a host that answers,
// however slowly, is not hung: the rate's rules judge a slow one), when
// the sum falls below B/2 (the hung attempts timed out), or when the
// fleet's breaker opens (its probes must go). No hold while the rate is
// cold or the baseline unknown. So a hang costs the host about B
// attempts, plus what the processes start in the round trip that reports
// the sum crossing it, instead of a timeout's worth of the rate (live
// figures: docs/fleet.md). A held process also asks at each sync whether
// the hold goes on (news may be
// lost); a count not refreshed for two windows is forgotten (a process
// that stopped), and a process that closes takes its count away. In local
// mode the hold is lifted with the gates.
//
// # News on a channel
//
// An opening of a host's breaker (by failures, or a refused close) is
// published on the channel "stormguard:fleet:{Name}/open" as "<epoch>
// <server time, µs> <host's key>", and a change of a host's hold (see
// The fleet's attempts in flight) as "h <incarnation> <sequence> <0|1>
// <host's key>" (a process applies the newest sequence of the key's
// incarnation only). Each Fleet holds one more connection to
// Redis, a subscription to that channel ([New] starts it; [Fleet.Close]
// ends it, waiting for it at most Config.Timeout; go-redis subscribes
// again after a lost connection), and trips the breaker of a host it
// tracks when it hears its opening, in fleet mode, instead of at its next
// sync: live, 1000 terminals syncing every second sent 0.01-0.17 attempts
// per payment during a 503 outage, against 0.09-0.10 when each learned of
// the opening at its own sync (docs/fleet.md). A process acts on the
// newest news only: a reply or a message whose server time is older than
// the last one it acted on is ignored, so a sync that left Redis before an
// opening does not close the breaker the opening tripped. A message that
// does not parse, names another fleet or a host the process does not
// track, or claims a time more than a minute past the newest reply's, is
// ignored; anyone who may publish on the channel can open the
// breakers of the fleet's processes, as anyone who may write its keys can.
// A missed message costs what it cost before: the process trips at its
// next round trip.
//
// # No lock
//
// Nothing is held across a caller's call. A distributed breaker that takes
// a fleet-wide lock around each request (as gobreaker v2's does) makes the
// fleet call its dependency one request at a time, and makes every call
// wait on Redis. Here the success path (Deposit, the breaker's Allow and
// Done, Outcome) is a few atomic operations on local memory: no Redis I/O,
// no lock, no allocation. Round trips happen only in the background sync, on
// a retry that finds its lease empty, when an open breaker's probe round
// is due, and (with Config.Limit) in the goroutine that sends the counts
// of attempts in flight, which no call waits for.
//
// # Modes
//
// A Fleet is in [ModeFleet] while Redis answers. A round trip that fails,
// or takes longer than Config.Timeout, switches it to [ModeLocal]: each
// host's local budget (Config.LocalBudget, a [budget.Budget] fed with every
// deposit all along) and its breaker's own window decide alone: retries are
// never unlimited, and a breaker still trips on its own calls; probe rounds
// are the breaker's own.
// The success path is the same in both modes, and never waits on Redis. The
// background sync keeps trying every interval, and the first one that
// succeeds switches back to ModeFleet. Counts of a failed sync are dropped,
// which only makes the fleet stricter; a lease granted after the fleet went
// local is given back; the leases of a process that dies expire with their
// slice. A Redis that does not answer at [New] is not an error either: the
// Fleet starts in local mode, with the reason logged. The mode is
// [Fleet.Mode], the last error in [Fleet.Stats]; each change (not each
// call) is logged at Warn (Config.Logger) and reported as an
// observe.FleetMode event (Config.Observer).
//
// # Redis
//
// Redis 5.0 or later (the script reads TIME before it writes), single,
// Sentinel or Cluster, through any redis.UniversalClient (not a nil one,
// typed nil included). Give the client ContextTimeoutEnabled: true so that
// an abandoned round trip ends at its deadline; the fleet never waits
// longer than Config.Timeout either way. Each host is one hash,
// "stormguard:fleet:{" + Name + "}:" + host, that expires when no process
// has synced it for twice the longest window plus 10 s (the longest of
// the budget's and the breaker's windows, OpenFor, MaxOpenFor and the
// rate's window: SyncEvery or 1 s, whichever is longer); with
// Config.Limit, the host's registry of processes is a second hash,
// "stormguard:fleet:{" + Name + "}/r:" + host, with the same expiry (no
// host's key is another host's registry, whatever the host names). The
// openings go out on the channel "stormguard:fleet:{" + Name + "}/open".
//
// On Redis Cluster, every key of a fleet is in the one slot of its hash
// tag, served by one master (the channel's name has the same tag). While that slot has no master (a master
// killed, until the cluster promotes its replica: about the cluster's node
// timeout plus an election), every round trip fails and each process is in
// local mode, its local budget and breaker deciding alone, as above; the
// callers see no error. After each failed sync the fleet asks a go-redis
// ClusterClient to reload its map of slots (it would otherwise keep
// sending to the dead master until its periodic reload, once a minute by
// default), so fleet mode is back a sync or two after the promotion. A
// manual failover (CLUSTER FAILOVER) loses no write, and the processes
// stay in fleet mode through it. Replication is asynchronous, and the
// fleet does not wait for replicas (WAIT) on its round trips: writes a
// master acknowledged but had not passed on when it died are lost. Lost
// requests and outcomes only make the fleet stricter; retries leased in
// that lag are spent but no longer counted, so the fleet may grant that
// many more in its window; a state change of the fleet's breaker lost that way is undone in
// every process that had seen it (a lost open resets the breakers it
// opened, until the failures that still come open it again).
package fleet
