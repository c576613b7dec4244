package main

import (
	"fmt"
	"runtime"
	"runtime/debug"
)

func prepareVersion(args []string, e *env) (func() error, error) {
	fs := newFlagSet("version", "Prints the version of the stormguard module this program was built from, as the Go\n"+
		"build recorded it: a release (v0.1.0) when installed with go install ...@version, a\n"+
		"pseudo-version for a commit, \"(devel)\" when built from a checkout without version\n"+
		"control information (go run, -buildvcs=false); then the Go version and the platform.", "", e)
	if err := fs.parse(args); err != nil {
		return nil, err
	}
	return func() error {
		_, err := fmt.Fprintln(e.stdout, versionLine())
		return err
	}, nil
}

// versionLine returns "stormguard VERSION GOVERSION OS/ARCH", VERSION as
// the build info records the main module's ("(devel)" for a build from a
// checkout), "unknown" without build info.
func versionLine() string {
	version := "unknown"
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" {
		version = bi.Main.Version
	}
	return fmt.Sprintf("stormguard %s %s %s/%s", version, runtime.Version(), runtime.GOOS, runtime.GOARCH)
}
