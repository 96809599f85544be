package roundtrip

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
)

// Lanes are a Client's own connections to one server, on which its round
// trips run in the caller's goroutine. Each lane is a go-redis client
// built from the user's client's options, used by one round trip at a
// time (so it holds one connection), with go-redis's retries off, whose
// connection a caller's context can cut short: once the caller's context has ended (and CleanupWait more, for a
// reply about to arrive), the connection's deadline is set in the past,
// so that go-redis returns at once and drops it. The next round trip on
// that lane dials anew. At most as many lanes as the user's pool holds
// connections are in use at once. In place of go-redis's retries, a round
// trip whose connection was dropped under it, or that a demoted primary
// refused (READONLY), is sent once more on a new lane (the first only when
// the user's client retries).
//
// A lane sees none of the hooks added to the user's client (AddHook):
// setup, when set, is run on each lane's client to add them.
type Lanes struct {
	opts   *redis.Options
	setup  func(*redis.Client) error
	slots  chan struct{} // one per lane in use
	retry  bool          // the user's client retries: so does a lane, once, on a new connection
	server Server        // what the round trips learnt of the server

	mu        sync.Mutex
	idle      []*lane // the last used last
	closed    bool
	replacing int                // lanes being made in reserve (spare)
	stop      context.Context    // ends when the lanes are closed
	stopAll   context.CancelFunc //
	spares    sync.WaitGroup     // the goroutines that make them
}

// Conn is the client a round trip on lanes is sent with: the lane's own
// client, of one connection, and what the Client learnt of the server.
type Conn struct {
	*redis.Client
	Server *Server
}

// Conn returns rdb, the user's client of the lanes' server, as a round
// trip on a lane gets its own: a script a Client sends on it goes as a
// function where those on lanes do, so that an ACL user that may call
// functions only may send every call of the Client on either.
func (ls *Lanes) Conn(rdb *redis.Client) *Conn { return &Conn{Client: rdb, Server: &ls.server} }

// Server is what a Client's round trips learnt of the server its lanes
// connect to, shared by every lane.
type Server struct {
	// Functions says whether the server runs redisync's scripts as a
	// function library (FCALL): 0 not known yet, 1 yes, -1 no (it has no
	// functions, or the ACL user may not call or load them).
	Functions atomic.Int32
	// Recheck, when Functions is -1 for a reason that may pass (the
	// library was missing and could not be loaded), is when (Unix ns) to
	// try a function again; 0: never.
	Recheck atomic.Int64
}

// lane is one connection of Lanes.
type lane struct {
	rdb    *redis.Client
	conn   *Conn                   // rdb, as round trips get it
	dialed atomic.Pointer[cutConn] // the connection the lane dialled last
	ctx    context.Context         // ends when the lane is cut short or closed: a dial under way gives up
	cancel context.CancelFunc
}

// close closes the lane's client, and gives up a dial under way.
func (l *lane) close() {
	l.cancel()
	_ = l.rdb.Close()
}

// NewLanes returns the lanes to the server that opts (a user's client's
// options, as its Options method returns them) connects to; setup, if not
// nil, is run on each lane's client when it is made.
func NewLanes(opts *redis.Options, setup func(*redis.Client) error) *Lanes {
	o := ownOptions(opts)
	// A lane runs one round trip at a time, so its pool holds one
	// connection; its size stays the user's, which is how many dials in a
	// row must fail before go-redis stops dialling for a while.
	o.MinIdleConns, o.MaxIdleConns = 0, 1
	o.MaxRetries = -1
	if o.Dialer == nil { // options not from a client: go-redis's own
		o.Dialer = redis.NewDialer(o)
	}
	ls := &Lanes{opts: o, setup: setup, slots: make(chan struct{}, max(opts.PoolSize, 1)), retry: opts.MaxRetries > 0}
	ls.stop, ls.stopAll = context.WithCancel(context.Background())
	return ls
}

// Do runs do on a lane, in the caller's goroutine, and returns what it
// returned. The round trip is cut short (a dial cancelled, a read or a
// write failed at once) when ctx ends, at GraceEnd(ctx) when grace is set,
// or at once when stop (if not nil) ends. cut reports that it failed cut
// short, or found no lane free before then: what it did in Redis, if
// anything, is not known.
func (ls *Lanes) Do(ctx context.Context, grace bool, stop context.Context, do Do) (res []int64, cut bool, err error) {
	var stopped <-chan struct{}
	if stop != nil {
		stopped = stop.Done()
	}
	select {
	case ls.slots <- struct{}{}: // a round trip due after ctx ended is sent when a lane is free
	default:
		select {
		case ls.slots <- struct{}{}:
		case <-ctx.Done():
			return nil, true, ctx.Err()
		case <-stopped:
			return nil, true, stop.Err()
		}
	}
	defer func() { <-ls.slots }()
	l, err := ls.get()
	if err != nil {
		return nil, false, err
	}
	rctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	defer cancel()
	u := &use{l: l, cancel: cancel}
	endCtx := context.AfterFunc(ctx, func() {
		if grace {
			u.cutAt(GraceEnd(ctx))
		} else {
			u.cut()
		}
	})
	endStop := func() bool { return true }
	if stop != nil {
		endStop = context.AfterFunc(stop, u.cut)
	}
	res, err = do(rctx, l.conn)
	if err != nil && (readOnly(err) || (ls.retry && dropped(err))) {
		// The lane's connection was closed by the server or on the way
		// (an idle connection that a restart or a proxy dropped), as
		// go-redis would retry; or the lane was dialled to a server
		// that a failover has demoted since, where the script wrote
		// nothing. Once more, on a new lane. (Every round trip sent on
		// lanes may run twice: go-redis's retries make the same copies.)
		if nl, gerr := u.swap(ls); gerr != nil {
			err = gerr
		} else if nl != nil {
			l = nl
			res, err = do(rctx, l.conn)
		}
	}
	endCtx()
	endStop()
	wasCut := u.finish()
	if wasCut || (err != nil && err != redis.Nil) {
		// Its connection may be cut, broken, or to a server that no
		// longer serves as the primary: it is replaced by a new lane.
		l.close()
		ls.spare()
	} else {
		ls.put(l)
	}
	return res, wasCut && err != nil, err
}

// stateFields are the fields of redis.Options, in the go-redis versions
// that have them, through which a client keeps state of its own, or that
// go-redis changes in place while the client runs (under a lock of the
// client's: MaintNotificationsConfig): a lane's client starts from the
// defaults there, never reading or sharing the user's client's.
var stateFields = []string{"PushNotificationProcessor", "ClientSideCache", "ClientSideCacheConfig", "MaintNotificationsConfig"}

// ownOptions returns a copy of opts for a client of its own, the fields
// of stateFields left unset.
func ownOptions(opts *redis.Options) *redis.Options {
	o := *opts
	v := reflect.ValueOf(&o).Elem()
	for _, name := range stateFields {
		if f := v.FieldByName(name); f.IsValid() && f.CanSet() {
			f.SetZero()
		}
	}
	return &o
}

// get returns an idle lane, or a new one.
func (ls *Lanes) get() (*lane, error) {
	ls.mu.Lock()
	if k := len(ls.idle) - 1; k >= 0 {
		l := ls.idle[k]
		ls.idle[k] = nil
		ls.idle = ls.idle[:k]
		ls.mu.Unlock()
		ls.spare()
		return l, nil
	}
	ls.mu.Unlock()
	ls.spare()
	return ls.newLane()
}

// newLane returns a new lane, not connected yet.
func (ls *Lanes) newLane() (*lane, error) {
	l := &lane{}
	l.ctx, l.cancel = context.WithCancel(context.Background())
	o := ownOptions(ls.opts)
	dial := o.Dialer
	o.Dialer = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := l.dial(ctx, dial, network, addr)
		if err != nil {
			return nil, err
		}
		cc := &cutConn{Conn: c}
		l.dialed.Store(cc)
		if sys, ok := c.(syscall.Conn); ok {
			return sysCutConn{cc, sys}, nil
		}
		return cc, nil
	}
	l.rdb = redis.NewClient(o)
	l.rdb.AddHook(l)
	l.conn = &Conn{Client: l.rdb, Server: &ls.server}
	if ls.setup != nil {
		if err := ls.setup(l.rdb); err != nil {
			l.close()
			return nil, fmt.Errorf("redisync: the setup of its own connections failed: %w", err)
		}
	}
	return l, nil
}

// put gives back a lane, or closes it when the lanes are closed.
func (ls *Lanes) put(l *lane) {
	ls.mu.Lock()
	if !ls.closed {
		ls.idle = append(ls.idle, l)
		ls.mu.Unlock()
		return
	}
	ls.mu.Unlock()
	l.close()
}

// Close closes the idle lanes, and each lane in use once its round trip
// returns, and waits for the lane being made in reserve. A
// round trip after Close runs on a lane closed after it.
func (ls *Lanes) Close() {
	ls.mu.Lock()
	idle := ls.idle
	ls.idle, ls.closed = nil, true
	ls.mu.Unlock()
	ls.stopAll()
	ls.spares.Wait()
	for _, l := range idle {
		l.close()
	}
}

// spare keeps a lane idle and connected (dialled, its handshake done) in
// reserve: when none is idle nor being made, it makes one in the
// background, within CleanupTimeout. So a round trip, or a heartbeat next
// to one, rarely pays for a dial and a handshake inside its own deadline,
// and one cut short, which costs its connection, does not starve the next
// ones (a caller whose deadlines are shorter than a handshake would
// never get through). A Client so keeps one connection more than it uses.
func (ls *Lanes) spare() {
	ls.mu.Lock()
	if ls.closed || ls.replacing > 0 || len(ls.idle) > 0 {
		ls.mu.Unlock()
		return
	}
	ls.replacing++
	ls.spares.Add(1)
	ls.mu.Unlock()
	go func() {
		defer ls.spares.Done()
		l, err := ls.newLane()
		if err == nil {
			ctx, cancel := context.WithTimeout(ls.stop, CleanupTimeout)
			stop := context.AfterFunc(ctx, l.cut) // a dial or a read under way
			err = l.rdb.Ping(ctx).Err()
			if !stop() && err == nil {
				err = ctx.Err() // cut as the PING returned: not kept
			}
			cancel()
			if err != nil {
				l.close()
			}
		}
		ls.mu.Lock()
		ls.replacing--
		ls.mu.Unlock()
		if err == nil {
			ls.put(l)
		}
	}()
}

// dial runs dial, a user's dialer, until ctx ends or the lane is cut short
// or closed: go-redis may dial with a context of its own, and a dialer may
// not heed its context (a TLS dial in older go-redis does not). A
// connection that arrives after it gave up is closed.
func (l *lane) dial(ctx context.Context, dial func(context.Context, string, string) (net.Conn, error), network, addr string) (net.Conn, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(l.ctx, cancel)()
	type dialled struct {
		c   net.Conn
		err error
	}
	ch := make(chan dialled, 1)
	go func() {
		c, err := dial(ctx, network, addr)
		ch <- dialled{c, err}
	}()
	select {
	case d := <-ch:
		return d.c, d.err
	case <-ctx.Done():
		go func() {
			if d := <-ch; d.err == nil && d.c != nil {
				_ = d.c.Close()
			}
		}()
		return nil, ctx.Err()
	}
}

// cut gives up the lane's dial under way and cuts its connection short.
func (l *lane) cut() {
	l.cancel()
	if c := l.dialed.Load(); c != nil {
		c.cut()
	}
}

// drop closes the lane's connection: its next command dials anew.
func (l *lane) drop() {
	if c := l.dialed.Load(); c != nil {
		_ = c.Close()
	}
}

// The lane is a go-redis hook of its own client: a reply that says the
// server no longer serves the lane's commands as a primary (a failover
// demoted it; it is loading its data) drops the connection, so that the
// next command, which Persist may send at once, dials the server that
// serves them now.
func (l *lane) DialHook(next redis.DialHook) redis.DialHook { return next }

func (l *lane) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if err != nil && moved(err) {
			l.drop()
		}
		return err
	}
}

func (l *lane) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// moved reports whether err is a reply of a server that no longer serves
// as the primary it was dialled as.
func moved(err error) bool {
	for _, prefix := range []string{"READONLY", "MASTERDOWN", "LOADING"} {
		if strings.HasPrefix(err.Error(), prefix) {
			return true
		}
	}
	return false
}

// dropped reports whether err says the connection was closed under a
// round trip: by the server, or on the way.
func dropped(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}

// readOnly reports whether err is the reply of a replica to a write.
func readOnly(err error) bool { return strings.HasPrefix(err.Error(), "READONLY") }

// use is one round trip on a lane.
type use struct {
	l      *lane
	cancel context.CancelFunc
	mu     sync.Mutex
	done   bool
	isCut  bool
	timer  *time.Timer
}

// cutAt cuts the round trip short at t, unless it is over by then.
func (u *use) cutAt(t time.Time) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if !u.done && u.timer == nil {
		u.timer = time.AfterFunc(time.Until(t), u.cut)
	}
}

// cut cuts the round trip short now, unless it is over.
func (u *use) cut() {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.done || u.isCut {
		return
	}
	u.isCut = true
	u.cancel()
	u.l.cancel() // a dial under way
	if c := u.l.dialed.Load(); c != nil {
		c.cut()
	}
}

// swap replaces the round trip's lane, closed, with a new one of ls, and
// returns it; nil when the round trip was cut short.
func (u *use) swap(ls *Lanes) (*lane, error) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.done || u.isCut {
		return nil, nil
	}
	l, err := ls.get()
	if err != nil {
		return nil, err
	}
	u.l.close()
	u.l = l
	return l, nil
}

// finish records that the round trip is over, so that nothing cuts it
// from now, and reports whether it was cut.
func (u *use) finish() bool {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.done = true
	if u.timer != nil {
		u.timer.Stop()
	}
	return u.isCut
}

// cutConn is a connection whose deadlines a caller's context can set in
// the past for good.
type cutConn struct {
	net.Conn
	isCut atomic.Bool
}

// past is a deadline that has passed.
var past = time.Unix(1, 0)

// sysCutConn is a cutConn of a connection that gives access to its file
// descriptor (TCP, not TLS), through which go-redis reads whether an idle
// connection was closed by the server.
type sysCutConn struct {
	*cutConn
	sys syscall.Conn
}

func (c sysCutConn) SyscallConn() (syscall.RawConn, error) { return c.sys.SyscallConn() }

func (c *cutConn) cut() {
	c.isCut.Store(true)
	_ = c.Conn.SetDeadline(past)
}

// set sets a deadline with set, or the past once the connection is cut
// short: looked at again after setting, so that a cut between the look
// and the setting is not undone.
func (c *cutConn) set(set func(time.Time) error, t time.Time) error {
	if c.isCut.Load() {
		t = past
	}
	err := set(t)
	if c.isCut.Load() && !t.Equal(past) {
		_ = set(past)
	}
	return err
}

func (c *cutConn) SetDeadline(t time.Time) error      { return c.set(c.Conn.SetDeadline, t) }
func (c *cutConn) SetReadDeadline(t time.Time) error  { return c.set(c.Conn.SetReadDeadline, t) }
func (c *cutConn) SetWriteDeadline(t time.Time) error { return c.set(c.Conn.SetWriteDeadline, t) }
