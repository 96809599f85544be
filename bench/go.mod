module github.com/redisync/redisync/bench

go 1.25.0

replace github.com/redisync/redisync => ../

require (
	github.com/bsm/redislock v0.9.4
	github.com/go-redsync/redsync/v4 v4.17.0
	github.com/redis/go-redis/v9 v9.22.0
	github.com/redis/rueidis v1.0.79
	github.com/redisync/redisync v0.0.0-00010101000000-000000000000
	go.uber.org/goleak v1.3.0
	golang.org/x/sync v0.22.0
)

require (
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	github.com/google/uuid v1.2.0 // indirect
	go.uber.org/atomic v1.11.0 // indirect
	golang.org/x/sys v0.47.0 // indirect
)
