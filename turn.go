package redisync

import "context"

// turn lets one call of a value at a time go ahead (talk to Redis, take a
// first level, run a campaign): a channel with one slot, held by the call
// whose turn it is.
type turn chan struct{}

// newTurn returns a free turn.
func newTurn() turn { return make(turn, 1) }

// take waits for the turn, the end of ctx, or closed (nil: never), which
// fails it with ErrClosed.
func (t turn) take(ctx context.Context, closed <-chan struct{}) error {
	select {
	case t <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-closed:
		return ErrClosed
	}
}

// try takes the turn if it is free, without waiting.
func (t turn) try() bool {
	select {
	case t <- struct{}{}:
		return true
	default:
		return false
	}
}

// give gives the turn back.
func (t turn) give() { <-t }
