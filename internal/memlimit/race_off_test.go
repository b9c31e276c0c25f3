//go:build !race

package memlimit

const raceEnabled = false
