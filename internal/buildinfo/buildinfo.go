// Package buildinfo reads the version of the running questrt binary from
// the build information the Go toolchain embeds (runtime/debug): the main
// module's version and the VCS revision it was built from. questd and
// questctl print it and questd advertises it.
package buildinfo

import (
	"fmt"
	"runtime"
	"runtime/debug"
)

// Unknown values, when the build information lacks them.
const (
	// DevelVersion is the version of a build without a module version
	// (go run, go build in a work tree without VCS stamping, tests).
	DevelVersion = "(devel)"
	// UnknownRevision is the revision of a build without VCS stamping.
	UnknownRevision = "unknown"
)

// Info is what a binary knows of its own build.
type Info struct {
	// Version is the main module's version, DevelVersion when absent.
	Version string
	// Revision is the VCS revision (vcs.revision), UnknownRevision when
	// absent.
	Revision string
	// Modified reports that the work tree had local changes (vcs.modified).
	Modified bool
	// GoVersion is the Go toolchain that built the binary.
	GoVersion string
}

// stampedRevision is the revision a build stamps with -ldflags "-X
// github.com/questrt/questrt/internal/buildinfo.stampedRevision=REV"
// (for builds without VCS stamping: -buildvcs=false, a tree without its
// .git); the VCS stamp wins when both are there.
var stampedRevision string

// Read returns the running binary's build information.
func Read() Info {
	in := From(debug.ReadBuildInfo())
	if in.Revision == UnknownRevision && stampedRevision != "" {
		in.Revision = stampedRevision
	}
	return in
}

// From returns the Info of bi; ok false (no build information) gives the
// unknown values and the running Go version.
func From(bi *debug.BuildInfo, ok bool) Info {
	in := Info{Version: DevelVersion, Revision: UnknownRevision, GoVersion: runtime.Version()}
	if !ok || bi == nil {
		return in
	}
	if v := bi.Main.Version; v != "" {
		in.Version = v
	}
	if bi.GoVersion != "" {
		in.GoVersion = bi.GoVersion
	}
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			if s.Value != "" {
				in.Revision = s.Value
			}
		case "vcs.modified":
			in.Modified = s.Value == "true"
		}
	}
	return in
}

// Rev is the revision as printed: Revision, with "-dirty" appended when
// the work tree was modified.
func (in Info) Rev() string {
	if in.Modified {
		return in.Revision + "-dirty"
	}
	return in.Revision
}

// String is the one-line version of questd --version and questctl
// version: "questrt VERSION (revision REV, go GOVERSION)".
func (in Info) String() string {
	return fmt.Sprintf("questrt %s (revision %s, go %s)", in.Version, in.Rev(), in.GoVersion)
}
