// Package timed lets the retry loop of this module hand its budget the
// clock reading it already made, without publishing a second way to inject
// time: users give a budget its clock in Config.Now (or run in a
// testing/synctest bubble), and that is all.
//
// It also lets the loop restamp a breaker's permit (see Restamp) and ask
// whether a permit is still current (see Current).
//
// A retry loop that reads the clock for a call's deadline or its attempt
// timeout deposits the call's first attempt into a budget on the default
// clock at that reading, not at a second one. (The breaker reads its own
// clock when it is told of a success: a success counts where the attempt
// ended, and the loop has no reading of that time.) Package budget sets
// the variable below when it is initialised, to a function that reaches
// its unexported method; package retry type-asserts it once, when a
// Policy is built. This is the pattern of grpc-go's internal package.
package timed

// Deposit is a func(*budget.Budget, time.Time) that records an original
// request at a time read from the budget's clock (or from time.Now, for a
// budget on the default clock). Set by package budget.
var Deposit any

// Current is a func(*breaker.Breaker, breaker.Permit) bool that reports
// whether the permit's generation is the breaker's current one: the retry
// loop asks after a wait for a concurrency limiter's slot, and sends
// nothing on a permit the breaker moved past (a probe of a round that
// ended, even if another round began since). Set by package breaker.
var Current any

// Restamp is a func(*breaker.Breaker, breaker.Permit) breaker.Permit that
// returns the permit as issued now, for a breaker with Config.SlowCall: the
// retry loop restamps a permit after it waited for a concurrency limiter's
// slot, so that the wait does not count as the dependency's slowness. Set
// by package breaker.
var Restamp any
