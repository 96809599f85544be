module github.com/redisync/redisync

go 1.25.0

require (
	github.com/alicebob/miniredis/v2 v2.17.0
	github.com/google/uuid v1.2.0
	github.com/redis/go-redis/v9 v9.0.0
	go.uber.org/goleak v0.10.0
)

require (
	github.com/alicebob/gopher-json v0.0.0-20200520072559-a9ecdc9d1d3a // indirect
	github.com/cespare/xxhash/v2 v2.2.0 // indirect
	github.com/dgryski/go-rendezvous v0.0.0-20200823014737-9f7001d12a5f // indirect
	github.com/yuin/gopher-lua v0.0.0-20200816102855-ee81675732da // indirect
)
