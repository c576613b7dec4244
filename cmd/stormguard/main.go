// Command stormguard shows retry storms and how stormguard tames them.
//
// Usage:
//
//	stormguard demo [flags]             live on loopback: a failing provider and a fleet
//	stormguard sim jitter [flags]       how retries of clients that failed together cluster in time
//	stormguard sim layers [flags]       how retries multiply across layers
//	stormguard sim outage [flags]       a fleet against a provider that fails for a while
//	stormguard sim meta [flags]         metastability: client setups x triggers near capacity
//	stormguard sim contention [flags]   optimistic concurrency on one row
//	stormguard version                  the version it was built from
//
// Every command prints a table (the demo: a headline per run and a
// sparkline; --wide for the table); --json prints the result as JSON
// instead, and --chart FILE.png (or .svg) draws it. `stormguard demo
// --serve ADDR` draws the demo's runs as they happen on a web page. Run `stormguard help` or
// `stormguard sim jitter --help` for the flags and the range each accepts:
// every input is bounded so that a run fits in memory and takes seconds, and
// a bad one is refused before any work with one line on stderr and exit
// status 2.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"unicode"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// command is one subcommand of the CLI.
type command struct {
	summary string
	// prepare parses and checks the command's arguments and returns its
	// work. It does no work itself, so bad input is refused at once;
	// errors are usage errors, flag.ErrHelp after printing the help.
	prepare func(args []string, e *env) (work func() error, err error)
}

// env is what a command writes to.
type env struct {
	stdout, stderr io.Writer
	// stderrIsTerminal reports whether progress bars may be drawn.
	stderrIsTerminal bool
	// ctx, if not nil, ends the work of a command that watches for Ctrl-C
	// (the demo) as Ctrl-C does.
	ctx context.Context
}

// context returns e.ctx, or the background context if it is nil.
func (e *env) context() context.Context {
	if e.ctx == nil {
		return context.Background()
	}
	return e.ctx
}

// commands maps "group name" (or "name") to its command.
func commands() map[string]command {
	return map[string]command{
		"demo":           {"live on loopback: a failing provider and a fleet, naive retries vs stormguard", prepareDemo},
		"sim jitter":     {"retries of clients that all failed at t=0, counted per window, per jitter strategy", prepareJitter},
		"sim layers":     {"calls at a failing bottom per user request when layers retry (3, 9, 27, 81)", prepareLayers},
		"sim outage":     {"a fleet against a provider that fails for a while: naive vs guarded retries", prepareOutage},
		"sim meta":       {"metastability: client setups x triggers (503, hang, x5, cut) near capacity", prepareMeta},
		"sim contention": {"optimistic concurrency on one row: write calls and completion time per strategy", prepareContention},
		"version":        {"the version of stormguard this program was built from", prepareVersion},
	}
}

// usageError is an error in how the command was called: exit status 2.
type usageError struct{ err error }

func (e usageError) Error() string { return e.err.Error() }
func (e usageError) Unwrap() error { return e.err }

// isHelp reports whether arg asks for help.
func isHelp(arg string) bool {
	return arg == "help" || arg == "-h" || arg == "--help" || arg == "-help"
}

// run runs the command line args and returns the exit status: 0 on
// success or help, 1 when the work failed, 2 for a bad command line (with
// exactly one line on stderr, or the usage when no command was given), 130
// when Ctrl-C stopped the work (with nothing on stderr).
func run(args []string, stdout, stderr io.Writer) int {
	return runContext(context.Background(), args, stdout, stderr)
}

// runContext is run with a context whose end stops the demo as Ctrl-C
// does.
func runContext(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	e := &env{stdout: stdout, stderr: stderr, stderrIsTerminal: isTerminal(stderr), ctx: ctx}
	cmds := commands()
	switch {
	case len(args) == 0:
		printUsage(stderr, "", cmds)
		return 2
	case args[0] == "help" && len(args) > 1 && !isHelp(args[1]) && !strings.HasPrefix(args[1], "-"):
		// "help sim jitter" is "sim jitter --help".
		return runContext(ctx, append(slices.Clone(args[1:]), "--help"), stdout, stderr)
	case isHelp(args[0]):
		printUsage(stdout, "", cmds)
		return 0
	}
	name, rest := args[0], args[1:]
	if _, ok := cmds[name]; !ok && isGroup(name, cmds) {
		switch {
		case len(rest) == 0:
			printUsage(stderr, name, cmds)
			return 2
		case isHelp(rest[0]):
			printUsage(stdout, name, cmds)
			return 0
		}
		name, rest = name+" "+rest[0], rest[1:]
	}
	cmd, ok := cmds[name]
	if !ok {
		hint := "stormguard help"
		if g, _, ok := strings.Cut(name, " "); ok {
			hint = "stormguard " + g + " --help"
		}
		fmt.Fprintf(stderr, "stormguard: unknown command %s (run '%s')\n", oneLine(fmt.Sprintf("%.60q", name)), hint)
		return 2
	}
	work, err := cmd.prepare(rest, e)
	if err == nil {
		err = work()
	}
	switch {
	case err == nil:
		return 0
	case errors.Is(err, flag.ErrHelp):
		return 0
	case errors.Is(err, errInterrupted):
		return 130
	}
	fmt.Fprintf(stderr, "stormguard %s: %s\n", name, oneLine(err.Error()))
	var ue usageError
	if errors.As(err, &ue) {
		return 2
	}
	return 1
}

// oneLine escapes the control characters of s (a newline in an argument,
// say), so that an error is one line on the terminal.
func oneLine(s string) string {
	nonPrint := func(r rune) bool { return unicode.IsControl(r) || r == '\u2028' || r == '\u2029' }
	if !strings.ContainsFunc(s, nonPrint) {
		return s
	}
	var b strings.Builder
	for _, r := range s {
		if nonPrint(r) {
			q := strconv.QuoteRune(r)
			b.WriteString(q[1 : len(q)-1])
			continue
		}
		b.WriteRune(r)
	}
	return b.String()
}

// isGroup reports whether name is the first word of some commands.
func isGroup(name string, cmds map[string]command) bool {
	for n := range cmds {
		if g, _, ok := strings.Cut(n, " "); ok && g == name {
			return true
		}
	}
	return false
}

// printUsage lists the commands, or with a group only the group's.
func printUsage(w io.Writer, group string, cmds map[string]command) {
	names := make([]string, 0, len(cmds))
	for n := range cmds {
		if g, _, _ := strings.Cut(n, " "); group == "" || g == group {
			names = append(names, n)
		}
	}
	sort.Strings(names)
	if group != "" {
		fmt.Fprintf(w, "Usage: stormguard %s <command> [flags]\n\nCommands:\n", group)
		for _, n := range names {
			fmt.Fprintf(w, "  %-12s %s\n", strings.TrimPrefix(n, group+" "), cmds[n].summary)
		}
		fmt.Fprintf(w, "\nRun 'stormguard %s <command> --help' for its flags and their limits.\n", group)
		return
	}
	fmt.Fprintln(w, "stormguard shows retry storms and how stormguard tames them.")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "Usage: stormguard <command> [flags]")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "Commands:")
	for _, n := range names {
		fmt.Fprintf(w, "  %-16s %s\n", n, cmds[n].summary)
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "Every command but version takes --json (print JSON instead of the table), --chart FILE.png|FILE.svg")
	fmt.Fprintln(w, "(draw the result) and --help (its flags, with the range each accepts). Every input is")
	fmt.Fprintln(w, "bounded so that a run fits in memory and takes seconds (the live demo: at most about three")
	fmt.Fprintln(w, "minutes); a value out of range is refused before any work, with exit status 2.")
}
