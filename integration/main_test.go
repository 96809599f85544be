// Package integration tests redisync against a real redis-server: expiry,
// scripts' atomicity under load, pub/sub and reconnects. See
// internal/redistest for how the server is found or started.
package integration

import (
	"testing"

	"github.com/redisync/redisync/internal/redistest"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(redistest.Main(m)) }
