//go:build !linux

package hog

import "syscall"

func sysProcAttr() *syscall.SysProcAttr { return nil }
