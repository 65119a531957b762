package main

import "syscall"

// sysProcAttr makes a worker process die with the main process (SIGKILL by
// Pdeathsig). Pdeathsig follows the thread that started the process; Go's
// threads live as long as the process unless a goroutine exits while
// locked to one, which this program never does.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
