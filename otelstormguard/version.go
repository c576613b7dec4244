package otelstormguard

import "runtime/debug"

// releaseVersion is the version this source is released as: the scope's
// version when the program's build information has no release of the
// module (a build from a workspace or a directory, a test binary). A test
// keeps it in step with the Makefile's RELEASE_VERSION, the version every
// module is tagged at.
const releaseVersion = "v0.1.0"

// version is the instrumentation scope's version: this module's version in
// the program's build information, else releaseVersion.
var version = func() string {
	info, _ := debug.ReadBuildInfo()
	return scopeVersion(info, ScopeName)
}()

// scopeVersion returns the version of the module path in info (nil: none),
// the main module's or a dependency's (its replacement's, if that has
// one), or releaseVersion if info has no release of it ("(devel)", a
// replacement by a directory, a module it does not list).
func scopeVersion(info *debug.BuildInfo, path string) string {
	if info == nil {
		return releaseVersion
	}
	v := ""
	if info.Main.Path == path {
		v = info.Main.Version
	}
	for _, m := range info.Deps {
		if m.Path == path {
			v = m.Version
			if m.Replace != nil {
				v = m.Replace.Version
			}
		}
	}
	if v == "" || v == "(devel)" {
		return releaseVersion
	}
	return v
}
