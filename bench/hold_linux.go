package main

import (
	"errors"
	"syscall"
	"time"
)

// nanoHold is the longest hold that sleeps in nanosleep; a longer one
// sleeps in time.Sleep.
const nanoHold = 10 * time.Millisecond

// holdFor keeps a contender inside for d. A short hold sleeps in
// nanosleep, which blocks the goroutine's thread, rather than in
// time.Sleep: Go's runtime wakes a sleeping goroutine from its network
// poller, whose timeout has millisecond resolution and is counted from
// when the process last went idle, so that time.Sleep(1ms) lasts about as
// much longer as the process kept busy after it began. A library whose
// process does I/O at the start of every hold (the last holder's release,
// its next Lock) would have its holds last 10-25 % longer than another's,
// measured; nanosleep's do not depend on what the process does meanwhile.
// A hold longer than nanoHold sleeps in time.Sleep: its overshoot, under a
// millisecond, is small beside it, and nanosleep would block a thread per
// holder (a thousand in manylocks), which made that scenario, and the
// runs after it in the same process, 2-5 times slower (measured).
func holdFor(d time.Duration) {
	if d > nanoHold {
		time.Sleep(d)
		return
	}
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
