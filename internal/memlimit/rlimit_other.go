//go:build !unix

package memlimit

// addressLimit reports no address-space limit where the platform has none
// to read.
func addressLimit() (int64, bool) { return 0, false }
