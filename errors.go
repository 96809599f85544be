package redisync

import (
	"errors"
	"fmt"
	"strings"
)

// Sentinel errors. Errors returned by this package wrap them, so test with
// errors.Is. Errors from the context (context.Canceled,
// context.DeadlineExceeded) and from Redis are wrapped as they are.
var (
	// ErrNotHeld is returned by Unlock when the Mutex does not hold the lock.
	ErrNotHeld = errors.New("redisync: not held")
	// ErrReleased is the cause (context.Cause) of a hold's context when
	// the hold was released: see Mutex.HoldContext.
	ErrReleased = errors.New("redisync: released")
	// ErrHeld is returned by Mutex.Accept when the Mutex holds the lock
	// already: a value holds one hold at a time.
	ErrHeld = errors.New("redisync: held already")
	// ErrLockLost is returned when a hold has been lost: its lease ran out
	// or its key was removed behind the holder's back. Another owner may
	// have taken the lock since. A Semaphore returns it when its holder's
	// permits have been lost the same way.
	ErrLockLost = errors.New("redisync: lock lost")
	// ErrClosed is returned by every call on a closed Client and by calls
	// that were waiting when it was closed.
	ErrClosed = errors.New("redisync: client closed")
	// ErrInvalid is wrapped by every error that reports an argument the
	// call cannot take, before any call to Redis: a bad name, option,
	// number of permits, value, set of names or nodes (each has its own
	// sentinel below, which errors.Is also sees), and the use of a zero
	// value of a primitive, which only its constructor makes usable. Such
	// an error is a mistake in the calling code: trying again does not
	// help.
	ErrInvalid = errors.New("redisync: invalid argument")
	// ErrNilClient is returned by New given a nil Redis client, and by
	// NewRedlock given a nil node.
	ErrNilClient = invalid("redisync: nil redis client")
	// ErrUnsupportedClient is returned by New, and NewRedlock, given a
	// Redis client that redisync cannot use (see New).
	ErrUnsupportedClient = errors.New("redisync: unsupported redis client")
	// ErrUnsupportedServer is returned by the first calls of a Client
	// whose server lacks a command that redisync needs: Lua scripting
	// (Redis 7.0 or later, Valkey 8.0 or later, with Lua) or, on a Redis
	// Cluster, sharded pub/sub (Redis 7; or give WithPlainPubSub). The
	// error says which, and what to do.
	ErrUnsupportedServer = errors.New("redisync: unsupported redis server")
	// ErrInvalidName is returned by the constructors (and Inspect...,
	// ResizeSemaphore) for an empty name, one longer than MaxNameLen
	// bytes, or one that starts with '}'.
	ErrInvalidName = invalid("redisync: invalid name")
	// ErrInvalidOption is returned when an option is out of its range (a
	// lease that is not positive or longer than MaxLease, a key prefix
	// with braces, ...) or means nothing where it is given: by the
	// constructor given it, and for such a lease given to Extend.
	ErrInvalidOption = invalid("redisync: invalid option")
	// ErrNotReplicated is returned, with WithReplicas, when fewer replicas
	// than asked acknowledged an acquisition in time. The acquisition was
	// undone.
	ErrNotReplicated = errors.New("redisync: not acknowledged by enough replicas")
	// ErrQueueFull is returned by a fair Mutex's Lock (a MultiMutex's
	// Lock, an Election's Campaign) when the lock's fair queue holds as
	// many calls as WithMaxWaiters allows already: the call did not join
	// it, and left nothing in Redis. Try again later, or allow more
	// waiters with WithMaxWaiters.
	ErrQueueFull = errors.New("redisync: too many calls queued for the lock")
	// ErrWrongType is returned when a key that redisync uses already holds
	// a value of another type. Nothing is written in that case.
	ErrWrongType = errors.New("redisync: key holds the wrong type of value")

	// ErrLayout reports state in Redis written by a version of redisync that
	// stores it in another layout (a rolling deploy that mixes versions on
	// one Redis): the call holds nothing. See docs/upgrading.md.
	ErrLayout = errors.New("redisync: state written in another layout")
	// ErrSizeMismatch is returned by Client.ResizeSemaphore when the size
	// stored in Redis is not the size it resizes from; nothing is changed
	// then. (A Semaphore value works with the stored size, whatever size
	// it was made with.)
	ErrSizeMismatch = errors.New("redisync: semaphore size mismatch")
	// ErrInvalidPermits is returned, before any call to Redis, for a
	// Semaphore size that is not positive or exceeds MaxSemaphoreSize, or a
	// number of permits that is not positive or exceeds the size.
	ErrInvalidPermits = invalid("redisync: invalid number of permits")
	// ErrTooManyReleased is returned by Semaphore.Release when asked to
	// release more permits than the Semaphore holds. Nothing is released.
	// When it holds none, the error is ErrNotHeld too (errors.Is).
	ErrTooManyReleased = errors.New("redisync: released more permits than held")
	// ErrQuorum is returned by a Redlock's Lock and TryLock when fewer
	// than a quorum (a majority) of its nodes answered within the node
	// timeout, or a quorum granted the lock too late to leave any validity;
	// they leave nothing held then. Unlock returns it when more than N -
	// quorum nodes could not be told: the lock stays held there until the
	// leases run out. The failed nodes' errors are wrapped with it, in a
	// *NodeErrors.
	ErrQuorum = errors.New("redisync: no quorum of redlock nodes")
	// ErrNoNodes is returned by NewRedlock given no nodes.
	ErrNoNodes = invalid("redisync: no redlock nodes")
	// ErrDuplicateNode is returned by NewRedlock given the same Redis
	// client (or two *redis.Client with the same address and database)
	// twice: one server counted twice would break the majority.
	ErrDuplicateNode = invalid("redisync: duplicate redlock node")
	// ErrUpgrade is returned at once by RWMutex.Lock and TryLock when the
	// RWMutex holds only reads: a read is never upgraded to a write (two
	// readers upgrading would wait for each other for good). Release the
	// reads first.
	ErrUpgrade = errors.New("redisync: read lock held, not upgraded to a write")

	// ErrUnconfirmed is wrapped, with its cause, by the error of a
	// release (Unlock, RUnlock, Release, Resign, Handoff, a Do's release)
	// that failed or whose reply did not come in time: what it released
	// is no longer renewed, so Redis frees it within its lease at the
	// latest. errors.Is tells it from a call that failed before it
	// released anything.
	ErrUnconfirmed = errors.New("redisync: release not confirmed")
)

// invalid returns a sentinel for one kind of invalid argument: errors.Is
// finds ErrInvalid in it too.
func invalid(msg string) error { return &invalidError{msg} }

type invalidError struct{ msg string }

func (e *invalidError) Error() string        { return e.msg }
func (e *invalidError) Is(target error) bool { return target == ErrInvalid }

// errZeroValue is the error of every call of a primitive's zero value.
var errZeroValue = invalid("redisync: a zero value: make it with its constructor (Client.NewMutex, ...)")

// NodeErrors lists the nodes of a Redlock that failed in one call, each
// with its cause. Lock, TryLock and Unlock wrap it with ErrQuorum when too
// many nodes failed; errors.As finds it:
//
//	var ne *redisync.NodeErrors
//	if errors.As(err, &ne) {
//		for _, n := range ne.Nodes {
//			log.Printf("node %d: %v", n.Node, n.Err)
//		}
//	}
//
// It wraps every node's error, so that errors.Is sees the causes too.
type NodeErrors struct {
	Nodes []NodeError // in the order of the nodes given to NewRedlock
}

// Error lists the failed nodes' errors on one line, separated by "; ".
func (e *NodeErrors) Error() string {
	s := make([]string, len(e.Nodes))
	for i, n := range e.Nodes {
		s[i] = n.Error()
	}
	return strings.Join(s, "; ")
}

// Unwrap returns each failed node's *NodeError, for errors.Is and
// errors.As.
func (e *NodeErrors) Unwrap() []error {
	errs := make([]error, len(e.Nodes))
	for i := range e.Nodes {
		errs[i] = &e.Nodes[i]
	}
	return errs
}

// NodeError is why one node of a Redlock failed in a call. Its methods
// have pointer receivers, as NodeErrors' do: errors.As finds a
// *NodeError.
type NodeError struct {
	// Node is the node's index in the slice given to NewRedlock.
	Node int
	// Err is the node's error: one from Redis or from the context,
	// ErrClosed, or one that says that the node gave no reply within
	// the node timeout (WithNodeTimeout), or had not returned from an
	// earlier call given up on yet.
	Err error
}

// Error says which node failed, and why: "node 2: ...".
func (e *NodeError) Error() string { return fmt.Sprintf("node %d: %v", e.Node, e.Err) }

// Unwrap returns the node's error.
func (e *NodeError) Unwrap() error { return e.Err }

// errNoReply and errNodeBusy are the causes of a NodeError that are not
// errors of a call: a node that did not answer within the node timeout,
// and one that was left out of a round because an earlier call to it,
// given up on, had not returned.
var (
	errNoReply  = errors.New("no reply within the node timeout")
	errNodeBusy = errors.New("an earlier call has not returned")
)

// redisError makes an error from Redis read as one clean line: without
// what Redis appends to a script's error (its SHA and line, a Lua stack
// traceback). A script's own error starts with its kind, after a position
// prefix (hence Index), and may name keys after it: the first kind in the
// message is the error's. It adds ErrWrongType when Redis or a script
// reported a key of the wrong type, ErrLayout for state of another layout,
// and ErrInvalidOption for an argument beyond a script's limits.
func redisError(err error) error {
	msg := oneLine(err.Error())
	kind, i := "", len(msg)
	for _, k := range []string{"LIMIT redisync: ", "LAYOUT redisync: ", "WRONGTYPE"} {
		if j := strings.Index(msg, k); j >= 0 && j < i {
			kind, i = k, j
		}
	}
	switch kind {
	case "LIMIT redisync: ":
		return fmt.Errorf("%w: %s (%w)", ErrInvalidOption, msg[i+len(kind):], err)
	case "LAYOUT redisync: ":
		return &layoutError{detail: msg[i+len(kind):], err: err}
	case "WRONGTYPE":
		detail := strings.TrimPrefix(strings.TrimSpace(msg[i+len(kind):]), "redisync: ")
		return &wrongType{detail: strings.TrimSuffix(detail, "."), err: err}
	}
	if u := unsupported(err); u != nil {
		return u
	}
	if msg == err.Error() {
		return err
	}
	return &cleaned{msg: msg, err: err}
}

// oneLine cuts what Redis appends to a script's error from msg.
func oneLine(msg string) string {
	for _, cut := range []string{" script:", " stack traceback", "\n"} {
		if j := strings.Index(msg, cut); j >= 0 {
			msg = msg[:j]
		}
	}
	return strings.TrimSpace(msg)
}

// cleaned is an error from Redis, on one line.
type cleaned struct {
	msg string
	err error // from Redis
}

func (e *cleaned) Error() string { return e.msg }
func (e *cleaned) Unwrap() error { return e.err }

// wrongType is ErrWrongType with what Redis said about it, on one line.
type wrongType struct {
	detail string
	err    error // from Redis
}

func (e *wrongType) Error() string { return ErrWrongType.Error() + ": " + e.detail }
func (e *wrongType) Unwrap() []error {
	if e.err == nil {
		return []error{ErrWrongType}
	}
	return []error{ErrWrongType, e.err}
}

// layoutError is ErrLayout with what the script said: which key, which
// layout.
type layoutError struct {
	detail string
	err    error // from Redis
}

func (e *layoutError) Error() string   { return ErrLayout.Error() + ": " + e.detail }
func (e *layoutError) Unwrap() []error { return []error{ErrLayout, e.err} }

// OpError is the error of every call of a primitive, and of the Client's
// calls on a name (Inspect*, ResizeSemaphore): which operation, on which
// name, and why. errors.As finds it; errors.Is sees through it to the
// cause, a sentinel of this package or an error of Redis or of the
// context:
//
//	var oe *redisync.OpError
//	if errors.As(err, &oe) {
//		log.Printf("%s of %q failed: %v", oe.Op, oe.Name, oe.Err)
//	}
type OpError struct {
	// Op is the operation, as a word or two: "lock", "unlock", "acquire",
	// "rlock", "campaign", "redlock lock", "inspect semaphore", ...
	Op string
	// Name is the name of the primitive.
	Name string
	// Err is the cause.
	Err error
}

// Error reads "redisync: OP "NAME": CAUSE", the name shortened to 64 bytes.
func (e *OpError) Error() string {
	return "redisync: " + e.Op + " " + quote(e.Name) + ": " + strings.TrimPrefix(e.Err.Error(), "redisync: ")
}

// Unwrap returns the cause.
func (e *OpError) Unwrap() error { return e.Err }

// wrapOp says that op on the primitive called name failed with err, unless
// err says so already.
func wrapOp(op, name string, err error) error {
	var oe *OpError
	if errors.As(err, &oe) {
		return err
	}
	return &OpError{Op: op, Name: name, Err: err}
}

// notHeldToo is err, a failure of a call that needs a hold when there is
// none, that errors.Is also finds to be ErrNotHeld: every primitive's
// "nothing held" is ErrNotHeld, whatever its own words for it.
func notHeldToo(err error) error { return &notHeldError{err} }

type notHeldError struct{ err error }

func (e *notHeldError) Error() string   { return e.err.Error() }
func (e *notHeldError) Unwrap() []error { return []error{e.err, ErrNotHeld} }

// quote shortens and quotes a name for an error message.
func quote(name string) string {
	const max = 64
	if len(name) > max {
		name = name[:max] + "..."
	}
	return `"` + name + `"`
}

// Bad input to Client.NewMultiMutex, which refuses it (as it refuses an
// invalid name with ErrInvalidName); each wraps ErrInvalid.
var (
	// ErrNoNames is returned by NewMultiMutex given no names.
	ErrNoNames = invalid("redisync: no lock names")
	// ErrTooManyNames is returned by NewMultiMutex given more than
	// MaxMultiNames names. Hold fewer names at once.
	ErrTooManyNames = invalid("redisync: too many lock names")
	// ErrDuplicateName is returned by NewMultiMutex given the same name
	// twice: a set holds each name once.
	ErrDuplicateName = invalid("redisync: duplicate lock name")
)
