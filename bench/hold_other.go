//go:build !linux

package main

import "time"

// holdFor keeps a contender inside for d (see hold_linux.go).
func holdFor(d time.Duration) { time.Sleep(d) }
