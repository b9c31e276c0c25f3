//go:build !nvml && !cuda

package cluster

// discover is unavailable in the default build: go-nvml needs cgo.
func discover() (Inventory, error) { return Inventory{}, ErrNoDiscovery }
