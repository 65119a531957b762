//go:build !unix

package main

import "os"

// pauseSignal and resumeSignal: there is no SIGSTOP outside Unix, so
// pause-redis fails there (os.Process.Signal supports only Kill).
var pauseSignal, resumeSignal os.Signal = os.Interrupt, os.Interrupt
