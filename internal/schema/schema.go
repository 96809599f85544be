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
	"fmt"
	"strconv"
	"strings"
)

// Layout is the version of a lock's stored layout: of its keys and the
// records in them (an election's too). It changes whenever a change to
// either could make an older or newer redisync misread the state; LAYOUT
// in scripts/lock_lib.lua is the same number. A lock's hash carries it in
// the field LayoutField. State without it was written by layout 1, before
// layouts were numbered.
const Layout = 3

// SemLayout is the version of a semaphore's (and a RWMutex's) stored
// layout, carried in its size record after the size; SEM_LAYOUT in
// scripts/sem_lib.lua is the same number. Layout 3 (redisync v1.0.0)
// kept the size, the waiters' records, the memory of releases and of
// withdrawals, and a RWMutex's last token in keys of their own, eight
// keys in all; layout 4 (never released) kept the semaphore's own fields
// in its hash.
const SemLayout = 5

// SemUsedField is the field of a semaphore's hash that counts the
// permits in use (USED in scripts/sem_lib.lua), with the layout:
// "count:layout" (ParseSemUsed).
const SemUsedField = "{used}"

// ParseSemUsed decodes a semaphore's count of permits in use,
// "count:layout" (a bare count before layout 5), into the count and its
// layout (0 for a bare count).
func ParseSemUsed(rec string) (used int64, layout int, ok bool) {
	n, l, found := strings.Cut(rec, ":")
	used, err := strconv.ParseInt(n, 10, 64)
	if err != nil || used < 0 {
		return 0, 0, false
	}
	if !found {
		return used, 0, true
	}
	layout, err = strconv.Atoi(l)
	return used, layout, err == nil
}

// SemFields are the semaphore's own fields of its hash
// (scripts/sem_lib.lua): its count of permits in use (SemUsedField), its
// size record, the server times until which its keys live and its
// refusals are read, when it next prunes, and a RWMutex's last fencing
// token. Every other field is a holder's or a waiter's record, or a
// Client's deadline.
var SemFields = []string{SemUsedField, "{size}", "{keep}", "{gone}", "{refuse}", "{prune}", "{token}"}

// LayoutField is the field of a lock's hash that holds its layout.
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
	// Hash is the lock's state, a hash whose fields LockState lists
	// (scripts/lock_lib.lua). A release does not delete it: it lives at
	// least an hour past the last hold's lease, so that fencing tokens go
	// on increasing and withdrawn calls stay refused.
	Hash string
	// Queue is the fair queue: a list of QueueRecord, in the order of
	// arrival. It lives as long as Hash.
	Queue string
	// Bargers records which clients have plain (barging) waiters: a zset
	// of client id -> the server time in ms until which the record
	// stands (its waiter attempts again before then). A release that
	// hands the lock to nobody takes out the record that runs out first
	// and wakes that client, with an empty message on its GrantChannel
	// (scripts/lock_lib.lua, wake_barger). It lives as long as its last
	// record.
	Bargers string
	// Channel names the lock's channels: a client's GrantChannel is
	// Channel, ":" and the client id.
	Channel string
	// Changes is an election's channel of changes (ElectionKeys), "" for
	// a plain lock: every change of leader or value is published there as
	// an ElectionChange record.
	Changes string
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
// a lock's, whose holder is the leader, with its Changes.
func ElectionKeys(prefix, name string) Lock {
	k := lockKeys(base(prefix, "elect", name))
	k.Changes = k.Hash + ":changes"
	return k
}

// lockKeys returns the keys of the lock whose hash is b.
func lockKeys(b string) Lock {
	return Lock{Hash: b, Queue: b + ":waiting", Bargers: b + ":bargers", Channel: b + ":ch"}
}

// Tombstone returns the key that refuses the ticket id once its call
// withdrew while a call of it might still be on its way, so that its late
// arrival takes nothing (scripts/lock_lib.lua, withdraw). It lives an
// hour.
func (k Lock) Tombstone(id string) string { return k.Hash + ":released:" + id }

// The fields of a lock's hash (scripts/lock_lib.lua).
const (
	OwnerField    = "{owner}"    // the holder's ticket, or a hand-off handle; "" when free
	EndField      = "{end}"      // the end of the holder's lease, in ms of server time
	TokenField    = "{token}"    // the last fencing token issued
	MetaField     = "{meta}"     // the holder's metadata
	QueueField    = "{queue}"    // how many records the queue holds
	SeqField      = "{seq}"      // the number of the last record queued
	PoppedField   = "{popped}"   // the number of the last record taken from the queue's head
	WakeField     = "{wake}"     // "1" while plain waiters may be recorded in Bargers
	RefuseField   = "{refuse}"   // ms of server time until which tombstones may exist
	ExpiresField  = "{expires}"  // ms of server time when the hash runs out
	FreedField    = "{freed}"    // the token of the last hold a release ended
	RevField      = "{rev}"      // an election's revision of its last change
	ProclaimField = "{proclaim}" // the number of the leader's last Proclaim
)

// LockState is what a lock's hash says.
type LockState struct {
	Owner   string            // the holder's ticket or a hand-off handle; "" when free
	End     int64             // the end of the holder's lease, in ms of server time
	Token   int64             // the last fencing token issued
	Meta    string            // the holder's metadata
	Queue   int64             // how many records the queue holds
	Rev     int64             // an election's revision
	Clients map[string]string // client id -> its waiters' liveness deadline ("ms" or "ms:L")
}

// Held reports whether the state names a holder whose lease has not ended
// at now, in ms of server time.
func (s LockState) Held(now int64) bool { return s.Owner != "" && s.End > now }

// ParseLockState decodes a lock's hash, read with HGETALL. It reports
// false when the hash is not a lock's of this layout (an empty hash is a
// lock never used, or forgotten).
func ParseLockState(h map[string]string) (LockState, bool) {
	if len(h) == 0 {
		return LockState{}, true
	}
	if h[LayoutField] != strconv.Itoa(Layout) {
		return LockState{}, false
	}
	s := LockState{Owner: h[OwnerField], Meta: h[MetaField]}
	for f, p := range map[string]*int64{EndField: &s.End, TokenField: &s.Token, QueueField: &s.Queue, RevField: &s.Rev} {
		if v := h[f]; v != "" {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				return LockState{}, false
			}
			*p = n
		}
	}
	for f, v := range h {
		if id, ok := strings.CutPrefix(f, "{client}"); ok {
			if s.Clients == nil {
				s.Clients = map[string]string{}
			}
			s.Clients[id] = v
		}
	}
	return s, true
}

// QueueRecord is a fair waiter's record in a lock's queue, stored as "seq
// ticket joined deadline handoff metadata".
type QueueRecord struct {
	Seq      int64  // its number, larger than every earlier record's
	Ticket   string // the waiting call's
	Joined   int64  // server time in ms when it joined
	Deadline int64  // server time in ms until which it is alive on its own
	Handoff  int64  // the lease in ms of a hold handed to it
	Metadata string // stored with the hold handed to it
}

// String returns the record as stored.
func (r QueueRecord) String() string {
	return fmt.Sprintf("%d %s %d %d %d %s", r.Seq, r.Ticket, r.Joined, r.Deadline, r.Handoff, r.Metadata)
}

// ParseQueueRecord decodes a fair waiter's record.
func ParseQueueRecord(rec string) (QueueRecord, bool) {
	parts := strings.SplitN(rec, " ", 6)
	if len(parts) != 6 || parts[1] == "" {
		return QueueRecord{}, false
	}
	f, ok := ints(parts[0]+":"+parts[2]+":"+parts[3]+":"+parts[4], 4)
	if !ok {
		return QueueRecord{}, false
	}
	return QueueRecord{Seq: f[0], Ticket: parts[1], Joined: f[1], Deadline: f[2], Handoff: f[3], Metadata: parts[5]}, true
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
	// Hash holds the semaphore's records, by field: holder id -> a
	// SemHolder record; waiter id -> a SemWaiter record; ClientField(id)
	// -> a Client's liveness deadline; and the semaphore's own fields
	// (SemFields). It lives at least an hour past the semaphore's last
	// use.
	Hash string
	// Expiry is a zset of holder id -> the end of its lease, in ms by
	// the server clock; a holder whose lease ended is reclaimed by the
	// next script call.
	Expiry string
	// Queue is a zset of waiter id ("holder id#digits") -> the server
	// time in µs when it joined, as a lock's queue.
	Queue string
	// Ended is a zset of what a late copy of a call must not act on ->
	// the server time in ms until which it is remembered: "holder id:seq"
	// and "holder id" for 10 s after a release that ended a holding (so
	// that a retry of the release knows it was applied, and a late copy
	// of a call of the holding takes nothing), and the waiter ids of
	// withdrawn calls for two minutes.
	Ended string
	// Channel prefixes the grant channels (GrantChannel), where grants
	// are published.
	Channel string
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
	return Semaphore{Hash: b, Expiry: b + ":expiry", Queue: b + ":queue", Ended: b + ":ended", Channel: b + ":ch"}
}

// SemHolderField reports whether a field of a semaphore's hash is a
// holder's record: not one of the semaphore's own fields or a Client's
// deadline (their names start with '{'), nor a waiter's record (a waiter
// id ends with '#' and digits; a holder id never does).
func SemHolderField(f string) bool {
	if strings.HasPrefix(f, "{") {
		return false
	}
	i := strings.LastIndexByte(f, '#')
	return i < 0 || i == len(f)-1 || strings.Trim(f[i+1:], "0123456789") != ""
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

// ClientField returns the field of a lock's or a semaphore's hash that
// holds the liveness deadline of the Client of id (a
// ticket or a semaphore waiter id): the server time in ms until which its
// waiters are alive, whatever their own records say. No ticket or waiter
// id starts with '{'.
func ClientField(id string) string { return "{client}" + Client(id) }

// HandoffPrefix starts every hand-off handle: the hold id under which a
// hold waits, in the lock's hash, for the process it is handed to. No hold
// id starts with '{'.
const HandoffPrefix = "{handoff}"

// Label returns the label that starts a hold id ("label/client-n.random",
// see Client) or a
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

// Client returns the client id in a hold id or a ticket
// ("label/client-n.random", or "label/client-n"), a semaphore waiter id
// ("label/client-n.random#digits", or "label/client-n#m"), or "" for an
// id of another form; a random part is hex, without '-'. The scripts find
// it the same way (scripts/lib.lua, grant_channel).
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
