// Package redisyncotel turns what redisync's Clients do into OpenTelemetry
// metrics and spans, as go-redis's redisotel does for Redis commands. It
// is a module of its own, so that a program that uses redisync without
// OpenTelemetry does not download it.
//
//	obs, err := redisyncotel.New() // the global MeterProvider and TracerProvider
//	if err != nil {
//		return err
//	}
//	client, err := redisync.New(rdb, redisync.WithObserver(obs))
//	if err != nil {
//		return err
//	}
//
// ExampleNew shows it whole, with providers of its own.
//
// Metrics (units as the OpenTelemetry semantic conventions write them):
//
//	redisync.lock.wait.duration      histogram, s       Lock, TryLock, Acquire, TryAcquire, Accept, RLock, TryRLock: how long the call took, by outcome
//	redisync.lock.acquisitions       counter            the same calls, by outcome (acquired, busy, timeout, canceled, lost, error)
//	redisync.lock.waiters            updowncounter      Lock, RLock and Acquire calls under way
//	redisync.lock.hold.duration      histogram, s       how long holds lasted, by outcome (released, lost)
//	redisync.lock.holds.lost         counter            holds lost: the lease ran out unrenewed, or Redis no longer had it
//	redisync.lock.renewal.duration   histogram, s       the watchdog's renewal calls (each renews a batch of holds and heartbeats), by outcome (ok, error)
//	redisync.lock.renewal.failures   counter            renewal calls that failed
//	redisync.subscriber.reconnects   counter            pub/sub connections that failed and were re-established
//	redisync.lock.dead_waiters       counter            waiters found with nobody to wake them (a hand-off to a waiter that died ran out)
//	redisync.events.dropped          counter            events the observer could not take in time
//
// Their attributes are redisync.primitive (mutex, semaphore, redmutex,
// rwmutex, multimutex, election),
// redisync.operation and redisync.outcome, all of few values. The lock's
// name (redisync.lock.name) is added only with WithNameAttribute: names
// are often per entity (a user, an order), and every distinct name makes
// a time series of its own in every instrument, which a metrics backend
// pays for in memory and money.
//
// Spans: one per Lock, TryLock, Unlock, Acquire, TryAcquire, Release,
// Handoff, Accept, RLock, TryRLock and RUnlock, named "redisync.<operation>", a child of the span in
// the caller's context and the parent of the Redis commands the call
// sends (if go-redis is instrumented too). They carry redisync.primitive,
// redisync.lock.name (a span is one call, so the name costs nothing
// there), redisync.outcome, redisync.permits for a semaphore,
// redisync.lock.token (the fencing token of a hold taken) and
// redisync.lock.wait_time (seconds; for Lock and Acquire, the wait). A
// call that fails sets the span's status to Error.
package redisyncotel

import (
	"context"
	"fmt"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/redisync/redisync"
)

// scope is the instrumentation scope of the meter and the tracer.
const scope = "github.com/redisync/redisync/redisyncotel"

// Attribute keys.
const (
	AttrPrimitive = attribute.Key("redisync.primitive")
	AttrOperation = attribute.Key("redisync.operation")
	AttrOutcome   = attribute.Key("redisync.outcome")
	AttrName      = attribute.Key("redisync.lock.name")
	AttrToken     = attribute.Key("redisync.lock.token")
	AttrWaitTime  = attribute.Key("redisync.lock.wait_time")
	AttrPermits   = attribute.Key("redisync.permits")
)

// Option configures New. As redisync's own options, it is an interface
// that only this package implements.
type Option interface{ apply(*config) }

// option is an Option: a change to the config.
type option func(*config)

func (o option) apply(c *config) { o(c) }

type config struct {
	mp   metric.MeterProvider
	tp   trace.TracerProvider
	name bool
}

// WithMeterProvider sets the MeterProvider of the metrics. The default is
// otel.GetMeterProvider().
func WithMeterProvider(mp metric.MeterProvider) Option {
	return option(func(c *config) { c.mp = mp })
}

// WithTracerProvider sets the TracerProvider of the spans. The default is
// otel.GetTracerProvider().
func WithTracerProvider(tp trace.TracerProvider) Option {
	return option(func(c *config) { c.tp = tp })
}

// WithNameAttribute adds the lock's or semaphore's name to the metrics'
// attributes (spans always carry it). Only use it when the names are few
// and fixed ("deploy", "nightly-report"), not one per entity: each name
// is a time series of its own in every instrument.
func WithNameAttribute() Option {
	return option(func(c *config) { c.name = true })
}

// Observer is a redisync.Observer that records metrics and spans. It is
// safe for concurrent use; one Observer may serve many Clients.
type Observer struct {
	tracer trace.Tracer
	name   bool

	wait       metric.Float64Histogram
	acquired   metric.Int64Counter
	waiters    metric.Int64UpDownCounter
	held       metric.Float64Histogram
	lost       metric.Int64Counter
	renewal    metric.Float64Histogram
	renewFails metric.Int64Counter
	reconnects metric.Int64Counter
	dead       metric.Int64Counter
	dropped    metric.Int64Counter
}

var _ redisync.Observer = (*Observer)(nil)

// waitBuckets are the bounds, in seconds, of the wait and hold histograms:
// from a hand-off on a LAN (~0.5 ms) to minutes.
var waitBuckets = []float64{0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300}

// New returns an Observer that records with the providers given by opts.
// It fails with an error wrapping redisync.ErrInvalidOption for a nil
// provider, and when an instrument cannot be created.
func New(opts ...Option) (*Observer, error) {
	cfg := config{mp: otel.GetMeterProvider(), tp: otel.GetTracerProvider()}
	for _, o := range opts {
		o.apply(&cfg)
	}
	if cfg.mp == nil || cfg.tp == nil {
		return nil, fmt.Errorf("redisyncotel: %w: a nil MeterProvider or TracerProvider", redisync.ErrInvalidOption)
	}
	meter := cfg.mp.Meter(scope)
	o := &Observer{tracer: cfg.tp.Tracer(scope), name: cfg.name}
	b := builder{meter: meter}
	o.wait = b.histogram("redisync.lock.wait.duration", "How long Lock, TryLock, Acquire, TryAcquire and Accept took: the wait for a lock or permits.", "s", waitBuckets)
	o.acquired = b.counter("redisync.lock.acquisitions", "Calls that take a lock or permits, by outcome.", "{call}")
	o.waiters = b.upDown("redisync.lock.waiters", "Lock and Acquire calls under way.", "{call}")
	o.held = b.histogram("redisync.lock.hold.duration", "How long holds lasted, by outcome: released or lost.", "s", waitBuckets)
	o.lost = b.counter("redisync.lock.holds.lost", "Holds lost: their lease ran out unrenewed, or Redis no longer had them.", "{hold}")
	o.renewal = b.histogram("redisync.lock.renewal.duration", "The watchdog's renewal calls, each of a batch of holds and fair waiters' heartbeats.", "s", waitBuckets)
	o.renewFails = b.counter("redisync.lock.renewal.failures", "Renewal calls that failed.", "{call}")
	o.reconnects = b.counter("redisync.subscriber.reconnects", "Pub/sub connections that failed and were re-established.", "{reconnect}")
	o.dead = b.counter("redisync.lock.dead_waiters", "Waiters found with nobody to wake them: a hand-off to a waiter that had died ran out.", "{event}")
	o.dropped = b.counter("redisync.events.dropped", "Events dropped because the observer did not take them in time.", "{event}")
	if b.err != nil {
		return nil, b.err
	}
	return o, nil
}

// builder creates instruments, keeping the first error.
type builder struct {
	meter metric.Meter
	err   error
}

func (b *builder) histogram(name, desc, unit string, bounds []float64) metric.Float64Histogram {
	h, err := b.meter.Float64Histogram(name, metric.WithDescription(desc), metric.WithUnit(unit), metric.WithExplicitBucketBoundaries(bounds...))
	b.keep(err)
	return h
}

func (b *builder) counter(name, desc, unit string) metric.Int64Counter {
	c, err := b.meter.Int64Counter(name, metric.WithDescription(desc), metric.WithUnit(unit))
	b.keep(err)
	return c
}

func (b *builder) upDown(name, desc, unit string) metric.Int64UpDownCounter {
	c, err := b.meter.Int64UpDownCounter(name, metric.WithDescription(desc), metric.WithUnit(unit))
	b.keep(err)
	return c
}

func (b *builder) keep(err error) {
	if b.err == nil {
		b.err = err
	}
}

// waits reports whether op waits for a lock or permits.
func waits(op redisync.Op) bool {
	return op == redisync.OpLock || op == redisync.OpAcquire || op == redisync.OpRLock
}

// takes reports whether op takes a lock or permits.
func takes(op redisync.Op) bool {
	switch op {
	case redisync.OpLock, redisync.OpTryLock, redisync.OpAcquire, redisync.OpTryAcquire, redisync.OpAccept,
		redisync.OpRLock, redisync.OpTryRLock:
		return true
	}
	return false
}

// CallStart starts the call's span, a child of ctx's, and counts a waiter.
func (o *Observer) CallStart(ctx context.Context, c redisync.CallInfo) context.Context {
	attrs := []attribute.KeyValue{AttrPrimitive.String(string(c.Primitive)), AttrName.String(c.Name)}
	if c.Permits != 0 {
		attrs = append(attrs, AttrPermits.Int64(c.Permits))
	}
	ctx, _ = o.tracer.Start(ctx, "redisync."+string(c.Op), trace.WithTimestamp(c.Start),
		trace.WithSpanKind(trace.SpanKindInternal), trace.WithAttributes(attrs...))
	if waits(c.Op) {
		o.waiters.Add(ctx, 1, metric.WithAttributes(o.base(c.Primitive, c.Name)...))
	}
	return ctx
}

// CallEnd records the call's metrics and ends its span.
func (o *Observer) CallEnd(ctx context.Context, c redisync.CallInfo) {
	base := o.base(c.Primitive, c.Name)
	if waits(c.Op) {
		o.waiters.Add(ctx, -1, metric.WithAttributes(base...))
	}
	if takes(c.Op) {
		attrs := metric.WithAttributes(append(base, AttrOperation.String(string(c.Op)), AttrOutcome.String(string(c.Outcome)))...)
		o.wait.Record(ctx, c.Duration.Seconds(), attrs)
		o.acquired.Add(ctx, 1, attrs)
	}
	span := trace.SpanFromContext(ctx)
	span.SetAttributes(AttrOutcome.String(string(c.Outcome)))
	if c.Token != 0 {
		span.SetAttributes(AttrToken.Int64(c.Token))
	}
	if takes(c.Op) {
		span.SetAttributes(AttrWaitTime.Float64(c.Duration.Seconds()))
	}
	if c.Err != nil {
		span.RecordError(c.Err)
		span.SetStatus(codes.Error, string(c.Outcome))
	}
	span.End()
}

// Event records a background event.
func (o *Observer) Event(e redisync.Event) {
	ctx := context.Background()
	switch e.Kind {
	case redisync.EventHoldReleased:
		o.held.Record(ctx, e.Held.Seconds(), metric.WithAttributes(append(o.base(e.Primitive, e.Name), AttrOutcome.String(string(redisync.OutcomeReleased)))...))
	case redisync.EventHoldLost:
		base := o.base(e.Primitive, e.Name)
		o.held.Record(ctx, e.Held.Seconds(), metric.WithAttributes(append(base, AttrOutcome.String(string(redisync.OutcomeLost)))...))
		o.lost.Add(ctx, 1, metric.WithAttributes(base...))
	case redisync.EventRenewal:
		o.renewal.Record(ctx, e.Latency.Seconds(), metric.WithAttributes(AttrOutcome.String("ok")))
	case redisync.EventRenewalFailed:
		o.renewal.Record(ctx, e.Latency.Seconds(), metric.WithAttributes(AttrOutcome.String("error")))
		o.renewFails.Add(ctx, 1)
	case redisync.EventReconnect:
		o.reconnects.Add(ctx, 1)
	case redisync.EventDeadWaiter:
		o.dead.Add(ctx, 1, metric.WithAttributes(o.base(e.Primitive, e.Name)...))
	case redisync.EventDropped:
		o.dropped.Add(ctx, int64(e.Count))
	}
}

// base returns the attributes every metric of a primitive has.
func (o *Observer) base(prim redisync.Primitive, name string) []attribute.KeyValue {
	attrs := make([]attribute.KeyValue, 1, 4)
	attrs[0] = AttrPrimitive.String(string(prim))
	if o.name {
		attrs = append(attrs, AttrName.String(name))
	}
	return attrs
}
