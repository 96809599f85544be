package main

import (
	"fmt"
	"time"
)

// A shape is one measured configuration: who contends for what, how long.
type shape struct {
	clients    int           // instances, each with its own connections
	goroutines int           // contenders in all, dealt round-robin to the clients
	keys       int           // locks; consecutive contenders share one
	hold       time.Duration // how long a contender keeps what it took
	size       int64         // permits of a semaphore; 0: a mutex
	// perEntity makes every acquisition take one of the keys at random,
	// with an owner made for it (as a service locks the entity a request
	// is about), instead of each contender keeping its own lock.
	perEntity bool
	// rw makes the lock a read-write lock: one acquisition in ten
	// writes (rwWrites), the others read.
	rw      bool
	warmup  time.Duration // contention before the window opens
	measure time.Duration // the window
}

// label describes s in a few words, for the progress line and the tables.
func (s shape) label() string {
	what := "lock"
	switch {
	case s.perEntity:
		what = fmt.Sprintf("%d locks at random", s.keys)
	case s.keys > 1:
		what = fmt.Sprintf("%d locks", s.keys)
	}
	if s.size > 0 {
		what = fmt.Sprintf("semaphore(%d)", s.size)
	}
	if s.rw {
		what = fmt.Sprintf("rwlock (%d%% writes)", rwWrites*10)
	}
	return fmt.Sprintf("%dx%d on %s, hold %v", s.clients, s.goroutines/s.clients, what, s.hold)
}

// settings are the command line's knobs that shape the scenarios. A zero
// clients, perClient or hold keeps each scenario's own.
type settings struct {
	base      time.Duration // the hot scenario's window; the others scale from it
	clients   int
	perClient int
	hold      time.Duration
	holdSet   bool
}

// pick returns a count setting when it is given, else the scenario's default.
func pick(set, def int) int {
	if set > 0 {
		return set
	}
	return def
}

// A scenario is one workload, run for every library in turn.
type scenario struct {
	name  string
	about string
	// cluster says the scenario runs on a Redis Cluster the benchmark
	// starts, and only when -scenarios names it ("all" leaves it out).
	cluster bool
	// shapes returns the steps of the scenario (one, or a series).
	shapes func(settings) []shape
}

// scaleWaiters are the steps of the scale series; the last is the scale
// scenario's headline.
var scaleWaiters = []int{32, 128, 512, 1024}

// coldLocks is how many lock names the cold scenario spreads over.
const coldLocks = 10000

// scenarios returns every scenario in the order they run.
func scenarios() []scenario {
	return []scenario{
		{
			name:  "hot",
			about: "one hot lock, 4 clients x 8 goroutines, 1 ms hold (the design notes' bar)",
			shapes: func(set settings) []shape {
				p, g := pick(set.clients, 4), pick(set.perClient, 8)
				return []shape{window(set, 1, shape{clients: p, goroutines: p * g, keys: 1, hold: holdOr(set, time.Millisecond)})}
			},
		},
		{
			name:  "hot0",
			about: "the same lock with no hold: the lock's own cost per hand-off",
			shapes: func(set settings) []shape {
				p, g := pick(set.clients, 4), pick(set.perClient, 8)
				return []shape{window(set, 0.5, shape{clients: p, goroutines: p * g, keys: 1})}
			},
		},
		{
			name:  "scale",
			about: "one lock, 8 clients, waiters 32..1024, 1 ms hold: load as waiters grow",
			shapes: func(set settings) []shape {
				p := pick(set.clients, 8)
				var steps []shape
				for i, w := range scaleWaiters {
					part := 0.25
					if i == len(scaleWaiters)-1 {
						part = 0.5
					}
					g := max(w/p, 1)
					steps = append(steps, window(set, part, shape{clients: p, goroutines: p * g, keys: 1, hold: holdOr(set, time.Millisecond)}))
				}
				return steps
			},
		},
		{
			name:  "uncontended",
			about: "one goroutine, Lock then Unlock: the latency of the fast path",
			shapes: func(set settings) []shape {
				return []shape{window(set, 0.25, shape{clients: 1, goroutines: 1, keys: 1})}
			},
		},
		{
			name:  "manylocks",
			about: "1,000 locks, a holder and a waiter on each (on different clients), 100 ms hold",
			shapes: func(set settings) []shape {
				p := pick(set.clients, 4)
				return []shape{window(set, 0.5, shape{clients: p, goroutines: 2000, keys: 1000, hold: holdOr(set, 100*time.Millisecond)})}
			},
		},
		{
			name:  "cold",
			about: "10,000 locks, 4 clients x 8 goroutines each taking one at random, 1 ms hold: per-entity locks, each taken now and then",
			shapes: func(set settings) []shape {
				p, g := pick(set.clients, 4), pick(set.perClient, 8)
				return []shape{window(set, 1, shape{clients: p, goroutines: p * g, keys: coldLocks, perEntity: true, hold: holdOr(set, time.Millisecond)})}
			},
		},
		{
			name:  "semaphore",
			about: "a semaphore of 4 permits, 4 clients x 8 goroutines, 1 ms hold",
			shapes: func(set settings) []shape {
				p, g := pick(set.clients, 4), pick(set.perClient, 8)
				return []shape{window(set, 1, shape{clients: p, goroutines: p * g, keys: 1, size: 4, hold: holdOr(set, time.Millisecond)})}
			},
		},
		{
			name:  "rw",
			about: "one read-write lock, 4 clients x 8 goroutines, 90% reads and 10% writes, 1 ms hold",
			shapes: func(set settings) []shape {
				p, g := pick(set.clients, 4), pick(set.perClient, 8)
				return []shape{window(set, 1, shape{clients: p, goroutines: p * g, keys: 1, rw: true, hold: holdOr(set, time.Millisecond)})}
			},
		},
		{
			name:    "cluster",
			about:   "a 3-primary Redis Cluster, a hot lock on each primary, 4 clients x 8 goroutines per lock, 1 ms hold",
			cluster: true,
			shapes: func(set settings) []shape {
				p, g := pick(set.clients, 4), pick(set.perClient, 8)
				n := clusterPrimaries
				return []shape{window(set, 1, shape{clients: p, goroutines: p * g * n, keys: n, hold: holdOr(set, time.Millisecond)})}
			},
		},
	}
}

// holdOr returns the -hold setting when given (0 included), else def.
func holdOr(set settings, def time.Duration) time.Duration {
	if set.holdSet {
		return set.hold
	}
	return def
}

// window gives s a measuring window of part of the base duration, and a
// warm-up of a sixteenth of the base plus the longer of startWarmup per
// contender (to start them) and one full turn of a lock's contenders at
// the hold plus startWarmup each, so that every contender has had its
// first turn before the window opens: a window opened inside the first
// turn mixes the start-up's shorter waits, and its zero counts, into the
// steady state (at 1,024 waiters and 1 ms, the first turn takes 1.1 s).
func window(set settings, part float64, s shape) shape {
	s.measure = time.Duration(part * float64(set.base))
	start := time.Duration(s.goroutines) * startWarmup
	turn := time.Duration(s.goroutines/s.keys) * (s.hold + startWarmup) / time.Duration(max(s.size, 1))
	s.warmup = set.base/16 + max(start, turn)
	return s
}

// startWarmup is the warm-up given to each contender.
const startWarmup = 500 * time.Microsecond
