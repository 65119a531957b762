//go:build unix

package main

import "syscall"

// pauseSignal and resumeSignal stop and continue a process (pause-redis).
var pauseSignal, resumeSignal = syscall.SIGSTOP, syscall.SIGCONT
