package main

import (
	"errors"
	"syscall"
	"time"
)

// holdFor keeps a contender inside for d. It sleeps in nanosleep, which
// blocks the goroutine's thread, rather than in time.Sleep: Go's runtime
// wakes a sleeping goroutine from its network poller, whose timeout has
// millisecond resolution and is counted from when the process last went
// idle, so that time.Sleep(1ms) lasts about as much longer as the process
// kept busy after it began. A library whose process does I/O at the start
// of every hold (the last holder's release, its next Lock) would have its
// holds last 10-25 % longer than another's, measured; nanosleep's do not
// depend on what the process does meanwhile.
func holdFor(d time.Duration) {
	ts := syscall.NsecToTimespec(int64(d))
	for {
		var left syscall.Timespec
		err := syscall.Nanosleep(&ts, &left)
		if !errors.Is(err, syscall.EINTR) {
			return
		}
		ts = left
	}
}
