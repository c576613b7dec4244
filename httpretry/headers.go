package httpretry

import (
	"errors"
	"net/http"
	"strconv"
	"time"

	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/retry"
	"github.com/stormguard/stormguard/wire"
)

// giveUpTokens are the reason tokens of a wire.GiveUpHeader value, indexed
// by retry.Reason (wire.ParseGiveUp reads them; a test checks each one
// parses back to itself).
var giveUpTokens = [...]string{
	retry.NotRetryable:      "not-retryable",
	retry.AttemptsExhausted: "attempts-exhausted",
	retry.Deadline:          "deadline",
	retry.Canceled:          "canceled",
	retry.BudgetExhausted:   "budget-exhausted",
	retry.CircuitOpen:       "circuit-open",
}

// giveUpValue returns the wire.GiveUpHeader value of a give-up.
func giveUpValue(re *retry.Error) string {
	tok := "unknown"
	if int(re.Reason) < len(giveUpTokens) && giveUpTokens[re.Reason] != "" {
		tok = giveUpTokens[re.Reason]
	}
	v := tok + ";attempts=" + strconv.Itoa(re.Attempts)
	if d := retryIn(re); d > 0 {
		v += ";retry-after=" + strconv.FormatInt(int64((d+time.Second-1)/time.Second), 10)
	}
	return v
}

// retryIn returns how long until the host may be tried again, as far as a
// give-up tells: the breaker's time until its next probe round, the sleep
// the loop refused, or the server's hint.
func retryIn(re *retry.Error) time.Duration {
	var oe *breaker.OpenError
	if errors.As(re, &oe) && oe.Wait > 0 {
		return oe.Wait
	}
	if re.Delay > 0 {
		return re.Delay
	}
	return retry.RetryAfter(re.Err)
}

// attemptValues returns the header values for attempts 1 to n, built once
// per Transport: every attempt shares them and nobody modifies them.
func attemptValues(n int) [][]string {
	vs := make([][]string, n)
	for i := range vs {
		vs[i] = []string{strconv.Itoa(i + 1)}
	}
	return vs
}

// dontRetry reports whether the layer below said not to retry resp's
// request: the don't-retry signal, or a give-up of its own (a Transport
// under this one, or a handler that copied its dependency's give-up).
func dontRetry(h http.Header) bool {
	return wire.DontRetry(h) || len(h[wire.GiveUpHeader]) > 0
}
