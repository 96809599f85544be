// Package redisynctest is a testing kit for code that takes redisync
// locks: it runs such code against an embedded, in-process Redis
// (miniredis), with no Redis server to install, and lets a test make
// happen what is hard to bring about on a real one, promptly: a lease
// that runs out, a process that dies, time that passes.
//
//	kit := redisynctest.New(t)
//	a, b := kit.Client(), kit.Client() // two processes, say
//	... a takes the lock "job"; b waits for it ...
//	kit.EndLease("job") // a's Lost closes; b's Lock returns
//
// New starts the embedded Redis, whose clock follows real time (leases
// and other TTLs run out as they would on a server) until Advance moves
// it ahead. Client returns redisync Clients of it, closed when the test
// ends. EndLease ends a lock's current hold in Redis as if its lease had
// run out; Kill stands for the death of a Client's process and ends its
// holds of locks. After either, the holder's Lost channel closes, and a
// Client waiting for the lock takes it, within a few milliseconds rather
// than the crash timeout (15 s by default): the kit tells the holder's
// Client that the hold it ended is lost (the hold's owner id, unique to
// it, names it; a hold the kit cannot name for sure is renewed at once
// instead, and the renewal's reply decides). In the same transaction that
// ends the lease, it hands the lock to the first waiter of its fair queue,
// as a release does, and publishes the grant, which the waiter takes with
// no call to Redis; waiters it cannot hand the lock to (barging ones, an
// election's candidates) are woken, as by the message a release
// publishes, and look again. Holds the kit did not end are never reported
// lost: the Clients keep their usual timeouts.
//
// The kit serves tests only: miniredis is not Redis (it runs the
// library's Lua scripts in gopher-lua, in the test's process, and knows
// neither replication nor Redis Cluster), and the kit reaches into its
// Clients through a package internal to redisync.
//
// miniredis hashes scripts with SHA-1 (crypto/sha1, for EVAL, EVALSHA
// and SCRIPT LOAD) in the test's process, which Go's strict FIPS 140-3
// mode forbids: under GODEBUG=fips140=only the kit cannot run (the
// embedded Redis panics, "use of SHA-1 is not allowed in FIPS 140-only
// mode", at the first script, and the test binary fails). Run tests that
// use it without that setting.
package redisynctest
