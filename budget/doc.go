// Package budget is a per-client retry budget: retries are allowed only
// while they stay under a fraction of the client's requests over a sliding
// time window, plus a small floor so that a quiet client can still retry.
//
// This is the shape of the Google SRE book's per-client retry budget and of
// Finagle's RetryBudget, Linkerd's retry budget and tower's TpsBudget: every
// original request [Budget.Deposit]s, every retry [Budget.Withdraw]s, and a
// withdrawal is refused once the window's retries would exceed
//
//	Ratio·requests + MinPerSecond·Window.Seconds()
//
// When the budget refuses, the caller fails fast with its last error
// instead of retrying. During a total outage a client then sends about
// (1 + Ratio) times its normal load, not the 3x that three attempts per
// request would cost.
//
// # The admission rule, exactly
//
// Time is cut into slices of Window/Slices, aligned to the moment [New] ran.
// The window at time t is the slice holding t and the Slices−1 slices before
// it (so it covers between Window−Window/Slices and Window of the past). A
// withdrawal at t is admitted if and only if
//
//	retries + 1 <= Ratio·requests + MinPerSecond·Window.Seconds()
//
// where requests and retries are the deposits and the admitted withdrawals
// whose slices lie in that window, and the right-hand side is computed in
// float64, its rounding allowed for (a relative 10⁻¹², so that 0.29·100,
// 28.999999999999996, admits 29). So at every admission the window's admitted retries, this one
// included, are at most Ratio·requests + MinPerSecond·Window.Seconds(). It
// follows that over any window of whole slices, whether or not it ends in
// an admission, the retries are at most Ratio times the requests of that
// window and the one before it, plus MinPerSecond·Window.Seconds(): a
// window's last admission was checked against a window that began at most
// one window earlier. A span of one Window that starts inside a slice may
// hold the floor twice (the retries of its first, partial slice are not in
// its last admission's window): at most Ratio times the requests of that
// span and the Window before it, plus 2·MinPerSecond·Window.Seconds() (a
// quiet client may get 20 retries in 9 s with the defaults). A
// slice expires exactly when its Slices-th successor begins. Requests and
// retries count up to 16,777,215 per slice and saturate there (a saturated
// request count only makes the budget stricter; at the retry limit every
// withdrawal is refused). Slices are numbered modulo 2^40 in the
// counters, and a clock reading is measured from the budget's creation as
// a time.Duration: the rule holds while the clock readings of a budget's
// calls are less than 2^39 slices apart (17 years with slices of a
// millisecond), no reading is more than 2^32 slices before New's (a
// Config.Now that goes back 50 days with 1 ms slices, 136 years with the
// default 1 s ones: earlier slices lose their deposits and count their
// retries as never expiring), and within about 292 years of New (the
// range of a time.Duration; the monotonic clock of time.Now never leaves
// it, nor goes back); a budget left unused longer, or a Config.Now that
// jumps so far, may count a window of that long ago again, or, past 292
// years, stop sliding (every later reading falls in one slice).
//
// # Concurrency
//
// A [Budget] is meant to be shared by every goroutine of a client. Deposit
// and Withdraw take no lock and allocate nothing: each slice is one atomic
// word per counter holding the slice number and the count, reset by
// compare-and-swap when its slice number is stale; retries are admitted by a
// compare-and-swap on one word holding the newest slice's retry count, so
// two goroutines can never both take the last retry of a window. Under any
// interleaving the rule above holds at every admission; a deposit that races
// with a withdrawal may be counted as if it came after it, which can only
// make the withdrawal stricter.
//
// Time never runs backwards inside a budget: a withdrawal whose clock
// reading is older than the newest slice in which a retry was admitted
// counts as happening in that newest slice (as golang.org/x/time/rate
// treats such times). Each counter word is reused every Slices slices; a
// deposit whose word already holds a later slice has expired and is
// dropped, and a word taken over by a later slice no longer counts for an
// earlier window. Both only matter when the clock (Config.Now) goes back,
// or goroutines read it and reach the budget in a different order, and
// both can only make the budget stricter.
//
// # The floor, and the limit of a per-client budget
//
// The defaults (a zero [Config]) are Ratio 0.1 (the SRE book's 10%), a 10 s
// window in ten 1 s slices, and MinPerSecond 1, a floor of 10 retries per
// window.
// Finagle, Linkerd and tower default to a 20% ratio plus 10 retries per
// second (100 per 10 s window). With that floor a client sending fewer than
// 50 requests per second may retry 40% or more of its requests, twice their
// own ratio and four times the SRE book's 10%, which is what keeps an outage
// at about 1.1x the normal load. With 1 per second the floor equals the 10%
// ratio's share at 10 requests per second, so from there on a client is held
// to between 10% and 20% (11% at 100 requests per second), while a client
// that sends a request every few seconds can still retry an occasional
// failure.
//
// The floor is also the limit of a per-client budget: it is granted to
// every client. A fleet of N low-volume clients is allowed N·MinPerSecond
// retries per second however little each one sends, so the fleet as a
// whole is not held to Ratio: a thousand POS terminals each sending one
// request a minute may, during an outage, retry every failed request (only
// the per-request attempt limit then bounds them). Holding a whole fleet to
// 10% needs a budget shared across the fleet (module fleet shares one
// through Redis; retry.Budget is the interface it implements).
package budget
