//go:build !linux

package main

import "syscall"

// childSysProcAttr is nil outside Linux, which alone has a parent-death
// signal: there a killed questctl up leaves its nodes running.
func childSysProcAttr() *syscall.SysProcAttr { return nil }
