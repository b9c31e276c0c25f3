//go:build linux

// Package tmpfstest runs a test on a real, small tmpfs: the test binary
// re-executes the test inside a user and mount namespace of its own
// (unshare(1)) where it mounts one, so that disk-full paths run against
// a real file system without root. Where that is not permitted the test
// is skipped.
package tmpfstest

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
)

// env names the tmpfs a re-executed test runs in.
const env = "QUESTRT_TEST_TMPFS"

// Run runs body with the directory of a tmpfs of sizeKiB KiB: in the
// re-executed test binary (t.Name() the only test run), which mounts it
// first; the outer test passes when the inner one does, and logs its
// lines that contain "tmpfs:".
func Run(t *testing.T, sizeKiB int, body func(t *testing.T, dir string)) {
	t.Helper()
	if dir := os.Getenv(env); dir != "" {
		var fs syscall.Statfs_t
		if err := syscall.Statfs(dir, &fs); err != nil || fs.Type != 0x01021994 || fs.Blocks*uint64(fs.Bsize) > 1<<20 {
			t.Fatalf("%s is no small tmpfs: %+v, %v", dir, fs, err)
		}
		body(t, dir)
		return
	}
	unshare, err := exec.LookPath("unshare")
	if err != nil {
		t.Skip("no unshare(1)")
	}
	dir := t.TempDir()
	cmd := exec.Command(unshare, "--user", "--map-root-user", "--mount", "sh", "-c",
		fmt.Sprintf(`mount -t tmpfs -o size=%dk questrt-test "$1" || exit 99; shift; exec "$@"`, sizeKiB), "sh", dir,
		os.Args[0], "-test.run=^"+t.Name()+"$", "-test.v", "-test.count=1")
	cmd.Env = append(os.Environ(), env+"="+dir)
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if errors.As(err, &ee) && (ee.ExitCode() == 99 || strings.HasPrefix(string(out), "unshare: ")) {
		t.Skipf("cannot mount a tmpfs in a namespace of this test's own: %s", strings.TrimSpace(string(out)))
	}
	if err != nil || !strings.Contains(string(out), "--- PASS: "+t.Name()) {
		t.Fatalf("in the tmpfs: %v\n%s", err, out)
	}
	for _, l := range strings.Split(string(out), "\n") {
		if strings.Contains(l, "tmpfs:") {
			t.Log(strings.TrimSpace(l))
		}
	}
}
