//go:build !linux

package main

import (
	"errors"
	"syscall"
)

// childSysProcAttr is nil outside Linux, which alone has a parent-death
// signal: there a killed questctl up leaves its nodes running.
func childSysProcAttr() *syscall.SysProcAttr { return nil }

// allowedCPUs is nil outside Linux: up pins no node there.
func allowedCPUs() []int { return nil }

// pinProcess is never called outside Linux (no CPUs to pin to).
func pinProcess(int, []int) error { return errors.ErrUnsupported }
