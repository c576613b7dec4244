// Command stormguard shows retry storms and how stormguard tames them.
//
// Usage:
//
//	stormguard sim jitter [flags]   how retries of clients that failed together cluster in time
//
// Every command prints a table; --json prints the result as JSON instead,
// and --chart FILE.png (or .svg) draws it. Run `stormguard help` or
// `stormguard sim jitter --help` for the flags.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// command is one subcommand of the CLI.
type command struct {
	summary string
	run     func(args []string, env *env) error
}

// env is what a command writes to.
type env struct {
	stdout, stderr io.Writer
	// stderrIsTerminal reports whether progress bars may be drawn.
	stderrIsTerminal bool
}

// commands maps "group name" to its command.
func commands() map[string]command {
	return map[string]command{
		"demo":           {"live on loopback: a failing provider and a fleet, naive retries vs stormguard", runDemo},
		"sim jitter":     {"retries of clients that all failed at t=0, counted per window, per jitter strategy", runJitter},
		"sim layers":     {"calls at a failing bottom per user request when layers retry (3, 9, 27, 81)", runLayers},
		"sim outage":     {"a fleet against a provider that fails for a while: naive vs guarded retries", runOutage},
		"sim contention": {"optimistic concurrency on one row: write calls and completion time per strategy", runContention},
	}
}

// usageError is an error in how the command was called: exit status 2.
type usageError struct{ err error }

func (e usageError) Error() string { return e.err.Error() }
func (e usageError) Unwrap() error { return e.err }

func run(args []string, stdout, stderr io.Writer) int {
	e := &env{stdout: stdout, stderr: stderr, stderrIsTerminal: isTerminal(stderr)}
	cmds := commands()
	if len(args) == 0 || args[0] == "help" || args[0] == "-h" || args[0] == "--help" || args[0] == "-help" {
		printUsage(stdout, cmds)
		return 0
	}
	name := args[0]
	rest := args[1:]
	if _, ok := cmds[name]; !ok && len(args) > 1 {
		name, rest = args[0]+" "+args[1], args[2:]
	}
	cmd, ok := cmds[name]
	if !ok {
		fmt.Fprintf(stderr, "stormguard: unknown command %q (run 'stormguard help')\n", strings.Join(args[:min(2, len(args))], " "))
		return 2
	}
	err := cmd.run(rest, e)
	switch {
	case err == nil:
		return 0
	case errors.Is(err, flag.ErrHelp):
		return 0
	}
	fmt.Fprintf(stderr, "stormguard %s: %v\n", name, err)
	var ue usageError
	if errors.As(err, &ue) {
		return 2
	}
	return 1
}

func printUsage(w io.Writer, cmds map[string]command) {
	fmt.Fprintln(w, "stormguard shows retry storms and how stormguard tames them.")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "Usage: stormguard <command> [flags]")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "Commands:")
	names := make([]string, 0, len(cmds))
	for n := range cmds {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(w, "  %-16s %s\n", n, cmds[n].summary)
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "Every command takes --json (print JSON instead of the table), --chart FILE.png|FILE.svg")
	fmt.Fprintln(w, "(draw the result) and --help.")
}

// flagSet is a command's flags: errors come back as one line (returned, not
// printed) and --help prints the usage to stdout.
type flagSet struct {
	*flag.FlagSet
	name, synopsis string
	e              *env
}

func newFlagSet(name, synopsis string, e *env) *flagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Usage = func() {} // the flag package calls it on every error; parse prints help itself
	return &flagSet{FlagSet: fs, name: name, synopsis: synopsis, e: e}
}

// parse parses args, turning flag errors into usage errors and --help into
// flag.ErrHelp after printing the usage.
func (fs *flagSet) parse(args []string) error {
	err := fs.Parse(args)
	switch {
	case errors.Is(err, flag.ErrHelp):
		fmt.Fprintf(fs.e.stdout, "Usage: stormguard %s [flags]\n\n%s\n\nFlags:\n", fs.name, fs.synopsis)
		fs.SetOutput(fs.e.stdout)
		fs.PrintDefaults()
		fs.SetOutput(io.Discard)
		return flag.ErrHelp
	case err != nil:
		return usageError{err}
	case fs.NArg() > 0:
		return usageError{fmt.Errorf("unexpected argument %q", fs.Arg(0))}
	}
	return nil
}

// output holds the flags every command shares.
type output struct {
	json  bool
	chart string
	quiet bool
}

func (o *output) register(fs *flagSet) {
	fs.BoolVar(&o.json, "json", false, "print the result as JSON instead of a table")
	fs.StringVar(&o.chart, "chart", "", "also draw the result to `FILE` (.png or .svg)")
	fs.BoolVar(&o.quiet, "quiet", false, "no progress bar on stderr")
}

// validate checks the flags before any work is done.
func (o *output) validate() error {
	if o.chart != "" {
		if _, err := chartFormat(o.chart); err != nil {
			return usageError{err}
		}
	}
	return nil
}
