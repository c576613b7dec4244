package otelstormguard

import (
	"net/url"
	"os"
	"regexp"
	"runtime/debug"
	"testing"
)

func TestScopeVersionFromBuildInfo(t *testing.T) {
	dep := func(path, v string, r *debug.Module) *debug.Module {
		return &debug.Module{Path: path, Version: v, Replace: r}
	}
	tests := []struct {
		name string
		info *debug.BuildInfo
		want string
	}{
		{"no build information", nil, releaseVersion},
		{"a release required", &debug.BuildInfo{Deps: []*debug.Module{dep("x", "v1.0.0", nil), dep(ScopeName, "v0.3.1", nil)}}, "v0.3.1"},
		{"replaced by a release", &debug.BuildInfo{Deps: []*debug.Module{dep(ScopeName, "v0.3.1", dep("fork", "v0.3.2", nil))}}, "v0.3.2"},
		{"replaced by a directory", &debug.BuildInfo{Deps: []*debug.Module{dep(ScopeName, "v0.3.1", dep("../o", "", nil))}}, releaseVersion},
		{"a workspace", &debug.BuildInfo{Deps: []*debug.Module{dep(ScopeName, "(devel)", nil)}}, releaseVersion},
		{"the main module", &debug.BuildInfo{Main: debug.Module{Path: ScopeName, Version: "v0.4.0"}}, "v0.4.0"},
		{"not listed (a test binary)", &debug.BuildInfo{Main: debug.Module{Path: ScopeName + "/test", Version: "(devel)"}}, releaseVersion},
	}
	for _, tt := range tests {
		if got := scopeVersion(tt.info, ScopeName); got != tt.want {
			t.Errorf("%s: scopeVersion = %q, want %q", tt.name, got, tt.want)
		}
	}
}

// releaseVersion is kept in step with the version make release-tags tags
// every module at.
func TestReleaseVersionInStep(t *testing.T) {
	mk, err := os.ReadFile("../Makefile")
	if err != nil {
		t.Skipf("no Makefile beside the module (not the repository): %v", err)
	}
	m := regexp.MustCompile(`(?m)^RELEASE_VERSION \?= (\S+)$`).FindSubmatch(mk)
	if m == nil || string(m[1]) != releaseVersion {
		t.Errorf("the Makefile's RELEASE_VERSION is %q, releaseVersion %q: keep them in step", m, releaseVersion)
	}
}

func TestRedactedURL(t *testing.T) {
	tests := []struct{ in, want string }{
		{"https://pay.example/charge?amount=5", "https://pay.example/charge?amount=5"},
		{"https://u:p@pay.example/x", "https://REDACTED:REDACTED@pay.example/x"},
		{"https://u@pay.example/x", "https://REDACTED:REDACTED@pay.example/x"},
		{"https://s3.example/o?AWSAccessKeyId=AK&Signature=s%2Fg&Expires=1", "https://s3.example/o?AWSAccessKeyId=REDACTED&Signature=REDACTED&Expires=1"},
		{"https://gcs.example/o?X-Goog-Signature=ab&x=1", "https://gcs.example/o?X-Goog-Signature=REDACTED&x=1"},
		{"https://blob.example/o?sv=1&sig=abc", "https://blob.example/o?sv=1&sig=REDACTED"},
		{"https://blob.example/o?%73ig=abc", "https://blob.example/o?%73ig=REDACTED"},                        // an escaped key
		{"https://blob.example/o?SIG=abc&signature=x&sig", "https://blob.example/o?SIG=abc&signature=x&sig"}, // case-sensitive; no value
		{"https://blob.example/o?q=50%25", "https://blob.example/o?q=50%25"},
	}
	for _, tt := range tests {
		u, err := url.Parse(tt.in)
		if err != nil {
			t.Fatal(err)
		}
		if got := redactedURL(u); got != tt.want {
			t.Errorf("redactedURL(%s) = %s, want %s", tt.in, got, tt.want)
		}
	}
}
