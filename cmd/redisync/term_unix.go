//go:build linux || darwin || freebsd || netbsd || openbsd || dragonfly

package main

import (
	"os"
	"syscall"
	"unsafe"
)

// sentByTerminal reports whether sig is a keyboard signal (SIGINT from
// Ctrl-C, SIGQUIT from Ctrl-\) that most likely came from the terminal:
// redisync's stdin is a terminal whose foreground process group is
// redisync's own. The terminal then sent it to the whole group, the
// command included, and passing it on would deliver it twice.
func sentByTerminal(sig os.Signal) bool {
	if sig != syscall.SIGINT && sig != syscall.SIGQUIT {
		return false
	}
	var pgrp int32
	_, _, errno := syscall.Syscall(syscall.SYS_IOCTL, os.Stdin.Fd(), uintptr(syscall.TIOCGPGRP), uintptr(unsafe.Pointer(&pgrp)))
	return errno == 0 && int(pgrp) == syscall.Getpgrp()
}

// terminalWidth reports whether f is a terminal, and its width in columns.
func terminalWidth(f *os.File) (int, bool) {
	var ws struct{ row, col, x, y uint16 }
	_, _, errno := syscall.Syscall(syscall.SYS_IOCTL, f.Fd(), uintptr(syscall.TIOCGWINSZ), uintptr(unsafe.Pointer(&ws)))
	if errno != 0 {
		return 0, false
	}
	return int(ws.col), true
}
