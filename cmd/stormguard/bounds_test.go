package main

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"slices"
	"strings"
	"testing"
)

// prepareFor finds the command args name and runs only its validation: no
// simulation, no server. ok is false when args name no command.
func prepareFor(args []string) (work func() error, ok bool, err error) {
	cmds := commands()
	e := &env{stdout: new(bytes.Buffer), stderr: new(bytes.Buffer)}
	if len(args) >= 2 {
		if cmd, found := cmds[args[0]+" "+args[1]]; found {
			work, err = cmd.prepare(args[2:], e)
			return work, true, err
		}
	}
	if len(args) >= 1 {
		if cmd, found := cmds[args[0]]; found {
			work, err = cmd.prepare(args[1:], e)
			return work, true, err
		}
	}
	return nil, false, nil
}

// repeat returns n copies of item joined by commas.
func repeat(item string, n int) string {
	return strings.TrimSuffix(strings.Repeat(item+",", n), ",")
}

// badInputs are command lines that must be refused before any work: exit
// status 2, nothing on stdout, and one line on stderr containing want
// (which names the flag and, for a flag out of its range, the range).
var badInputs = []struct {
	args []string
	want string
}{
	// Commands.
	{[]string{"bogus"}, `unknown command "bogus" (run 'stormguard help')`},
	{[]string{"sim", "bogus"}, `unknown command "sim bogus" (run 'stormguard sim --help')`},
	{[]string{"sim", "jitter", "extra"}, `unexpected argument "extra"`},
	{[]string{"help", "bogus"}, `unknown command "bogus"`},
	{[]string{"demo\nmore"}, `unknown command "demo\nmore"`},
	{[]string{"--json"}, `unknown command "--json"`},

	// sim jitter.
	{[]string{"sim", "jitter", "--clients", "-1"}, `invalid value "-1" for flag -clients: want a whole number from 1 to 250000`},
	{[]string{"sim", "jitter", "--clients", "0"}, `flag -clients: want a whole number from 1 to 250000`},
	{[]string{"sim", "jitter", "--clients", "99999999999"}, `flag -clients: want a whole number from 1 to 250000`},
	{[]string{"sim", "jitter", "--clients", "99999999999999999999999"}, `flag -clients: want a whole number from 1 to 250000`},
	{[]string{"sim", "jitter", "--clients", "x"}, `invalid value "x" for flag -clients`},
	{[]string{"sim", "jitter", "--clients", ""}, `flag -clients: want a whole number`},
	{[]string{"sim", "jitter", "--clients", "1e3"}, `flag -clients: want a whole number`},
	{[]string{"sim", "jitter", "--clients"}, `flag needs an argument: -clients`},
	{[]string{"sim", "jitter", "--rounds", "0"}, `flag -rounds: want a whole number from 1 to 100`},
	{[]string{"sim", "jitter", "--rounds", "100000"}, `flag -rounds: want a whole number from 1 to 100`},
	{[]string{"sim", "jitter", "--clients", "100000000"}, `flag -clients: want a whole number from 1 to 250000`},
	{[]string{"sim", "jitter", "--clients", "250000", "--rounds", "2"}, `-clients 250000 x -rounds 2 is 500000 retries per strategy, at most 250000`},
	{[]string{"sim", "jitter", "--clients", "2501", "--rounds", "100"}, `-clients 2501 x -rounds 100 is 250100 retries per strategy, at most 250000`},
	{[]string{"sim", "jitter", "--window", "0"}, `flag -window: want a duration (e.g. 250ms) from 1µs to 1h`},
	{[]string{"sim", "jitter", "--window", "-50ms"}, `flag -window: want a duration`},
	{[]string{"sim", "jitter", "--window", "1ns"}, `flag -window: want a duration`},
	{[]string{"sim", "jitter", "--window", "2h"}, `flag -window: want a duration`},
	{[]string{"sim", "jitter", "--window", "9999999999h"}, `flag -window: want a duration`},
	{[]string{"sim", "jitter", "--window", "50"}, `flag -window: want a duration`},
	{[]string{"sim", "jitter", "--window", "NaN"}, `flag -window: want a duration`},
	{[]string{"sim", "jitter", "--base", "0"}, `flag -base: want a duration (e.g. 250ms) from 1µs to 1h`},
	{[]string{"sim", "jitter", "--cap", "2562047h"}, `flag -cap: want a duration (e.g. 250ms) from 1µs to 1h`},
	{[]string{"sim", "jitter", "--cap", "1ms"}, `-cap 1ms must be at least -base 100ms`},
	{[]string{"sim", "jitter", "--seed", "-1"}, `flag -seed: want a whole number from 0 to 4294967295`},
	{[]string{"sim", "jitter", "--seed", "4294967296"}, `flag -seed: want a whole number from 0 to 4294967295`},
	{[]string{"sim", "jitter", "--strategies", "full,bogus"}, `-strategies: unknown strategy "bogus" (want some of none, full, equal, decorrelated)`},
	{[]string{"sim", "jitter", "--strategies", ""}, `-strategies "": empty item`},
	{[]string{"sim", "jitter", "--strategies", "full,"}, `-strategies "full,": empty item`},
	{[]string{"sim", "jitter", "--strategies", "full, full"}, `-strategies: "full" is listed twice`},
	{[]string{"sim", "jitter", "--strategies", repeat("full", 1001)}, `-strategies: 1001 items, at most 1000`},
	{[]string{"sim", "jitter", "--strategies", "FULL"}, `unknown strategy "FULL"`},
	{[]string{"sim", "jitter", "--clients", "10", "--clients", "20"}, `invalid value "20" for flag -clients: flag given more than once`},
	{[]string{"sim", "jitter", "--json", "--json"}, `invalid boolean flag json: flag given more than once`},
	{[]string{"sim", "jitter", "--json=maybe"}, `invalid boolean value "maybe" for -json`},
	{[]string{"sim", "jitter", "--nope"}, `flag provided but not defined: -nope`},
	{[]string{"sim", "jitter", "--no\npe"}, `flag provided but not defined: -no\npe`},
	{[]string{"sim", "jitter", "---clients", "1"}, `bad flag syntax: ---clients`},
	{[]string{"sim", "jitter", "--chart", "out.gif"}, `-chart: chart file "out.gif": want a .png or .svg name`},
	{[]string{"sim", "jitter", "--chart", "/no/such/dir/out.png"}, `-chart "/no/such/dir/out.png": no directory "/no/such/dir" to write it in`},

	// sim layers.
	{[]string{"sim", "layers", "--layers", "0"}, `flag -layers: want a whole number from 1 to 10`},
	{[]string{"sim", "layers", "--layers", "11"}, `flag -layers: want a whole number from 1 to 10`},
	{[]string{"sim", "layers", "--attempts", "0"}, `flag -attempts: want a whole number from 1 to 1000000`},
	{[]string{"sim", "layers", "--attempts", "-3"}, `flag -attempts: want a whole number from 1 to 1000000`},
	{[]string{"sim", "layers", "--attempts", "100"}, `-attempts 100 ^ -layers 4 is more than 1000000 calls per request`},
	{[]string{"sim", "layers", "--rate", "0"}, `flag -rate: want a finite number from 0.001 to 1e+06`},
	{[]string{"sim", "layers", "--rate", "-5"}, `flag -rate: want a finite number from 0.001 to 1e+06`},
	{[]string{"sim", "layers", "--rate", "NaN"}, `flag -rate: want a finite number`},
	{[]string{"sim", "layers", "--rate", "Inf"}, `flag -rate: want a finite number`},
	{[]string{"sim", "layers", "--rate", "-Inf"}, `flag -rate: want a finite number`},
	{[]string{"sim", "layers", "--rate", "1e400"}, `flag -rate: want a finite number`},
	{[]string{"sim", "layers", "--rate", "2e6"}, `flag -rate: want a finite number`},
	{[]string{"sim", "layers", "--rate", "fast"}, `flag -rate: want a finite number`},
	{[]string{"sim", "layers", "--duration", "0"}, `flag -duration: want a duration (e.g. 250ms) from 1ms to 24h`},
	{[]string{"sim", "layers", "--duration", "25h"}, `flag -duration: want a duration`},
	{[]string{"sim", "layers", "--warmup", "-1s"}, `flag -warmup: want a duration (e.g. 250ms) from 0s to 24h`},
	{[]string{"sim", "layers", "--warmup", "20s"}, `-warmup 20s must be less than -duration 20s`},
	{[]string{"sim", "layers", "--rate", "1e6", "--duration", "2s", "--warmup", "1s"}, `-rate 1e+06 x -duration 2s is 2000000 requests, at most 1000000`},
	{[]string{"sim", "layers", "--budget-ratio", "1.5"}, `flag -budget-ratio: want a finite number from 0 to 1`},
	{[]string{"sim", "layers", "--budget-ratio", "NaN"}, `flag -budget-ratio: want a finite number from 0 to 1`},
	{[]string{"sim", "layers", "--layers", "10", "--attempts", "3", "--budget-ratio", "1", "--rate", "1000", "--duration", "100s"},
		`-layers 10 with -attempts 3, -budget-ratio 1 and 100000 requests (-rate x -duration) is about`},
	{[]string{"sim", "layers", "--seed", "18446744073709551616"}, `flag -seed: want a whole number from 0 to 18446744073709551615`},

	// sim outage.
	{[]string{"sim", "outage", "--clients", "0"}, `flag -clients: want a whole number from 1 to 100000`},
	{[]string{"sim", "outage", "--clients", "100001"}, `flag -clients: want a whole number from 1 to 100000`},
	{[]string{"sim", "outage", "--rate", "0"}, `flag -rate: want a finite number from 0.001 to 1e+06`},
	{[]string{"sim", "outage", "--rate", "+Inf"}, `flag -rate: want a finite number`},
	{[]string{"sim", "outage", "--capacity", "0"}, `flag -capacity: want a finite number from 0.01 to 1e+07`},
	{[]string{"sim", "outage", "--capacity", "NaN"}, `flag -capacity: want a finite number`},
	{[]string{"sim", "outage", "--capacity", "1e-300"}, `flag -capacity: want a finite number`},
	{[]string{"sim", "outage", "--queue", "0"}, `flag -queue: want a whole number from 1 to 10000000`},
	{[]string{"sim", "outage", "--queue", "9223372036854775807"}, `flag -queue: want a whole number from 1 to 10000000`},
	{[]string{"sim", "outage", "--timeout", "0"}, `flag -timeout: want a duration (e.g. 250ms) from 1ms to 1h`},
	{[]string{"sim", "outage", "--trigger-start", "-1s"}, `flag -trigger-start: want a duration (e.g. 250ms) from 0s to 24h`},
	{[]string{"sim", "outage", "--trigger-start", "20s"}, `-trigger-start 20s must not be after -trigger-end 15s`},
	{[]string{"sim", "outage", "--trigger-end", "2m"}, `-trigger-end 2m must end at least the recovery window 1s before -horizon 1m30s`},
	{[]string{"sim", "outage", "--trigger-start", "1m", "--trigger-end", "1m30s"}, `-trigger-end 1m30s must end at least the recovery window 1s before -horizon 1m30s`},
	{[]string{"sim", "outage", "--retry-after", "-1s"}, `flag -retry-after: want a duration (e.g. 250ms) from 0s to 1h`},
	{[]string{"sim", "outage", "--retry-after", "2h"}, `flag -retry-after: want a duration`},
	{[]string{"sim", "outage", "--horizon", "0"}, `flag -horizon: want a duration (e.g. 250ms) from 1ms to 24h`},
	{[]string{"sim", "outage", "--horizon", "1000h"}, `flag -horizon: want a duration`},
	{[]string{"sim", "outage", "--window", "0"}, `flag -window: want a duration (e.g. 250ms) from 1ms to 1s`},
	{[]string{"sim", "outage", "--window", "2s"}, `flag -window: want a duration`},
	{[]string{"sim", "outage", "--window", "3ms"}, `-window 3ms must divide the recovery window 1s`},
	{[]string{"sim", "outage", "--window", "1s", "--horizon", "500ms", "--trigger-start", "0s", "--trigger-end", "0s"}, `-window 1s must not be longer than -horizon 500ms`},
	{[]string{"sim", "outage", "--window", "1ms", "--horizon", "200s"}, `-horizon 3m20s / -window 1ms is 200000 windows, at most 100000`},
	{[]string{"sim", "outage", "--clients", "100000", "--rate", "1"}, `-clients 100000 x -rate 1 x -horizon 1m30s is 9000000 requests, at most 100000`},
	{[]string{"sim", "outage", "--low-volume", "--rate", "0.3"}, `-clients 8000 x -rate 0.3 x -horizon 1m30s is 216000 requests, at most 100000`},
	{[]string{"sim", "outage", "--low-volume", "--rate", "100"}, `-clients 8000 x -rate 100 x -horizon 1m30s is 72000000 requests, at most 100000`},
	{[]string{"sim", "outage", "--rate", "1e6"}, `-clients 8 x -rate 1e+06 x -horizon 1m30s is 720000000 requests`},
	{[]string{"sim", "outage", "--policies", "bogus"}, `-policies: unknown policy "bogus" (want some of fixed-1s,`},
	{[]string{"sim", "outage", "--policies", ""}, `-policies "": empty item`},
	{[]string{"sim", "outage", "--policies", "full,full"}, `-policies: "full" is listed twice`},
	{[]string{"sim", "outage", "--low-volume", "--low-volume"}, `invalid boolean flag low-volume: flag given more than once`},

	// sim meta.
	{[]string{"sim", "meta", "--rho", "0"}, `flag -rho: want a finite number from 0.01 to 2`},
	{[]string{"sim", "meta", "--rho", "NaN"}, `flag -rho: want a finite number`},
	{[]string{"sim", "meta", "--clients", "0"}, `flag -clients: want a whole number from 1 to 1000`},
	{[]string{"sim", "meta", "--capacity", "1e6"}, `flag -capacity: want a finite number from 1 to 100000`},
	{[]string{"sim", "meta", "--workers", "0"}, `flag -workers: want a whole number from 1 to 1000`},
	{[]string{"sim", "meta", "--workers", "4", "--triggers", "cut80"}, `-workers 4: the capacity cut needs at least 5 workers, not 4`},
	{[]string{"sim", "meta", "--queue-seconds", "0"}, `flag -queue-seconds: want a finite number from 0.001 to 600`},
	{[]string{"sim", "meta", "--queue-seconds", "0.001", "--capacity", "10"}, `a queue of 0.001 s at 10/s must hold at least one request`},
	{[]string{"sim", "meta", "--timeout", "0"}, `flag -timeout: want a duration (e.g. 250ms) from 1ms to 1h`},
	{[]string{"sim", "meta", "--deadline", "2h"}, `flag -deadline: want a duration (e.g. 250ms) from 1ms to 1h`},
	{[]string{"sim", "meta", "--trigger-start", "55s"}, `-trigger-start 55s + -trigger-for 10s must end at least 1s before -horizon 1m`},
	{[]string{"sim", "meta", "--trigger-start", "50s"}, `-trigger-start 50s + -trigger-for 10s must end at least 1s before -horizon 1m`},
	{[]string{"sim", "meta", "--horizon", "500ms"}, `flag -horizon: want a duration (e.g. 250ms) from 1s to 1h`},
	{[]string{"sim", "meta", "--horizon", "1h"}, `-rho 0.9 x -capacity 1000 x -horizon 1h is 3240000 requests, at most 200000`},
	{[]string{"sim", "meta", "--triggers", "flood"}, `-triggers: unknown trigger "flood" (want some of 503, hang, slow5x, cut80)`},
	{[]string{"sim", "meta", "--triggers", "503,503"}, `-triggers: "503" is listed twice`},
	{[]string{"sim", "meta", "--policies", "bogus"}, `-policies: unknown policy "bogus" (want some of fixed-1s, backoff, stormguard, +wait, +limit)`},
	{[]string{"sim", "meta", "--wide", "--wide"}, `flag given more than once`},

	// sim contention.
	{[]string{"sim", "contention", "--clients", "0"}, `-clients: "0" is not a whole number from 1 to 1000`},
	{[]string{"sim", "contention", "--clients", "1001"}, `-clients: "1001" is not a whole number from 1 to 1000`},
	{[]string{"sim", "contention", "--clients", "-5"}, `-clients: "-5" is not a whole number from 1 to 1000`},
	{[]string{"sim", "contention", "--clients", ""}, `-clients "": empty item`},
	{[]string{"sim", "contention", "--clients", "a,b"}, `-clients: "a" is not a whole number from 1 to 1000`},
	{[]string{"sim", "contention", "--clients", "10,10"}, `-clients: "10" is listed twice`},
	{[]string{"sim", "contention", "--clients", "30-10"}, `-clients "30-10": want a range FROM-TO/STEP with 1 <= FROM <= TO <= 1000`},
	{[]string{"sim", "contention", "--clients", "10-"}, `-clients "10-": want a range`},
	{[]string{"sim", "contention", "--clients", "1-1000/0"}, `-clients "1-1000/0": want a range`},
	{[]string{"sim", "contention", "--clients", "9223372036854775806-9223372036854775807"}, `-clients "9223372036854775806-9223372036854775807": want a range`},
	{[]string{"sim", "contention", "--clients", "1-1000"}, `-runs 100 x 5 -strategies x 333833500 (the sum of the squared -clients) is 166916750000, at most 100000000`},
	{[]string{"sim", "contention", "--clients", "1000", "--runs", "10000"}, `-runs 10000 x 5 -strategies x 1000000 (the sum of the squared -clients) is 50000000000, at most 100000000`},
	{[]string{"sim", "contention", "--runs", "0"}, `flag -runs: want a whole number from 1 to 10000`},
	{[]string{"sim", "contention", "--runs", "10001"}, `flag -runs: want a whole number from 1 to 10000`},
	{[]string{"sim", "contention", "--base", "0"}, `flag -base: want a duration (e.g. 250ms) from 1µs to 1h`},
	{[]string{"sim", "contention", "--cap", "2h"}, `flag -cap: want a duration (e.g. 250ms) from 1µs to 1h`},
	{[]string{"sim", "contention", "--cap", "1ms"}, `-cap 1ms must be at least -base 5ms`},
	{[]string{"sim", "contention", "--delay", "-1ms"}, `flag -delay: want a duration (e.g. 250ms) from 0s to 1h`},
	{[]string{"sim", "contention", "--delay-stddev", "2h"}, `flag -delay-stddev: want a duration (e.g. 250ms) from 0s to 1h`},
	{[]string{"sim", "contention", "--strategies", "fast"}, `-strategies: unknown strategy "fast" (want some of none, exponential, full, equal, decorrelated)`},
	{[]string{"sim", "contention", "--strategies", ""}, `-strategies "": empty item`},
	{[]string{"sim", "contention", "--strategies", "full,full"}, `-strategies: "full" is listed twice`},

	// demo.
	{[]string{"demo", "--clients", "0"}, `flag -clients: want a whole number from 1 to 5000`},
	{[]string{"demo", "--clients", "5001"}, `flag -clients: want a whole number from 1 to 5000`},
	{[]string{"demo", "--every", "0s"}, `flag -every: want a duration (e.g. 250ms) from 1ms to 1m`},
	{[]string{"demo", "--every", "1h"}, `flag -every: want a duration`},
	{[]string{"demo", "--duration", "0"}, `flag -duration: want a duration (e.g. 250ms) from 1ms to 20s`},
	{[]string{"demo", "--duration", "1h"}, `flag -duration: want a duration`},
	{[]string{"demo", "--fail-at", "-1s"}, `flag -fail-at: want a duration (e.g. 250ms) from 0s to 20s`},
	{[]string{"demo", "--fail-for", "1h"}, `flag -fail-for: want a duration (e.g. 250ms) from 0s to 20s`},
	{[]string{"demo", "--retry-after", "2m"}, `flag -retry-after: want a duration (e.g. 250ms) from 0s to 1m`},
	{[]string{"demo", "--window", "0"}, `flag -window: want a duration (e.g. 250ms) from 1ms to 10s`},
	{[]string{"demo", "--naive-every", "0"}, `flag -naive-every: want a duration (e.g. 250ms) from 1ms to 1m`},
	{[]string{"demo", "--naive-tries", "0"}, `flag -naive-tries: want a whole number from 1 to 100`},
	{[]string{"demo", "--naive-tries", "1000"}, `flag -naive-tries: want a whole number from 1 to 100`},
	{[]string{"demo", "--deadline", "0"}, `flag -deadline: want a duration (e.g. 250ms) from 1ms to 20s`},
	{[]string{"demo", "--deadline", "1h"}, `flag -deadline: want a duration`},
	{[]string{"demo", "--open-for", "-1s"}, `flag -open-for: want a duration (e.g. 250ms) from 1ms to 1h`},
	{[]string{"demo", "--capacity", "-1"}, `flag -capacity: want a whole number from 0 to 10000`},
	{[]string{"demo", "--queue", "-1"}, `flag -queue: want a whole number from 0 to 100000`},
	{[]string{"demo", "--work", "11s"}, `flag -work: want a duration (e.g. 250ms) from 0s to 10s`},
	{[]string{"demo", "--attempt-timeout", "-1s"}, `flag -attempt-timeout: want a duration (e.g. 250ms) from 0s to 1m`},
	{[]string{"demo", "--clients", "5000", "--every", "100ms"}, `-clients 5000 / -every 100ms is 50000 requests per second, at most 2000`},
	{[]string{"demo", "--clients", "2001", "--every", "1s"}, `-clients 2001 / -every 1s is 2001 requests per second, at most 2000`},
	{[]string{"demo", "--clients", "2000", "--every", "1s", "--deadline", "20s"}, `-clients 2000 / -every 1s x -deadline 20s is 40000 calls in flight, at most 20000`},
	{[]string{"demo", "--metrics", ":1", "--metrics", ":2"}, `flag given more than once`},
}

func TestBadInputsAreRefused(t *testing.T) {
	for _, tt := range badInputs {
		t.Run(fmt.Sprintf("%q", tt.args), func(t *testing.T) {
			// Validation alone refuses it: no work is ever started.
			if work, ok, err := prepareFor(tt.args); ok {
				var ue usageError
				if !errors.As(err, &ue) || work != nil {
					t.Fatalf("prepare(%q) = work %v, error %v; want no work and a usage error", tt.args, work != nil, err)
				}
			}
			code, out, errs := runCLI(t, tt.args...)
			if code != 2 || out != "" || strings.Count(errs, "\n") != 1 || !strings.HasSuffix(errs, "\n") || !strings.Contains(errs, tt.want) {
				t.Errorf("run(%q) = exit %d, stdout %q, stderr %q; want exit 2, no stdout and one stderr line containing %q",
					tt.args, code, out, errs, tt.want)
			}
		})
	}
}

// goodInputs are accepted by validation, most at the limits. They are not
// run: only their validation is checked.
var goodInputs = [][]string{
	{"sim", "jitter"},
	{"sim", "jitter", "--clients", "250000", "--rounds", "1", "--window", "1us"},
	{"sim", "jitter", "--clients", "2500", "--rounds", "100", "--cap", "1h", "--base", "1h"},
	{"sim", "jitter", "--seed", "4294967295", "--strategies", " none , full "},
	{"sim", "layers", "--layers", "10", "--attempts", "3"},
	{"sim", "layers", "--layers", "1", "--attempts", "1000000"},
	{"sim", "layers", "--rate", "1e6", "--duration", "1s", "--warmup", "0s", "--layers", "1"},
	{"sim", "layers", "--seed", "18446744073709551615", "--rate", "0.001", "--duration", "24h"},
	{"sim", "outage"},
	{"sim", "outage", "--low-volume"},
	{"sim", "outage", "--clients", "100000", "--rate", "0.1", "--horizon", "10s", "--trigger-start", "2s", "--trigger-end", "5s"},
	{"sim", "outage", "--window", "1ms", "--horizon", "100s", "--capacity", "1e7", "--queue", "10000000"},
	{"sim", "outage", "--horizon", "24h", "--rate", "0.001", "--window", "1s"},
	{"sim", "meta"},
	{"sim", "meta", "--rho", "1", "--capacity", "1e5", "--horizon", "2s", "--trigger-start", "0s", "--trigger-for", "1s", "--workers", "1000", "--triggers", "503,hang"},
	{"sim", "meta", "--workers", "1", "--triggers", "503,hang,slow5x", "--policies", "+limit, fixed-1s", "--wide"},
	{"sim", "meta", "--queue-seconds", "0.001", "--capacity", "1000", "--trigger-start", "0s", "--trigger-for", "59s"},
	{"sim", "contention"},
	{"sim", "contention", "--clients", "1000", "--runs", "20"},
	{"sim", "contention", "--clients", "1000", "--runs", "100", "--strategies", "none"},
	{"sim", "contention", "--clients", "1-10", "--runs", "10000"},
	{"sim", "contention", "--clients", "5, 10 ,20", "--delay", "0s", "--delay-stddev", "1h"},
	{"demo"},
	{"demo", "--clients", "5000", "--every", "2500ms", "--deadline", "10s", "--duration", "20s"},
	{"demo", "--capacity", "0", "--queue", "0", "--work", "0s", "--attempt-timeout", "0s"},
}

func TestGoodInputsAreAccepted(t *testing.T) {
	for _, args := range goodInputs {
		work, ok, err := prepareFor(args)
		if !ok || err != nil || work == nil {
			t.Errorf("prepare(%q) = work %v, error %v; want work", args, work != nil, err)
		}
	}
}

func TestUsage(t *testing.T) {
	for _, tt := range []struct {
		args     []string
		code     int
		toStdout bool
		want     []string
	}{
		{nil, 2, false, []string{"Usage: stormguard <command>", "sim jitter", "sim contention", "demo"}},
		{[]string{"help"}, 0, true, []string{"Usage: stormguard <command>", "sim jitter", "demo"}},
		{[]string{"-h"}, 0, true, []string{"Usage: stormguard <command>"}},
		{[]string{"--help"}, 0, true, []string{"Usage: stormguard <command>"}},
		{[]string{"-help"}, 0, true, []string{"Usage: stormguard <command>"}},
		{[]string{"help", "help"}, 0, true, []string{"Usage: stormguard <command>"}},
		{[]string{"sim"}, 2, false, []string{"Usage: stormguard sim <command>", "jitter", "layers", "outage", "contention"}},
		{[]string{"sim", "--help"}, 0, true, []string{"Usage: stormguard sim <command>", "jitter", "layers", "outage", "contention"}},
		{[]string{"sim", "-h"}, 0, true, []string{"Usage: stormguard sim <command>"}},
		{[]string{"sim", "help"}, 0, true, []string{"Usage: stormguard sim <command>"}},
		{[]string{"help", "sim"}, 0, true, []string{"Usage: stormguard sim <command>"}},
		{[]string{"help", "sim", "jitter"}, 0, true, []string{"Usage: stormguard sim jitter [flags]", "-strategies string\n", "-json\n", "-chart FILE\n"}},
		{[]string{"sim", "jitter", "--help"}, 0, true, []string{"Usage: stormguard sim jitter [flags]",
			"-clients int\n    \tnumber of clients, 1 to 250000 (default 1000)", "Limits: clients x rounds at most 250000"}},
		{[]string{"sim", "layers", "-h"}, 0, true, []string{"Usage: stormguard sim layers", "-rate number", "0.001 to 1e+06", "Limits:"}},
		{[]string{"sim", "outage", "--help"}, 0, true, []string{"Usage: stormguard sim outage", "-window duration", "1ms to 1s (default 100ms)", "Limits:"}},
		{[]string{"sim", "contention", "--help"}, 0, true, []string{"Usage: stormguard sim contention", "-runs int", "Limits:"}},
		{[]string{"sim", "meta", "--help"}, 0, true, []string{"Usage: stormguard sim meta", "-rho number", "0.01 to 2 (default 0.9)", "-wide", "Limits:"}},
		{[]string{"demo", "--help"}, 0, true, []string{"Usage: stormguard demo", "-duration duration", "1ms to 20s (default 7s)", "Limits:"}},
	} {
		code, out, errs := runCLI(t, tt.args...)
		text, other := out, errs
		if !tt.toStdout {
			text, other = errs, out
		}
		if code != tt.code || other != "" {
			t.Errorf("run(%q) = exit %d, stdout %q, stderr %q; want exit %d, usage on one of them", tt.args, code, out, errs, tt.code)
			continue
		}
		for _, w := range tt.want {
			if !strings.Contains(text, w) {
				t.Errorf("run(%q) usage lacks %q:\n%s", tt.args, w, text)
			}
		}
	}
}

// Every number or duration flag states its range in the help.
func TestHelpStatesEveryRange(t *testing.T) {
	for name, cmd := range commands() {
		var out bytes.Buffer
		e := &env{stdout: &out, stderr: new(bytes.Buffer)}
		if _, err := cmd.prepare([]string{"--help"}, e); !errors.Is(err, flag.ErrHelp) {
			t.Fatalf("%s --help: %v", name, err)
		}
		lines := strings.Split(out.String(), "\n")
		for i, l := range lines {
			for _, kind := range []string{" int", " uint", " number", " duration"} {
				if strings.HasPrefix(l, "  -") && strings.HasSuffix(l, kind) && !strings.Contains(lines[i+1], " to ") {
					t.Errorf("%s --help: %q has no range: %q", name, l, lines[i+1])
				}
			}
		}
	}
}

// FuzzPrepare feeds arbitrary command lines (arguments separated by NUL) to
// each command's validation: it must accept them or refuse them with a
// usage error of one line, never panic or hang, and never start work.
func FuzzPrepare(f *testing.F) {
	names := make([]string, 0)
	for n := range commands() {
		names = append(names, n)
	}
	slices.Sort(names)
	for _, tt := range badInputs {
		for i, n := range names {
			if rest, ok := strings.CutPrefix(strings.Join(tt.args, " "), n+" "); ok {
				f.Add(uint8(i), strings.ReplaceAll(rest, " ", "\x00"))
			}
		}
	}
	for _, args := range goodInputs {
		for i, n := range names {
			if rest, ok := strings.CutPrefix(strings.Join(args, "\x00"), strings.ReplaceAll(n, " ", "\x00")); ok {
				f.Add(uint8(i), strings.TrimPrefix(rest, "\x00"))
			}
		}
	}
	f.Fuzz(func(t *testing.T, which uint8, argv string) {
		name := names[int(which)%len(names)]
		var args []string
		if argv != "" {
			args = strings.Split(argv, "\x00")
		}
		var out bytes.Buffer
		e := &env{stdout: &out, stderr: new(bytes.Buffer)}
		work, err := commands()[name].prepare(args, e)
		var ue usageError
		switch {
		case err == nil:
			if work == nil {
				t.Fatalf("%s %q: no error and no work", name, args)
			}
		case errors.Is(err, flag.ErrHelp):
			if work != nil || !strings.HasPrefix(out.String(), "Usage: stormguard "+name) {
				t.Fatalf("%s %q: help, work %v, output %q", name, args, work != nil, out.String())
			}
		case !errors.As(err, &ue) || work != nil:
			t.Fatalf("%s %q: error %v (%T), work %v; want a usage error and no work", name, args, err, err, work != nil)
		case strings.Contains(oneLine(err.Error()), "\n"):
			t.Fatalf("%s %q: error %q is not one line", name, args, err)
		}
	})
}

// FuzzParseInts checks the N values of `sim contention --clients`: any
// string gives distinct values in range, at most maxListItems of them, or
// an error, and returns at once.
func FuzzParseInts(f *testing.F) {
	for _, s := range []string{"10-150/10", "10,20,50", "1-1000", "9223372036854775806-9223372036854775807", "-5", "5-", "1-1000/0", " 3 - 9 / 2 ", "a,b", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		ns, err := parseInts("clients", s, 1, 1000)
		if err != nil {
			if ns != nil || strings.Contains(oneLine(err.Error()), "\n") {
				t.Fatalf("parseInts(%q) = %v, %q", s, ns, err)
			}
			return
		}
		if len(ns) == 0 || len(ns) > maxListItems {
			t.Fatalf("parseInts(%q) = %d values", s, len(ns))
		}
		seen := map[int]bool{}
		for _, n := range ns {
			if n < 1 || n > 1000 || seen[n] {
				t.Fatalf("parseInts(%q) = %v: %d out of range or repeated", s, ns, n)
			}
			seen[n] = true
		}
	})
}
