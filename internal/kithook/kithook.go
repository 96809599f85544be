// Package kithook lets the testing kit (module
// github.com/redisync/redisync/redisynctest) reach into a redisync.Client
// without adding anything to redisync's public API: package redisync sets
// these functions in its init, and the kit, whose import path is under
// github.com/redisync/redisync, calls them. Their argument is a
// *redisync.Client (typed any: this package cannot import redisync).
package kithook

var (
	// ID returns the Client's id: the client part of every hold id and
	// ticket it mints, and the suffix of its grant channels
	// (internal/schema, Lock.GrantChannel).
	ID func(client any) string
	// RenewNow has the Client's watchdog renew every hold it renews at
	// once (internal/watchdog, Watchdog.RenewNow): a hold whose lease
	// ended in Redis is reported lost by the reply.
	RenewNow func(client any)
	// Lose reports lost the hold of the lock whose hash is key held by
	// owner (a ticket), which the kit has just ended in Redis, and
	// reports whether the Client held it (internal/watchdog,
	// Watchdog.Lose).
	Lose func(client any, key, owner string) bool
	// Wake has a waiter of the Client on the named channel look again,
	// as the wake-up that a release publishes does, in the process
	// (internal/waiters, Registry.Wake).
	Wake func(client any, channel string)
	// WakeAll has a waiter of the Client on every channel look again.
	WakeAll func(client any)
	// DropHolds reports every hold of the Client lost now
	// (internal/watchdog, Watchdog.DropHolds): its process stands for a
	// dead one. It returns the hash and the owner of each of its holds of
	// a lock.
	DropHolds func(client any) (keys, owners []string)
)
