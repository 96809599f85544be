package redisyncotel_test

import (
	"context"
	"log"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/redisync/redisync"
	"github.com/redisync/redisync/redisyncotel"
)

// Wire a Client to OpenTelemetry: every Lock, Acquire and Unlock becomes
// a span under the caller's, and the metrics go to whatever reader or
// exporter the MeterProvider has (see docs/operations.md for Prometheus
// and OTLP).
func ExampleNew() {
	mr := miniredis.NewMiniRedis() // a real program has a Redis of its own
	if err := mr.Start(); err != nil {
		log.Fatal(err)
	}
	defer mr.Close()
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer rdb.Close()

	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
	defer mp.Shutdown(context.Background())
	tp := sdktrace.NewTracerProvider()
	defer tp.Shutdown(context.Background())

	obs, err := redisyncotel.New(redisyncotel.WithMeterProvider(mp), redisyncotel.WithTracerProvider(tp))
	if err != nil {
		log.Fatal(err)
	}
	client, err := redisync.New(rdb, redisync.WithObserver(obs))
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()

	ctx, span := tp.Tracer("app").Start(context.Background(), "nightly-report")
	defer span.End()
	m, err := client.NewMutex("nightly-report")
	if err != nil {
		log.Fatal(err)
	}
	if err := m.Lock(ctx); err != nil { // a child span of "nightly-report"
		log.Fatal(err)
	}
	defer m.Unlock(ctx)
	// Output:
}
