package redisync

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/redis/go-redis/v9"
	"github.com/redisync/redisync/internal/roundtrip"
)

// On a server that has functions (Redis 7 and later, Valkey), a Client's
// own connections (lanes) run the scripts as the functions of one library,
// loaded once per server (FUNCTION LOAD) and called with FCALL. A script
// sent with EVALSHA runs the definitions of its helpers again at every
// call, which costs a lock's acquisition about a fifth of its script time;
// a function finds them defined. The library's name carries a digest of its
// code, so that the processes of two versions of redisync on one server
// (during a rolling deploy) each call their own. The scripts' bodies are
// the same either way: a server without functions, a Client of a Redis
// Cluster or of several servers, and an ACL user that may not call or load
// functions run them as scripts.

// functionLibrary is every script of allScripts as a function of one Lua
// library.
type functionLibrary struct {
	name string                // "redisync_" and the version
	src  string                // the code that FUNCTION LOAD loads
	fn   map[*luaScript]string // the name of each script's function
}

// readOnly are the scripts that never write: their functions are flagged
// no-writes, so that they run where a write would be refused (a server
// out of memory, a replica), as the scripts did.
var readOnly = map[string]bool{"ttl": true, "leader": true}

// library returns the function library of the scripts.
var library = sync.OnceValue(func() *functionLibrary {
	scripts := slices.SortedFunc(slices.Values(allScripts), func(a, b *luaScript) int {
		return cmp.Compare(a.name, b.name)
	})
	helpers := luaLib + luaLockLib + luaSemLib
	digest := sha256.New()
	digest.Write([]byte(helpers))
	for _, s := range scripts {
		fmt.Fprintf(digest, "\x00%s\x00%v\x00%s", s.name, readOnly[s.name], s.body)
	}
	lib := &functionLibrary{name: "redisync_" + hex.EncodeToString(digest.Sum(nil))[:16], fn: map[*luaScript]string{}}
	var src strings.Builder
	fmt.Fprintf(&src, "#!lua name=%s\n%s", lib.name, helpers)
	for _, s := range scripts {
		lib.fn[s] = lib.name + "_" + s.name
		// The body reads KEYS and ARGV as a script does, here the
		// function's arguments.
		flags := ""
		if readOnly[s.name] {
			flags = ", flags = {'no-writes'}"
		}
		fmt.Fprintf(&src, "\nredis.register_function{function_name = '%s'%s, callback = function(KEYS, ARGV)\nbegin_call()\n%s\nend}\n",
			lib.fn[s], flags, s.body)
	}
	lib.src = src.String()
	return lib
})

// functionCall is what came of an FCALL of a script's function.
type functionCall int

const (
	functionCalled     functionCall = iota // it ran, or failed: its reply is the call's
	functionsRefused                       // it did not run: the server has no functions, or c's user may not call them
	libraryNotLoadable                     // it did not run: the library is missing, and c's user may not load it
)

// callFunction sends s as an FCALL of its function on c, loading the
// library first where the server lacks it (a server new to this version,
// restarted, or whose functions were flushed).
func callFunction(ctx context.Context, c *roundtrip.Conn, s *luaScript, keys []string, args []any) (*redis.Cmd, functionCall) {
	lib := library()
	argv := make([]any, 0, 3+len(keys)+len(args))
	argv = append(argv, "fcall", lib.fn[s], len(keys))
	for _, k := range keys {
		argv = append(argv, k)
	}
	argv = append(argv, args...)
	r := c.Do(ctx, argv...)
	if err := r.Err(); err != nil && strings.HasPrefix(strings.TrimPrefix(err.Error(), "ERR "), "Function not found") {
		err := c.Do(ctx, "function", "load", lib.src).Err()
		switch {
		case err == nil || lib.loaded(err): // or loaded by another call meanwhile
			r = c.Do(ctx, argv...)
		case refusedCommand(err, "function") || strings.Contains(err.Error(), "already exists"):
			// Refused, or another library has one of its functions'
			// names: the scripts, which are named by their digests,
			// run what this version sent.
			return nil, libraryNotLoadable
		default:
			r = redis.NewCmd(ctx, argv...)
			r.SetErr(err)
			return r, functionCalled
		}
	}
	if err := r.Err(); err != nil && refusedCommand(err, "fcall") {
		return nil, functionsRefused
	}
	if c.Server.Functions.Load() != 1 {
		c.Server.Functions.Store(1)
	}
	return r, functionCalled
}

// loaded reports whether err, from FUNCTION LOAD, says that the library
// is there already (loaded by another call, or another process).
func (lib *functionLibrary) loaded(err error) bool {
	return strings.Contains(err.Error(), "Library '"+lib.name+"' already exists")
}

// notLoadedError is the error of a script call by an ACL user that may
// call functions but may neither load the library nor send scripts.
func notLoadedError(err error) error {
	return fmt.Errorf("redisync: the function library %s is not loaded on the server, and the ACL user may "+
		"neither load it (FUNCTION LOAD) nor send scripts: load it once with Client.LoadFunctions, "+
		"as a user that may: %w", library().name, err)
}

// LoadFunctions loads the scripts' function library on the Client's
// server (on every primary of a Redis Cluster), unless it is there
// already. A Client loads it itself at its first call when its ACL user
// may (+function|load), and otherwise sends scripts (+evalsha +eval):
// LoadFunctions is for an ACL user that may do neither, which then needs
// only +fcall besides the commands the scripts call (docs/acl.md). Run it
// as a user that may load functions, after each upgrade of redisync, and
// after the server lost its functions (a restart without persistence).
// A server without functions fails it with ErrUnsupportedServer.
func (c *Client) LoadFunctions(ctx context.Context) error {
	if err := cmp.Or(ctx.Err(), c.usable()); err != nil {
		return wrapOp("loadfunctions", "", err)
	}
	load := func(ctx context.Context, rdb redis.UniversalClient) error {
		err := rdb.Do(ctx, "function", "load", library().src).Err()
		if err != nil && library().loaded(err) {
			return nil
		}
		return err
	}
	_, _, err := c.rt.Run(ctx, func(ctx context.Context, rdb redis.UniversalClient) ([]int64, error) {
		if c.cluster == nil {
			return nil, load(ctx, rdb)
		}
		return nil, c.cluster.ForEachMaster(ctx, func(ctx context.Context, node *redis.Client) error { return load(ctx, node) })
	}, nil)
	switch {
	case isUnknownCommand(err): // its text repeats the library's code
		return wrapOp("loadfunctions", "", fmt.Errorf("%w: it has no functions (FUNCTION LOAD: Redis 7.0 or later, or Valkey)", ErrUnsupportedServer))
	case err != nil:
		return wrapOp("loadfunctions", "", redisError(err))
	}
	return nil
}

// refusedCommand reports whether err says that the server refused the
// command cmd itself, before running it: it does not know it, or the ACL
// user may not run it (an error from inside a function, or about the keys,
// is not that: it may come after the function wrote).
func refusedCommand(err error, cmd string) bool {
	msg := strings.ToLower(err.Error())
	if strings.HasPrefix(msg, "err unknown command '"+cmd+"'") || strings.HasPrefix(msg, "err unknown command `"+cmd+"`") {
		return true
	}
	return strings.HasPrefix(msg, "noperm") && (strings.Contains(msg, "'"+cmd+"'") || strings.Contains(msg, "'"+cmd+"|"))
}
