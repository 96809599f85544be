package redisync

import (
	_ "embed"

	"github.com/redis/go-redis/v9"
)

// The Lua scripts, each prefixed with the shared helpers of lib.lua. Run
// sends EVALSHA and falls back to EVAL when the server does not know the
// script yet.
var (
	//go:embed scripts/lib.lua
	luaLib string
	//go:embed scripts/acquire.lua
	luaAcquire string
	//go:embed scripts/release.lua
	luaRelease string
	//go:embed scripts/renew.lua
	luaRenew string
	//go:embed scripts/extend.lua
	luaExtend string
	//go:embed scripts/ttl.lua
	luaTTL string
	//go:embed scripts/handoff.lua
	luaHandoff string
	//go:embed scripts/wake.lua
	luaWake string
	//go:embed scripts/multi_acquire.lua
	luaMultiAcquire string
	//go:embed scripts/multi_release.lua
	luaMultiRelease string
	//go:embed scripts/proclaim.lua
	luaProclaim string
	//go:embed scripts/leader.lua
	luaLeader string
	//go:embed scripts/sem_lib.lua
	luaSemLib string
	//go:embed scripts/sem_acquire.lua
	luaSemAcquire string
	//go:embed scripts/sem_release.lua
	luaSemRelease string
	//go:embed scripts/sem_resize.lua
	luaSemResize string

	acquireScript = redis.NewScript(luaLib + luaAcquire)
	releaseScript = redis.NewScript(luaLib + luaRelease)
	renewScript   = redis.NewScript(luaLib + luaRenew)
	extendScript  = redis.NewScript(luaLib + luaExtend)
	ttlScript     = redis.NewScript(luaLib + luaTTL)
	handoffScript = redis.NewScript(luaLib + luaHandoff)
	wakeScript    = redis.NewScript(luaLib + luaWake)

	multiAcquireScript = redis.NewScript(luaLib + luaMultiAcquire)
	multiReleaseScript = redis.NewScript(luaLib + luaMultiRelease)
	proclaimScript     = redis.NewScript(luaLib + luaProclaim)
	leaderScript       = redis.NewScript(luaLib + luaLeader)

	semAcquireScript = redis.NewScript(luaLib + luaSemLib + luaSemAcquire)
	semReleaseScript = redis.NewScript(luaLib + luaSemLib + luaSemRelease)
	semResizeScript  = redis.NewScript(luaLib + luaSemLib + luaSemResize)
)
