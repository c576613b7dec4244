package main

import (
	"cmp"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// flagSet is a command's flags: errors come back as one line (returned, not
// printed), --help prints the usage to stdout, and every flag may be given
// at most once.
type flagSet struct {
	*flag.FlagSet
	name, synopsis string
	// limits, if set, describes in the help the bounds that involve more
	// than one flag.
	limits string
	e      *env
}

func newFlagSet(name, synopsis, limits string, e *env) *flagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Usage = func() {} // the flag package calls it on every error; parse prints help itself
	return &flagSet{FlagSet: fs, name: name, synopsis: synopsis, limits: limits, e: e}
}

// parse parses args, turning flag errors into usage errors and --help into
// flag.ErrHelp after printing the usage.
func (fs *flagSet) parse(args []string) error {
	fs.VisitAll(func(f *flag.Flag) { f.Value = &onceValue{Value: f.Value} })
	err := fs.Parse(args)
	switch {
	case errors.Is(err, flag.ErrHelp):
		fs.printHelp(fs.e.stdout)
		return flag.ErrHelp
	case err != nil:
		return usageError{err}
	case fs.NArg() > 0:
		return usageError{fmt.Errorf("unexpected argument %.60q", fs.Arg(0))}
	}
	return nil
}

// isSet reports whether the flag name was given.
func (fs *flagSet) isSet(name string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}

// printHelp writes the usage: synopsis, limits and every flag with its
// type, allowed range and default.
func (fs *flagSet) printHelp(w io.Writer) {
	fmt.Fprintf(w, "Usage: stormguard %s [flags]\n\n%s\n", fs.name, fs.synopsis)
	if fs.limits != "" {
		fmt.Fprintf(w, "\nLimits: %s\n", fs.limits)
	}
	fmt.Fprintf(w, "\nFlags:\n")
	fs.VisitAll(func(f *flag.Flag) {
		plain := *f
		if o, ok := f.Value.(*onceValue); ok {
			plain.Value = o.Value
		}
		kind, usage := flag.UnquoteUsage(&plain)
		if r, ok := plain.Value.(ranged); ok {
			var span string
			kind, span = r.rangeText()
			usage += ", " + span
		}
		fmt.Fprintf(w, "  -%s", f.Name)
		if kind != "" {
			fmt.Fprintf(w, " %s", kind)
		}
		fmt.Fprintf(w, "\n    \t%s", strings.ReplaceAll(usage, "\n", "\n    \t"))
		if f.DefValue != "" && f.DefValue != "false" {
			fmt.Fprintf(w, " (default %s)", f.DefValue)
		}
		fmt.Fprintln(w)
	})
}

// onceValue refuses a second value for the same flag: with two, which one
// counts would be a guess.
type onceValue struct {
	flag.Value
	set bool
}

func (o *onceValue) Set(s string) error {
	if o.set {
		return errors.New("flag given more than once")
	}
	o.set = true
	return o.Value.Set(s)
}

// IsBoolFlag keeps -json working without a value.
func (o *onceValue) IsBoolFlag() bool {
	b, ok := o.Value.(interface{ IsBoolFlag() bool })
	return ok && b.IsBoolFlag()
}

// ranged is a flag value with an allowed range.
type ranged interface {
	// rangeText returns the value's kind ("int", "duration", ...) and its
	// range in words ("1 to 1000").
	rangeText() (kind, span string)
}

// bounded is a flag value that must lie in [lo, hi]; Set rejects anything
// else (NaN included) and leaves the value unchanged.
type bounded[T cmp.Ordered] struct {
	p      *T
	lo, hi T
	kind   string // in the help: "int", "duration", ...
	noun   string // in errors: "a whole number", "a duration", ...
	parse  func(string) (T, error)
	format func(T) string
}

func (b *bounded[T]) String() string {
	if b == nil || b.p == nil {
		return ""
	}
	return b.format(*b.p)
}

func (b *bounded[T]) Set(s string) error {
	v, err := b.parse(s)
	if err != nil || !(v >= b.lo && v <= b.hi) {
		return fmt.Errorf("want %s from %s to %s", b.noun, b.format(b.lo), b.format(b.hi))
	}
	*b.p = v
	return nil
}

func (b *bounded[T]) rangeText() (kind, span string) {
	return b.kind, b.format(b.lo) + " to " + b.format(b.hi)
}

// intVar defines an int flag with values in [lo, hi].
func (fs *flagSet) intVar(p *int, name string, lo, hi int, usage string) {
	fs.Var(&bounded[int]{p: p, lo: lo, hi: hi, kind: "int", noun: "a whole number", parse: strconv.Atoi, format: strconv.Itoa}, name, usage)
}

// uint64Var defines an unsigned flag with values in [0, hi].
func (fs *flagSet) uint64Var(p *uint64, name string, hi uint64, usage string) {
	fs.Var(&bounded[uint64]{p: p, lo: 0, hi: hi, kind: "uint", noun: "a whole number",
		parse:  func(s string) (uint64, error) { return strconv.ParseUint(s, 10, 64) },
		format: func(v uint64) string { return strconv.FormatUint(v, 10) },
	}, name, usage)
}

// floatVar defines a float flag with finite values in [lo, hi].
func (fs *flagSet) floatVar(p *float64, name string, lo, hi float64, usage string) {
	fs.Var(&bounded[float64]{p: p, lo: lo, hi: hi, kind: "number", noun: "a finite number",
		parse: func(s string) (float64, error) {
			v, err := strconv.ParseFloat(s, 64)
			if err == nil && (math.IsNaN(v) || math.IsInf(v, 0)) {
				err = errors.New("not finite")
			}
			return v, err
		},
		format: func(v float64) string { return strconv.FormatFloat(v, 'g', -1, 64) },
	}, name, usage)
}

// durationVar defines a duration flag with values in [lo, hi].
func (fs *flagSet) durationVar(p *time.Duration, name string, lo, hi time.Duration, usage string) {
	fs.Var(&bounded[time.Duration]{p: p, lo: lo, hi: hi, kind: "duration", noun: "a duration (e.g. 250ms)", parse: time.ParseDuration, format: fmtDuration}, name, usage)
}

// fmtDuration formats d as time.Duration.String does, without the zero
// minutes and seconds of round values ("1h", not "1h0m0s").
func fmtDuration(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = s[:len(s)-2]
	}
	if strings.HasSuffix(s, "h0m") {
		s = s[:len(s)-2]
	}
	return s
}

// maxListItems bounds the items of a comma-separated flag.
const maxListItems = 1000

// parseList parses the comma-separated list s of flag name (spaces around
// items trimmed): at least one item, each known to parse, none twice.
func parseList[T comparable](name, s string, parse func(string) (T, error)) ([]T, error) {
	items := strings.Split(s, ",")
	if len(items) > maxListItems {
		return nil, fmt.Errorf("-%s: %d items, at most %d", name, len(items), maxListItems)
	}
	out := make([]T, 0, len(items))
	seen := make(map[T]bool, len(items))
	for _, item := range items {
		item = strings.TrimSpace(item)
		if item == "" {
			return nil, fmt.Errorf("-%s %.60q: empty item (want a comma-separated list)", name, s)
		}
		v, err := parse(item)
		if err != nil {
			return nil, fmt.Errorf("-%s: %w", name, err)
		}
		if seen[v] {
			return nil, fmt.Errorf("-%s: %.60q is listed twice", name, item)
		}
		seen[v] = true
		out = append(out, v)
	}
	return out, nil
}

// byName returns a parser of the names of all (as their String gives them),
// for parseList.
func byName[T fmt.Stringer](what string, all []T) func(string) (T, error) {
	names := make([]string, len(all))
	for i, v := range all {
		names[i] = v.String()
	}
	return func(s string) (T, error) {
		for i, n := range names {
			if n == s {
				return all[i], nil
			}
		}
		var zero T
		return zero, fmt.Errorf("unknown %s %.60q (want some of %s)", what, s, strings.Join(names, ", "))
	}
}

// parseInts parses the values of flag name, a list "10,20,50" or a range
// "10-150/10" (step 1 if left out), each value in [lo, hi] and none twice.
func parseInts(name, s string, lo, hi int) ([]int, error) {
	num := func(f string) (int, error) {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < lo || n > hi {
			return 0, fmt.Errorf("%.60q is not a whole number from %d to %d", f, lo, hi)
		}
		return n, nil
	}
	from, rest, isRange := strings.Cut(s, "-")
	if !isRange || strings.Contains(s, ",") || strings.TrimSpace(from) == "" {
		return parseList(name, s, num)
	}
	to, step, hasStep := strings.Cut(rest, "/")
	if !hasStep {
		step = "1"
	}
	a, err1 := num(from)
	b, err2 := num(to)
	d, err3 := num(step)
	if err := errors.Join(err1, err2, err3); err != nil || b < a {
		return nil, fmt.Errorf("-%s %.60q: want a range FROM-TO/STEP with %d <= FROM <= TO <= %d and STEP from %d to %d, e.g. 10-150/10",
			name, s, lo, hi, lo, hi)
	}
	out := make([]int, 0, (b-a)/d+1)
	for n := a; n <= b; n += d { // b <= hi: no overflow
		out = append(out, n)
	}
	return out, nil
}

// output holds the flags every command shares.
type output struct {
	json  bool
	chart string
	quiet bool
}

func (o *output) register(fs *flagSet) {
	fs.BoolVar(&o.json, "json", false, "print the result as JSON instead of a table")
	fs.StringVar(&o.chart, "chart", "", "also draw the result to `FILE` (.png or .svg, in an existing directory)")
	fs.BoolVar(&o.quiet, "quiet", false, "no progress bar on stderr")
}

// validate checks the flags before any work is done.
func (o *output) validate() error {
	if o.chart == "" {
		return nil
	}
	if _, err := chartFormat(o.chart); err != nil {
		return usageError{fmt.Errorf("-chart: %w", err)}
	}
	if st, err := os.Stat(filepath.Dir(o.chart)); err != nil || !st.IsDir() {
		return usageError{fmt.Errorf("-chart %.60q: no directory %.60q to write it in", o.chart, filepath.Dir(o.chart))}
	}
	if st, err := os.Stat(o.chart); err == nil && !st.Mode().IsRegular() {
		// Refused before the work, not after it: a directory (or a
		// device, a socket) of that name cannot take the chart.
		return usageError{fmt.Errorf("-chart %.60q: not a file that can be written (%v)", o.chart, st.Mode().Type())}
	}
	// Opened for writing now (and removed if it did not exist), so that a
	// file that cannot be created (a dangling link, a read-only place) is
	// refused before the work, not after it.
	_, statErr := os.Lstat(o.chart)
	f, err := os.OpenFile(o.chart, os.O_WRONLY|os.O_CREATE, 0o644)
	if err != nil {
		return usageError{fmt.Errorf("-chart %.60q: cannot be written: %v", o.chart, err)}
	}
	_ = f.Close()
	if os.IsNotExist(statErr) {
		_ = os.Remove(o.chart)
	}
	return nil
}
