//go:build !(linux || darwin || freebsd || netbsd || openbsd || dragonfly)

package main

import "os"

// sentByTerminal reports whether sig most likely came from the terminal,
// which sent it to the command too. Without a way to ask the terminal,
// every signal is passed on.
func sentByTerminal(os.Signal) bool { return false }

// terminalWidth reports whether f is a terminal; without a way to ask,
// it never is, and the demo prints plain lines.
func terminalWidth(*os.File) (int, bool) { return 0, false }
