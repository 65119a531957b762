package redistest

import "syscall"

// sysProcAttr kills the server when the test process dies, even without
// cleanup. (Pdeathsig follows the thread that started the process; Go's
// threads live as long as the process unless a goroutine exits while
// locked to one, which the harness never does.)
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
