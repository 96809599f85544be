package redisync

import (
	"cmp"
	"context"
	"fmt"

	"github.com/redisync/redisync/internal/schema"
)

// ResizeSemaphore changes the size of the semaphore called name from
// from to to, if from is the size stored in Redis (or to is already; when
// none is stored, the semaphore is idle and to is stored). It fails with
// ErrSizeMismatch, changing nothing, when another size is stored. opts
// name the semaphore's keys (WithKeyPrefix) as for NewSemaphore.
//
// It never lets more permits out than the new size: holders keep theirs,
// so after a shrink more may be in use than to until they give them back,
// and nobody is granted one until the permits in use leave room under to.
// After a growth the waiters that now fit are granted at once. Semaphore
// values made with the old size go on with the new one (see
// Semaphore.Size).
func (c *Client) ResizeSemaphore(ctx context.Context, name string, from, to int64, opts ...Option) error {
	return observed(c.obs, ctx, CallInfo{Op: OpResize, Primitive: PrimitiveSemaphore, Name: name, Permits: to}, func(ctx context.Context) error {
		return c.resizeSemaphore(ctx, name, from, to, opts)
	}, nil)
}

// resizeSemaphore is ResizeSemaphore, unobserved.
func (c *Client) resizeSemaphore(ctx context.Context, name string, from, to int64, opts []Option) error {
	cfg := with(c.cfg, atInspect, opts)
	if err := cmp.Or(checkName(name), checkSize(to), cfg.err, checkSize(from), c.usable(), ctx.Err()); err != nil {
		return wrapOp("resize", name, err)
	}
	s := c.newSemaphore(name, to, cfg, PrimitiveSemaphore, schema.SemaphoreKeys(cfg.prefix, name))
	if err := c.ready(ctx, s.keys.GrantChannel(c.id)); err != nil {
		return s.wrap("resize", err)
	}
	res, err := semResizeArgs{from: from, to: to, publish: c.publish}.call(s.keys).run(ctx, c.rdb).Int64Slice()
	switch {
	case err != nil:
		return s.wrap("resize", redisError(err))
	case res[0] == 0:
		return s.wrap("resize", fmt.Errorf("%w: resizing from %d, stored size %d (resize from the stored size)", ErrSizeMismatch, from, res[1]))
	}
	return nil
}
