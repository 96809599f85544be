// Messages for the failures of an acquire that say what to do about them.

package main

import (
	"context"
	"errors"
	"fmt"

	"github.com/redis/go-redis/v9"
	"github.com/redisync/redisync"
)

// inspector reads one primitive's state through a redisync Client, to
// learn more about a failed call: Client.InspectLock, InspectSemaphore or
// InspectElection.
type inspector func(ctx context.Context, c *redisync.Client) error

// explainWrongType returns, for err wrapping redisync.ErrWrongType, the
// message of the error of inspect when it finds a key of the wrong type
// too: it names the key (a script's error from Redis says only that some
// key holds the wrong kind of value). It returns "" otherwise.
func explainWrongType(ctx context.Context, rdb redis.UniversalClient, prefix, name string, err error, inspect inspector) string {
	if !errors.Is(err, redisync.ErrWrongType) {
		return ""
	}
	c, cerr := redisync.New(rdb, redisync.WithKeyPrefix(prefix))
	if cerr != nil {
		return ""
	}
	defer func() { _ = c.Close() }()
	if ierr := inspect(ctx, c); errors.Is(ierr, redisync.ErrWrongType) {
		return libMessage(ierr, name)
	}
	return ""
}

// storedSize reads the size stored for the semaphore name: 0 when none
// is, or it cannot be read.
func storedSize(ctx context.Context, rdb redis.UniversalClient, prefix, name string) int64 {
	c, err := redisync.New(rdb, redisync.WithKeyPrefix(prefix))
	if err != nil {
		return 0
	}
	defer func() { _ = c.Close() }()
	st, err := c.InspectSemaphore(ctx, name)
	if err != nil {
		return 0
	}
	return st.Size
}

// explainSize returns, for err wrapping redisync.ErrInvalidPermits when
// the size stored in Redis is not limit (more permits were asked for than
// it), a message that gives the stored size and the flags that use it or
// change it; "" otherwise.
func explainSize(ctx context.Context, rdb redis.UniversalClient, prefix, name string, limit int64, err error) string {
	if !errors.Is(err, redisync.ErrInvalidPermits) {
		return ""
	}
	stored := storedSize(ctx, rdb, prefix, name)
	if stored == 0 || stored == limit {
		return ""
	}
	return fmt.Sprintf("stored size %d, not --limit %d (the stored size rules): "+
		"ask for at most --permits %d, or change the size with --limit %d --resize %d", stored, limit, stored, stored, limit)
}
