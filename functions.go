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
// call, which costs a lock's acquisition about a third of its script time;
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

// library returns the function library of the scripts.
var library = sync.OnceValue(func() *functionLibrary {
	scripts := slices.SortedFunc(slices.Values(allScripts), func(a, b *luaScript) int {
		return cmp.Compare(a.name, b.name)
	})
	helpers := luaLib + luaLockLib + luaSemLib
	digest := sha256.New()
	digest.Write([]byte(helpers))
	for _, s := range scripts {
		fmt.Fprintf(digest, "\x00%s\x00%s", s.name, s.body)
	}
	lib := &functionLibrary{name: "redisync_" + hex.EncodeToString(digest.Sum(nil))[:16], fn: map[*luaScript]string{}}
	var src strings.Builder
	fmt.Fprintf(&src, "#!lua name=%s\n%s", lib.name, helpers)
	for _, s := range scripts {
		lib.fn[s] = lib.name + "_" + s.name
		// The body reads KEYS and ARGV as a script does, here the
		// function's arguments.
		fmt.Fprintf(&src, "\nredis.register_function('%s', function(KEYS, ARGV)\nbegin_call()\n%s\nend)\n", lib.fn[s], s.body)
	}
	lib.src = src.String()
	return lib
})

// callFunction sends s as an FCALL of its function on c, loading the
// library first where the server lacks it (a server new to this version,
// restarted, or whose functions were flushed). It reports false, and has
// the Client's lanes send scripts from then on, when the server has no
// functions or c's ACL user may not call or load them: the FCALL did not
// run.
func callFunction(ctx context.Context, c *roundtrip.Conn, s *luaScript, keys []string, args []any) (*redis.Cmd, bool) {
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
		case err == nil || strings.Contains(err.Error(), "already exists"): // or loaded by another call meanwhile
			r = c.Do(ctx, argv...)
		case refusedCommand(err, "function"):
			c.Server.Functions.Store(-1)
			return nil, false
		default:
			r = redis.NewCmd(ctx, argv...)
			r.SetErr(err)
			return r, true
		}
	}
	if err := r.Err(); err != nil && refusedCommand(err, "fcall") {
		c.Server.Functions.Store(-1)
		return nil, false
	}
	c.Server.Functions.CompareAndSwap(0, 1)
	return r, true
}

// refusedCommand reports whether err says that the server refused the
// command cmd itself, before running it: it does not know it, or the ACL
// user may not run it (an error from inside a function, or about the keys,
// is not that: it may come after the function wrote).
func refusedCommand(err error, cmd string) bool {
	msg := strings.ToLower(err.Error())
	if strings.HasPrefix(msg, "err unknown command") {
		return true
	}
	return strings.HasPrefix(msg, "noperm") && (strings.Contains(msg, "'"+cmd+"'") || strings.Contains(msg, "'"+cmd+"|"))
}
