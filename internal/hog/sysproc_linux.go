package hog

import "syscall"

// sysProcAttr kills a hog when the test process dies, even without
// cleanup (as redistest does for its servers).
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
