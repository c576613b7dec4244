package idemtest

// DefaultPaymentsHere is what [Payments] returns without PaymentsEnv in
// this build: RacePayments under the race detector, DefaultPayments
// otherwise.
var DefaultPaymentsHere = map[bool]int{false: DefaultPayments, true: RacePayments}[raceDetector]
