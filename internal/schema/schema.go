// Package schema is the one definition of what redisync stores in Redis:
// the names of every key and channel of a lock and of a semaphore, the
// hash tag that keeps them in one Redis Cluster slot, the slot itself, and
// the formats of the records the scripts write. The library, the command
// line and the benchmark all name keys through it; the Lua scripts in
// scripts/ read and write the same records (each script's header says
// which keys it takes; scripts.go in the root package is the one place
// that passes them in that order).
package schema

import (
	"strconv"
	"strings"
)

// Layout is the version of the stored layout: of the keys below and the
// records in them. It changes whenever a change to either could make an
// older or newer redisync misread the state; LAYOUT in scripts/lib.lua is
// the same number. A lock's hash carries it in the field LayoutField, a
// semaphore's size record after the size. State without it was written by
// layout 1, before layouts were numbered.
const Layout = 2

// LayoutField is the field of a lock's hash that holds its layout. No hold
// id can be it (a label has no braces) nor any hand-off handle.
const LayoutField = "{layout}"

// DefaultPrefix is the prefix of every key and channel unless one is set.
const DefaultPrefix = "redisync"

// ValidPrefix reports whether p can prefix keys: it must be non-empty and
// hold no brace, which would change the keys' hash tag.
func ValidPrefix(p string) bool {
	return p != "" && !strings.ContainsAny(p, "{}")
}

// base returns the name of a primitive's main key, "prefix:kind:{name}";
// every other key of it starts with it. The name is the hash tag.
func base(prefix, kind, name string) string {
	return prefix + ":" + kind + ":{" + name + "}"
}

// Lock is the keys and channel of one lock.
type Lock struct {
	// Hash is the lock: a hash of hold id -> hold count, LayoutField ->
	// Layout and, when the holder has metadata, MetaField -> it, with the
	// lease as the key's TTL. It exists exactly while the lock is held.
	Hash string
	// Token is the last fencing token issued (a decimal integer): the
	// holder's while the lock is held (it lives as long as the hold's
	// lease), and kept an hour after the last hold was taken.
	Token string
	// Queue is the fair queue: a zset of ticket -> the server time in µs
	// when it joined, made larger than the last member's so that the
	// order is the order of arrival (scripts/lib.lua, join_queue).
	Queue string
	// Waiters holds the fair waiters' records: a hash of ticket -> a
	// LockWaiter record.
	Waiters string
	// Bargers records which clients have plain (barging) waiters: a zset
	// of client id -> the server time in ms until which the record
	// stands (its waiter attempts again before then). A release that
	// hands the lock to nobody takes out the record that runs out first
	// and wakes that client, with an empty message on its GrantChannel
	// (scripts/lib.lua, wake_barger). It lives as long as its last record.
	Bargers string
	// Channel names the lock's channels: a client's GrantChannel is
	// Channel, ":" and the client id. (Layout 2 before barging waiters were
	// recorded published an empty message on Channel itself at every
	// release that handed the lock to nobody, for every process's plain
	// waiters.)
	Channel string
	// Revision and Changes are an election's (ElectionKeys), "" for a
	// plain lock. Revision is the revision of the election's last
	// change (a decimal integer, see scripts/lib.lua, announce), kept an
	// hour after it; every change is published on Changes as an
	// ElectionChange record.
	Revision string
	Changes  string
}

// GrantChannel returns the channel on which grants to the fair waiters of
// the client client, and wake-ups of its plain waiters, are published: the
// lock's channel followed by ":" and the client id, in the lock's slot.
// Only that client's process hears them.
func (k Lock) GrantChannel(client string) string { return k.Channel + ":" + client }

// LockOfGrantChannel returns the keys of the lock whose GrantChannel
// channel is (of any client), and false when channel is no lock's grant
// channel (a semaphore's, a read-write lock's, an election's).
func LockOfGrantChannel(channel string) (Lock, bool) {
	i := strings.LastIndex(channel, "}:ch:")
	if i < 0 {
		return Lock{}, false
	}
	b := channel[:i+1]
	tag := strings.IndexByte(b, '{') // the first: a prefix has no brace
	if tag < 0 || !strings.HasSuffix(b[:tag], ":lock:") {
		return Lock{}, false
	}
	return lockKeys(b), true
}

// LockKeys returns the keys of the lock called name under prefix.
func LockKeys(prefix, name string) Lock { return lockKeys(base(prefix, "lock", name)) }

// ElectionKeys returns the keys of the election called name under prefix:
// a lock's, whose holder is the leader, with its Revision and Changes.
func ElectionKeys(prefix, name string) Lock {
	k := lockKeys(base(prefix, "elect", name))
	k.Revision, k.Changes = k.Hash+":rev", k.Hash+":changes"
	return k
}

// lockKeys returns the keys of the lock whose hash is b.
func lockKeys(b string) Lock {
	return Lock{Hash: b, Token: b + ":token", Queue: b + ":queue",
		Waiters: b + ":waiters", Bargers: b + ":bargers", Channel: b + ":ch"}
}

// Tombstone returns the key that exists once the call of the ticket id has
// ended, so that a late copy of one of its calls takes nothing: its hold
// was released (the key holds the hold's token for 10 s, so that a
// retried release knows it applied), or the call was withdrawn (the key
// lives 2 minutes). See scripts/lib.lua, ended.
func (k Lock) Tombstone(id string) string { return k.Hash + ":released:" + id }

// LockWaiter is a fair waiter's record, stored as "deadline:handoff"; its
// metadata, when it has any, is stored apart, under WaiterMetaField
// (8f61dc3 stored "deadline:handoff:metadata", which every earlier
// version takes for the record of a dead waiter).
type LockWaiter struct {
	Deadline int64  // server time in ms by which it must heartbeat again
	Handoff  int64  // the lease in ms of a hold handed to it
	Metadata string // stored with the hold handed to it
}

// ParseLockWaiter decodes a fair waiter's record.
func ParseLockWaiter(rec string) (LockWaiter, bool) {
	parts := strings.SplitN(rec, ":", 3)
	if len(parts) < 2 {
		return LockWaiter{}, false
	}
	f, ok := ints(parts[0]+":"+parts[1], 2)
	if !ok {
		return LockWaiter{}, false
	}
	w := LockWaiter{Deadline: f[0], Handoff: f[1]}
	if len(parts) == 3 {
		w.Metadata = parts[2]
	}
	return w, true
}

// ElectionChange is a change of an election's leader, published on its
// Changes channel as "revision:previous:token:lease:value".
type ElectionChange struct {
	Revision int64  // of this change
	Previous int64  // of the change before it; 0 when forgotten
	Token    int64  // the new leader's fencing token; 0: no leader
	Lease    int64  // the leader's remaining lease in ms; 0: no leader
	Value    string // the leader's value
}

// ParseElectionChange decodes a change published on an election's
// Changes channel.
func ParseElectionChange(msg string) (ElectionChange, bool) {
	parts := strings.SplitN(msg, ":", 5)
	if len(parts) != 5 {
		return ElectionChange{}, false
	}
	f, ok := ints(strings.Join(parts[:4], ":"), 4)
	if !ok {
		return ElectionChange{}, false
	}
	return ElectionChange{Revision: f[0], Previous: f[1], Token: f[2], Lease: f[3], Value: parts[4]}, true
}

// ParseSemSize decodes a semaphore's size record, "size:layout" (or
// "size", written by layout 1), into the size and its layout.
func ParseSemSize(rec string) (size int64, layout int, ok bool) {
	n, l, found := strings.Cut(rec, ":")
	size, err := strconv.ParseInt(n, 10, 64)
	if err != nil || size < 0 {
		return 0, 0, false
	}
	if !found {
		return size, 1, true
	}
	v, err := strconv.Atoi(l)
	return size, v, err == nil
}

// Semaphore is the keys and channel of one semaphore.
type Semaphore struct {
	// Holders is a hash of holder id -> a SemHolder record.
	Holders string
	// Expiry is a zset of holder id -> the end of its lease, in ms by
	// the server clock; a holder whose lease ended is reclaimed by the
	// next script call.
	Expiry string
	// Size is the semaphore's size record (ParseSemSize), stored while it
	// is in use and an hour after the last Acquire.
	Size string
	// Queue is a zset of waiter id ("holder id#call number") -> the server
	// time in µs when it joined, as a lock's queue.
	Queue string
	// Waiters holds the waiters' records: a hash of waiter id -> a
	// SemWaiter record.
	Waiters string
	// Released is a zset of holder ids whose holding a release ended ->
	// the server time in ms, kept 10 s, so that a late copy of a call of
	// an ended holding takes nothing.
	Released string
	// Withdrawn is a zset of waiter ids withdrawn with an unknown outcome,
	// as a lock's.
	Withdrawn string
	// Channel prefixes the grant channels (GrantChannel), where grants
	// are published.
	Channel string
	// Token is the last fencing token issued to a write of a RWMutex
	// (a decimal integer), kept an hour after it was issued, as a lock's;
	// a semaphore never writes it.
	Token string
}

// GrantChannel returns the channel on which grants to the waiters of the
// client client are published, as for a lock (Lock.GrantChannel).
func (k Semaphore) GrantChannel(client string) string { return k.Channel + ":" + client }

// SemaphoreKeys returns the keys of the semaphore called name under prefix.
func SemaphoreKeys(prefix, name string) Semaphore { return semKeys(prefix, "sem", name) }

// RWMutexKeys returns the keys of the read-write lock called name under
// prefix: those of a semaphore (a RWMutex is one of a fixed size, see
// RWMutexSize) of their own kind, "rw", so that a RWMutex never shares a
// key with a Semaphore of the same name.
func RWMutexKeys(prefix, name string) Semaphore { return semKeys(prefix, "rw", name) }

// RWMutexSize is the size of the semaphore under a RWMutex: a read holds
// one permit, a write all of them. It is exact in Lua's numbers (below
// 2^53) with any number of readers a Redis can hold.
const RWMutexSize = 1 << 40

// semKeys returns the keys of a semaphore of kind kind.
func semKeys(prefix, kind, name string) Semaphore {
	b := base(prefix, kind, name)
	return Semaphore{Holders: b, Expiry: b + ":expiry", Size: b + ":size", Queue: b + ":queue",
		Waiters: b + ":waiters", Released: b + ":released", Withdrawn: b + ":withdrawn", Channel: b + ":ch",
		Token: b + ":token"}
}

// SemHolder is a semaphore holder's record, stored as "permits:seq".
type SemHolder struct {
	Permits int64 // permits held
	Seq     int64 // the highest call number of the holder applied
}

// ParseSemHolder decodes a semaphore holder's record.
func ParseSemHolder(rec string) (SemHolder, bool) {
	f, ok := ints(rec, 2)
	if !ok {
		return SemHolder{}, false
	}
	return SemHolder{Permits: f[0], Seq: f[1]}, true
}

// SemWaiter is a semaphore waiter's record, stored as
// "deadline:grant:permits:seq".
type SemWaiter struct {
	Deadline int64 // server time in ms by which it must heartbeat again
	Grant    int64 // the lease in ms of permits granted to it
	Permits  int64 // permits wanted
	Seq      int64 // the call number of the attempt that queued it
}

// ParseSemWaiter decodes a semaphore waiter's record.
func ParseSemWaiter(rec string) (SemWaiter, bool) {
	f, ok := ints(rec, 4)
	if !ok {
		return SemWaiter{}, false
	}
	return SemWaiter{Deadline: f[0], Grant: f[1], Permits: f[2], Seq: f[3]}, true
}

// ints splits a record of n decimal integers separated by ':'.
func ints(rec string, n int) ([]int64, bool) {
	parts := strings.Split(rec, ":")
	if len(parts) != n {
		return nil, false
	}
	f := make([]int64, n)
	for i, p := range parts {
		v, err := strconv.ParseInt(p, 10, 64)
		if err != nil {
			return nil, false
		}
		f[i] = v
	}
	return f, true
}

// MetaField is the field of a lock's hash that holds its holder's
// metadata, when it has any.
const MetaField = "{meta}"

// ProclaimField is the field of an election's lock hash that holds the
// number of the last Proclaim applied to its hold (Election.Proclaim), so
// that a late copy of an earlier one changes nothing.
const ProclaimField = "{proclaim}"

// WaiterMetaField is the field of a lock's waiters hash that holds the
// metadata of the fair waiter ticket, when it has any. No ticket starts
// with '{'.
func WaiterMetaField(ticket string) string { return MetaField + ticket }

// ClientField returns the field of a waiters hash (a lock's or a
// semaphore's) that holds the liveness deadline of the Client of id (a
// ticket or a semaphore waiter id): the server time in ms until which its
// waiters are alive, whatever their own records say. No ticket or waiter
// id starts with '{'.
func ClientField(id string) string { return "{client}" + Client(id) }

// HandoffPrefix starts every hand-off handle: the hold id under which a
// hold waits, in the lock's hash, for the process it is handed to. No hold
// id starts with '{'.
const HandoffPrefix = "{handoff}"

// Label returns the label that starts a hold id ("label/client-n") or a
// hand-off handle, or "" for an id without one. A semaphore waiter id's
// label is its holder id's.
func Label(id string) string {
	id = strings.TrimPrefix(id, HandoffPrefix)
	i := strings.LastIndexByte(id, '/')
	if i < 0 {
		return ""
	}
	return id[:i]
}

// Client returns the client id in a hold id ("label/client-n"), a
// semaphore waiter id ("label/client-n#m") or a ticket, or "" for an id of
// another form. The scripts find it the same way (scripts/lib.lua,
// grant_channel).
func Client(id string) string {
	id = id[strings.LastIndexByte(id, '/')+1:]
	if i := strings.LastIndexByte(id, '#'); i >= 0 {
		id = id[:i]
	}
	i := strings.LastIndexByte(id, '-')
	if i < 0 {
		return ""
	}
	return id[:i]
}

// Slot returns the Redis Cluster hash slot of key: CRC16 (XMODEM) of the
// key's hash tag (the part between the first '{' and the next '}', when
// not empty) or of the whole key, modulo 16384.
func Slot(key string) uint16 {
	if i := strings.IndexByte(key, '{'); i >= 0 {
		if j := strings.IndexByte(key[i+1:], '}'); j > 0 {
			key = key[i+1 : i+1+j]
		}
	}
	var crc uint16
	for k := 0; k < len(key); k++ {
		crc ^= uint16(key[k]) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return crc % 16384
}
