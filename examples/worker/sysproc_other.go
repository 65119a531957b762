//go:build !linux

package main

import "syscall"

// sysProcAttr is nil outside Linux: a worker process notices that the main
// process died when its stdin closes.
func sysProcAttr() *syscall.SysProcAttr { return nil }
