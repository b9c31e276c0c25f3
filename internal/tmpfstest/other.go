//go:build !linux

package tmpfstest

import "testing"

// Run skips: a tmpfs in a user namespace is Linux only.
func Run(t *testing.T, sizeKiB int, body func(t *testing.T, dir string)) {
	t.Skip("tmpfs in a user namespace: Linux only")
}
