package main

import "syscall"

// childSysProcAttr makes the kernel send a questd SIGTERM when questctl
// dies (strictly: when the thread that started it exits; Go's threads
// outlive the program's goroutines unless one is locked and exits), so a
// killed questctl up leaves no node running.
func childSysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
}
