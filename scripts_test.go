package redisync

import (
	"context"
	"testing"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/redisync/redisync/internal/redistest"
)

// keepAliveScript runs lib.lua's keep_alive(KEYS[1], ARGV[1]), or
// keep_longer when ARGV[3] is "longer", and replies the key's PTTL
// afterwards. With ARGV[2] "6" it runs as on a Redis before 7, whose
// PEXPIRE has no GT option and fails when given one.
var keepAliveScript = redis.NewScript(`
if ARGV[2] == '6' then
  local pcall = redis.pcall
  redis.pcall = function(cmd, key, ms, opt)
    if opt then
      return {err = "ERR wrong number of arguments for 'pexpire' command"}
    end
    return pcall(cmd, key, ms)
  end
end
` + luaLib + `
if ARGV[3] == 'longer' then
  keep_longer(KEYS[1], tonumber(ARGV[1]))
else
  keep_alive(KEYS[1], tonumber(ARGV[1]))
end
return redis.call('PTTL', KEYS[1])`)

// keep_alive extends a TTL to at least its argument and never shortens
// one, on a Redis 7 (PEXPIRE GT) and on an older Redis: a key created
// without a TTL, which GT leaves as it is, gets one too.
func TestKeepAliveNeverShortens(t *testing.T) {
	// miniredis lets a script replace redis.pcall, which stands in for a
	// Redis 6 here; Redis 7 does not.
	mini := redis.NewClient(&redis.Options{Addr: miniredis.RunT(t).Addr()})
	t.Cleanup(func() { mini.Close() })
	rdb := redistest.Client(t)
	for _, tc := range []struct {
		name    string
		rdb     redis.Cmdable
		version string
		fn      string
	}{
		{"redis", rdb, "7", "alive"},
		{"miniredis", mini, "7", "alive"},
		{"without PEXPIRE GT", mini, "6", "alive"},
		{"keep_longer", rdb, "7", "longer"},
		{"keep_longer on miniredis", mini, "7", "longer"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			key := redistest.Name(t)
			keep := func(ms int64) int64 {
				t.Helper()
				pttl, err := keepAliveScript.Run(ctx, tc.rdb, []string{key}, ms, tc.version, tc.fn).Int64()
				if err != nil {
					t.Fatal(err)
				}
				return pttl
			}
			if got := keep(5000); got != -2 {
				t.Errorf("missing key: PTTL %d after keep_alive, want -2 (not created)", got)
			}
			tc.rdb.Set(ctx, key, "v", 0)
			if got := keep(5000); got <= 4000 || got > 5000 {
				t.Errorf("key without a TTL: PTTL %d after keep_alive(5000), want about 5000", got)
			}
			if got := keep(60000); got <= 59000 || got > 60000 {
				t.Errorf("shorter TTL: PTTL %d after keep_alive(60000), want about 60000", got)
			}
			if got := keep(1000); got <= 59000 {
				t.Errorf("longer TTL: PTTL %d after keep_alive(1000), want it kept (about 60000)", got)
			}
		})
	}
}
