// Package timed lets the retry loop of this module hand its budget and its
// breaker the clock reading it already made, without publishing a second
// way to inject time: users give a budget or a breaker its clock in
// Config.Now (or run in a testing/synctest bubble), and that is all.
//
// The retry loop reads the clock once per call. When its budget and its
// breaker both run on the default clock, that one reading serves the
// budget's deposit and the breaker's record of a success (a second reading
// would cost about a third of a guarded call). Packages budget and breaker
// set the variables below when they are initialised, to functions that
// reach their unexported methods; package retry type-asserts them once,
// when a Policy is built. This is the pattern of grpc-go's internal
// package.
package timed

// Deposit is a func(*budget.Budget, time.Time) that records an original
// request at a time read from the budget's clock. Set by package budget.
var Deposit any

// Success is a func(*breaker.Breaker, breaker.Permit, bool, time.Duration,
// time.Time), the breaker's own record of an outcome: called with (b, p,
// true, 0, t) it records the success of the call p was issued for at t, a
// time read from the breaker's clock, as b.Done(p, true) does at its own
// reading (a zero t means: read the clock). Set by package breaker.
var Success any
