package buildinfo

import (
	"regexp"
	"runtime"
	"runtime/debug"
	"strings"
	"testing"
)

func TestFrom(t *testing.T) {
	for _, tc := range []struct {
		name string
		bi   *debug.BuildInfo
		ok   bool
		want string
	}{
		{"no build info", nil, false, "questrt (devel) (revision unknown, go " + runtime.Version() + ")"},
		{"no version, no vcs", &debug.BuildInfo{GoVersion: "go1.26.0"}, true, "questrt (devel) (revision unknown, go go1.26.0)"},
		{"release", &debug.BuildInfo{GoVersion: "go1.26.0", Main: debug.Module{Version: "v0.4.0"},
			Settings: []debug.BuildSetting{{Key: "vcs.revision", Value: "0123abc"}, {Key: "vcs.modified", Value: "false"}}},
			true, "questrt v0.4.0 (revision 0123abc, go go1.26.0)"},
		{"modified", &debug.BuildInfo{GoVersion: "go1.26.0", Main: debug.Module{Version: "(devel)"},
			Settings: []debug.BuildSetting{{Key: "vcs.revision", Value: "0123abc"}, {Key: "vcs.modified", Value: "true"}}},
			true, "questrt (devel) (revision 0123abc-dirty, go go1.26.0)"},
	} {
		if got := From(tc.bi, tc.ok).String(); got != tc.want {
			t.Errorf("%s: %q, want %q", tc.name, got, tc.want)
		}
	}
}

// versionLine is the pattern every version line matches.
var versionLine = regexp.MustCompile(`^questrt \S+ \(revision \S+, go \S+\)$`)

func TestRead(t *testing.T) {
	if s := Read().String(); !versionLine.MatchString(s) {
		t.Errorf("Read().String() = %q", s)
	}
}

// TestStampedRevision: a revision given with -ldflags -X (what a build
// without VCS stamping passes) is printed when the binary has no VCS
// stamp (test binaries never have one); absent, the revision is unknown.
func TestStampedRevision(t *testing.T) {
	defer func(old string) { stampedRevision = old }(stampedRevision)
	stampedRevision = ""
	if got := Read().Revision; got != UnknownRevision {
		t.Fatalf("no stamp: revision %q, want %q", got, UnknownRevision)
	}
	stampedRevision = "6d36924"
	if got := Read(); got.Revision != "6d36924" || !strings.Contains(got.String(), "revision 6d36924,") {
		t.Errorf("stamped: %+v (%s)", got, got)
	}
}
