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
// traffic. The windows are sliding windows in slices, like package budget's
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
// A lease asks for one retry at first, doubles its ask
// each time a whole lease is spent and halves it when one expires unused.
// A lease ends with the window slice it was counted in (on the server's
// clock, mapped conservatively to the process's), so every retry is
// counted in the slice it is sent in; the retries it did not spend are
// given back by the next sync. When a reply shows the fleet's budget spent,
// withdrawals are refused without asking until a sync shows room again.
// Requests reach the fleet's window up to one interval late, which only
// makes it stricter. While the host's breaker is not closed, a retry is
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
// opens the fleet's breaker, and every process's next round trip (a sync,
// a lease request) trips its breaker ([breaker.Breaker.Trip]). Failures
// are news: the first failure after a sync that carried none starts a sync
// at once, and while a process's unsent outcomes are mostly failures it
// syncs every tenth of an interval, so that the fleet trips within a few
// round trips of an outage rather than a few intervals, while the calls
// that failed can still wait for the breaker. Probes are fleet-wide: when
// a breaker's probe round is due it asks Redis, and while the fleet's
// breaker is open the whole fleet gets Config.ProbeRounds rounds per probe
// interval (Breaker.OpenFor), one per slot of OpenFor/ProbeRounds, so a
// thousand processes send a handful of probes, not a thousand, and a
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
// # The fleet's limit
//
// With Config.Limit, each host also gets a [limit.Limiter] (in the
// retry.Guards of [Fleet.Guards]) that learns as package limit says,
// capped ([limit.Limiter.SetCap]) at this process's share of a fleet-wide
// limit L of attempts in flight to the host. One limiter per process does
// not bind a fleet of small clients (a terminal with one call in flight
// never reaches a limit of 10); the fleet's limit does. Each sync carries,
// per host, the limiter's attempts in flight and its demand (in flight
// plus waiting), read when the sync starts; the breaker's outcomes it
// already carries are the fleet's successes and drops (what the breaker
// counts as a failure). The script, on the server's clock:
//
//   - Learns L in windows of SyncEvery, at the first sync of each window,
//     from the previous window's outcomes of the whole fleet. Failures
//     multiply L by max(0.5, 1 − their share), down to 1; the first such
//     window after a clean one also sets the slow-start threshold to the
//     lowered L. A clean window in which the fleet's demand reached L/2
//     doubles L up to the threshold (slow start), then adds ⌊√L⌋. A window
//     without outcomes, or one the fleet did not use, leaves L alone. L
//     starts at min(Limit.Max, 10) with the threshold at Limit.Max, and
//     stays within 1 to Limit.Max (the bound of the whole fleet, not of
//     each process).
//   - Shares L: with the fleet's demand D (the sum of the processes' last
//     reports) and N processes, a process's share is its demand plus
//     (L − D)/N when D <= L, and L·demand/D otherwise, plus the fraction
//     it was not granted before (at most 1): a process whose share is 0.3
//     gets a slot about one sync in three. Its grant is the whole part,
//     within the slots no other process holds; a process refused its
//     share for want of free slots, and holding none, gets the slots that
//     are freed first (the others leave one free slot for each such
//     process), so none is stuck behind the others.
//   - Counts a process as holding the most of its grant, its previous
//     grant and its attempts in flight: slots it may still be using
//     (started under its previous grant while this sync was in flight, or
//     still running) are never granted to another.
//
// The bound: in fleet mode, a grant never brings the slots held by the
// fleet above L, and every attempt in flight is in a slot held, so the
// attempts in flight of the whole fleet never exceed L (when L falls, the
// attempts above it end normally and no slot is granted until they have).
// It does not cover processes in local mode, nor a process that stops
// syncing without failing (a stalled loop) for 10 windows: the fleet
// forgets a process not heard of for 10 windows and its slots go back. A
// process that closes gives its slots back at once.
//
// What it costs: a call that finds its process's share in use waits, as
// over any limit (earliest deadline first, within its deadline), for a
// sync that grants a slot: up to a sync interval, more while the fleet's
// demand is above L. A new host has no share until its first sync, which
// starts at once. A slot is given back one sync after its grant falls, so
// while processes take turns part of L is held and idle. The success path
// does not change (the cap is set by the sync); each sync carries seven
// more arguments per host, and the script reads the host's registry of
// processes once per window. In local mode (a failed sync) the caps are
// lifted and each process's limiter decides alone, by its own learned
// limit (at most Limit.Max, never unlimited); the next sync that succeeds
// caps them again, and Close lifts them.
//
// Many small processes. Slots change hands only at syncs, and a slot is
// held for its grant and the next sync, so however short the attempts, a
// slot serves one process for about two sync intervals. A fleet of N
// processes that each need much less than a slot per interval starts
// the calls of about L/2 processes per interval, and each call waits for
// its process's turn, about 2N/L intervals. The waiting calls keep the
// fleet's demand above L/2, and L learns from failures (the breaker's),
// not from latency: every clean window doubles it, up to Limit.Max,
// whether or not the host can take that many, and once it no longer binds
// the calls that waited go out together. In TestScriptFleetLimitLowVolume
// (1000 processes, a call every 2.2 intervals each, attempts far shorter
// than an interval, no failure) L goes from 10 to 1000 in 10 windows; in
// the first 8 the fleet starts at most 47 calls per interval of the 455
// offered, in the 10th 2262. Against a host that serves 10 attempts at a
// time that burst is a queue of seconds and its attempts time out. In
// bench's TestLiveMeta (STORMGUARD_LIVE_META_ROWS='fleet + limit': 1000
// terminals with a fleet each, SyncEvery 1 s, a 1 s attempt timeout, a
// host of 10 workers at rho 0.9), L reached 1000 at about 11 s and the
// fleet's breaker opened at about 13 s, before the trigger at 15 s; with
// a 10 s trigger, 36.8% of the payments started before it were served,
// 100% without Config.Limit. For such a fleet no L both binds the host's
// concurrency and lets the calls through in time; leave Limit nil.
//
// # No lock
//
// Nothing is held across a caller's call. A distributed breaker that takes
// a fleet-wide lock around each request (as gobreaker v2's does) makes the
// fleet call its dependency one request at a time, and makes every call
// wait on Redis. Here the success path (Deposit, the breaker's Allow and
// Done, Outcome) is a few atomic operations on local memory: no Redis I/O,
// no lock, no allocation. Round trips happen only in the background sync, on
// a retry that finds its lease empty, and when an open breaker's probe round
// is due.
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
// has synced it for twice the longest window plus 10 s; with
// Config.Limit, the host's registry of processes is a second hash, the
// host's key + ":l", with the same expiry.
//
// On Redis Cluster, every key of a fleet is in the one slot of its hash
// tag, served by one master. While that slot has no master (a master
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
