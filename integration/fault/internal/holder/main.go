// Command holder is the fault-tolerance tests' lock holder in a process of
// its own, so that SIGKILL and SIGSTOP hit a real process.
//
//	holder serve   -addr A -name N [options]
//	holder contend -addr A -name N -goroutines G -cycles C -counter K -history H -register R
//
// serve prints "ready", then obeys one command per line on stdin and
// answers with one event per line on stdout:
//
//	lock         -> "locked <token>" (blocks until held)
//	unlock       -> "unlocked" or "error <msg>"
//	acquire <n>  -> "acquired <n>": n permits of the semaphore -name of
//	                size -sem (blocks until held)
//	release <n>  -> "released <n>" or "error <msg>"
//	rlock, runlock, wlock, wunlock -> "rlocked", "runlocked", "wlocked
//	                <token>", "wunlocked": a read or the write of the
//	                read-write lock -name (blocks until held)
//	write <v>    -> "write ok <token>" or "write rejected <token>": v offered to
//	                the fenced register (-register) with the token of the last
//	                hold, as a client that paused would still do
//	campaign <v> -> "leading <token>": campaigns in the election -name with
//	                the value v (blocks until it leads)
//	resign       -> "resigned" or "error <msg>"
//	exit         -> closes the Client and exits
//
// and prints "lost" when the current hold's (or leadership's) Lost
// channel closes.
//
// contend prints "ready", waits for "go" on stdin, then runs G goroutines,
// each with a Mutex of its own, taking the lock C times; under the lock
// each appends "+token" to the history list, offers its token to the
// fenced register, reads the counter, pauses, and writes it back plus one,
// then appends "-token". It prints "done <n>" or
// "error <msg>".
//
// work is a worker of the lock-set workload (see work.go): it prints
// "ready" and runs at once. elect is the election loop (see elect.go).
package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redisync/redisync"
	"github.com/redisync/redisync/integration/fault/internal/fence"
)

var (
	addr       = flag.String("addr", "", "Redis address")
	name       = flag.String("name", "", "lock name")
	lease      = flag.Duration("lease", 0, "fixed lease (0: watchdog)")
	watchdog   = flag.Duration("watchdog", 0, "watchdog lease (0: default)")
	heartbeat  = flag.Duration("heartbeat", 0, "fair heartbeat (0: default)")
	recheck    = flag.Duration("recheck", 0, "recheck interval (0: default)")
	fair       = flag.Bool("fair", false, "fair mutex")
	register   = flag.String("register", "", "fenced register key")
	goroutines = flag.Int("goroutines", 4, "contend: goroutines")
	cycles     = flag.Int("cycles", 100, "contend: cycles per goroutine")
	counter    = flag.String("counter", "", "contend: counter key")
	history    = flag.String("history", "", "contend: history list key")
	semSize    = flag.Int64("sem", 0, "serve: the size of semaphore -name, for acquire and release")
	dataAddr   = flag.String("data", "", "work: address of the Redis that holds the counters")
	counters   = flag.String("counters", "", "work: key prefix of the fenced and unfenced counters")
	workerID   = flag.Int("worker", 0, "work: worker number, the first part of every op id")
	seed       = flag.Uint64("seed", 1, "work: seed of the worker's random choices")
	lockWait   = flag.Duration("lockwait", 2*time.Second, "work: deadline of each Lock call")
	longHold   = flag.Duration("longhold", 3*time.Second, "work: how long a long hold lasts, unless lost")
)

var outMu sync.Mutex

func emit(format string, args ...any) {
	outMu.Lock()
	defer outMu.Unlock()
	fmt.Fprintf(os.Stdout, format+"\n", args...)
}

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: holder serve|contend|work|elect flags")
		os.Exit(2)
	}
	mode := os.Args[1]
	_ = flag.CommandLine.Parse(os.Args[2:])
	rdb := redis.NewClient(&redis.Options{Addr: *addr})
	defer rdb.Close()
	c, err := redisync.New(rdb, options()...)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	defer c.Close()
	switch mode {
	case "serve":
		err = serve(c, rdb)
	case "contend":
		err = contend(c, rdb)
	case "work":
		err = work(c)
	case "elect":
		err = electLoop(c, rdb)
	default:
		err = fmt.Errorf("unknown mode %q", mode)
	}
	if err != nil {
		emit("error %v", err)
		_ = c.Close()
		os.Exit(1)
	}
}

func options() []redisync.Option {
	var opts []redisync.Option
	if *lease > 0 {
		opts = append(opts, redisync.WithFixedLease(*lease))
	}
	if *watchdog > 0 {
		opts = append(opts, redisync.WithCrashTimeout(*watchdog))
	}
	if *heartbeat > 0 {
		opts = append(opts, redisync.WithWaiterTimeout(*heartbeat))
	}
	if *recheck > 0 {
		opts = append(opts, redisync.WithRecheck(*recheck))
	}
	if !*fair {
		opts = append(opts, redisync.Barging())
	}
	return opts
}

func serve(c *redisync.Client, rdb *redis.Client) error {
	ctx := context.Background()
	m, err := c.NewMutex(*name)
	if err != nil {
		return err
	}
	var token int64
	emit("ready")
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		cmd, arg, _ := strings.Cut(strings.TrimSpace(in.Text()), " ")
		switch cmd {
		case "lock":
			if err := m.Lock(ctx); err != nil {
				emit("error %v", err)
				continue
			}
			token = m.Token()
			lost := m.Lost()
			go func() {
				<-lost // the process exits without waiting for this goroutine
				emit("lost")
			}()
			emit("locked %d", token)
		case "unlock":
			if err := m.Unlock(ctx); err != nil {
				emit("error %v", err)
				continue
			}
			emit("unlocked")
		case "write":
			ok, err := fence.Write(ctx, rdb, *register, token, arg, "holder")
			switch {
			case err != nil:
				emit("error %v", err)
			case ok:
				emit("write ok %d", token)
			default:
				emit("write rejected %d", token)
			}
		case "rlock", "runlock", "wlock", "wunlock":
			if err := rwLock(ctx, c, cmd); err != nil {
				emit("error %v", err)
				continue
			}
			if cmd == "wlock" {
				emit("wlocked %d", rw.Token())
			} else {
				emit("%sed", cmd)
			}
		case "acquire", "release":
			if err := semaphore(ctx, c, cmd, arg); err != nil {
				emit("error %v", err)
				continue
			}
			emit("%sd %s", cmd, arg)
		case "campaign":
			if elect == nil {
				e, err := c.NewElection(*name)
				if err != nil {
					emit("error %v", err)
					continue
				}
				elect = e
			}
			if err := elect.Campaign(ctx, arg); err != nil {
				emit("error %v", err)
				continue
			}
			token = elect.Token()
			lost := elect.Lost()
			go func() {
				<-lost // the process exits without waiting for this goroutine
				emit("lost")
			}()
			emit("leading %d", token)
		case "resign":
			if err := elect.Resign(ctx); err != nil {
				emit("error %v", err)
				continue
			}
			emit("resigned")
		case "exit":
			return nil
		default:
			emit("error unknown command %q", cmd)
		}
	}
	return nil
}

// rw is the read-write lock of serve's rlock, runlock, wlock and wunlock
// commands.
var rw *redisync.RWMutex

// rwLock runs one of those commands on the read-write lock -name.
func rwLock(ctx context.Context, c *redisync.Client, cmd string) error {
	if rw == nil {
		var err error
		if rw, err = c.NewRWMutex(*name); err != nil {
			return err
		}
	}
	switch cmd {
	case "rlock":
		return rw.RLock(ctx)
	case "runlock":
		return rw.RUnlock(ctx)
	case "wlock":
		return rw.Lock(ctx)
	}
	return rw.Unlock(ctx)
}

// elect is the candidate of serve's campaign and resign commands.
var elect *redisync.Election

// sem is the semaphore of serve's acquire and release commands.
var sem *redisync.Semaphore

// semaphore acquires or releases n permits of the semaphore -name of size
// -sem.
func semaphore(ctx context.Context, c *redisync.Client, cmd, n string) error {
	permits, err := strconv.ParseInt(n, 10, 64)
	if err != nil {
		return err
	}
	if sem == nil {
		var err error
		if sem, err = c.NewSemaphore(*name, *semSize); err != nil {
			return err
		}
	}
	if cmd == "acquire" {
		return sem.Acquire(ctx, permits)
	}
	return sem.Release(ctx, permits)
}

func contend(c *redisync.Client, rdb *redis.Client) error {
	emit("ready")
	// Start together with the other processes: wait for "go".
	in := bufio.NewScanner(os.Stdin)
	if !in.Scan() || in.Text() != "go" {
		return fmt.Errorf("contend: expected \"go\" on stdin")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var wg sync.WaitGroup
	errs := make(chan error, *goroutines)
	for g := range *goroutines {
		m, err := c.NewMutex(*name)
		if err != nil {
			return err
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range *cycles {
				if err := cycle(ctx, m, rdb, g); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		return err
	}
	emit("done %d", *goroutines**cycles)
	return nil
}

// cycle is one critical section: a read-modify-write of the counter with a
// pause in the middle, so that two holders inside at once would lose an
// update.
func cycle(ctx context.Context, m *redisync.Mutex, rdb *redis.Client, g int) error {
	if err := m.Lock(ctx); err != nil {
		return err
	}
	t := m.Token()
	if err := fence.Enter(ctx, rdb, *history, t); err != nil {
		return err
	}
	ok, err := fence.Write(ctx, rdb, *register, t, fmt.Sprint(g), "contend")
	if err != nil {
		return err
	}
	if !ok {
		return fmt.Errorf("fenced register rejected token %d of a live hold", t)
	}
	v, err := rdb.Get(ctx, *counter).Int64()
	if err != nil && err != redis.Nil {
		return err
	}
	// The window in which a second holder would read the same value.
	time.Sleep(time.Duration(rand.IntN(200)) * time.Microsecond)
	if err := rdb.Set(ctx, *counter, v+1, 0).Err(); err != nil {
		return err
	}
	if err := fence.Exit(ctx, rdb, *history, t); err != nil {
		return err
	}
	return m.Unlock(ctx)
}
