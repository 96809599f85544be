package redisync

import (
	"context"
	"log/slog"
)

// logEvent writes e to log: at Warn what an operator must see (a hold
// lost, a renewal failing, the subscriber reconnecting, a waiter that
// died, events dropped), at Debug everything else. Calls (Lock, Unlock,
// ...) are never logged: nothing on the hot path writes a log.
func logEvent(log *slog.Logger, e Event) {
	ctx := context.Background()
	level, msg := slog.LevelDebug, ""
	switch e.Kind {
	case KindHoldLost:
		level, msg = slog.LevelWarn, "redisync: hold lost: its lease could not be renewed in time, or Redis no longer had it"
	case KindRenewalFailed:
		level, msg = slog.LevelWarn, "redisync: lease renewal failed; retrying until the leases run out"
	case KindReconnect:
		level, msg = slog.LevelWarn, "redisync: pub/sub connection failed; reconnecting (waiters poll meanwhile)"
	case KindDeadWaiter:
		level, msg = slog.LevelWarn, "redisync: lock found free with waiters queued and nobody to announce it: a hand-off to a waiter that had died ran out"
	case KindDropped:
		level, msg = slog.LevelWarn, "redisync: events dropped: the observer or the logger is too slow"
	case KindHoldTaken:
		msg = "redisync: hold taken"
	case KindHoldReleased:
		msg = "redisync: hold released"
	case KindRenewal:
		msg = "redisync: leases renewed"
	default:
		msg = "redisync: " + string(e.Kind)
	}
	if !log.Enabled(ctx, level) {
		return
	}
	attrs := make([]slog.Attr, 0, 8)
	if e.Name != "" {
		attrs = append(attrs, slog.String("primitive", string(e.Primitive)), slog.String("name", e.Name))
	}
	if e.Token != 0 {
		attrs = append(attrs, slog.Int64("token", e.Token))
	}
	if e.Permits != 0 {
		attrs = append(attrs, slog.Int64("permits", e.Permits))
	}
	if e.Handoff {
		attrs = append(attrs, slog.Bool("handoff", true))
	}
	if e.Held != 0 {
		attrs = append(attrs, slog.Duration("held", e.Held))
	}
	if e.Latency != 0 {
		attrs = append(attrs, slog.Duration("latency", e.Latency))
	}
	if e.Count != 0 {
		attrs = append(attrs, slog.Int("count", e.Count))
	}
	if e.Err != nil {
		attrs = append(attrs, slog.String("error", e.Err.Error()))
	}
	log.LogAttrs(ctx, level, msg, attrs...)
}

// WithLogger makes the Client log, through l, the events an operator must
// see, at Warn: a hold lost, lease renewals failing, the subscriber's
// pub/sub connection reconnecting, a hand-off to a waiter that had died,
// and events dropped because l (or the observer) could not keep up; and
// other background events (holds taken, released, renewed) at Debug. Calls
// are never logged, and nothing is written from a call's goroutine: the
// records are written by a goroutine of the Client, through the queue that
// feeds the Observer, so a slow handler never stalls the watchdog or a
// waiter (records it cannot take are dropped and counted). It only has an
// effect as an option of New (and of NewRedlock).
//
// The default, as with a nil l, is no logging.
func WithLogger(l *slog.Logger) Option {
	return option("WithLogger", atClient|atRedlock, func(cfg *config) { cfg.log = l })
}
