// Command example wires redisync to an OpenTelemetry exporter, as
// docs/operations.md describes, and runs a few workers that contend for a
// lock so that there is something to see:
//
//	go run ./redisyncotel/example -exporter prometheus   # metrics at http://localhost:9464/metrics
//	go run ./redisyncotel/example -exporter otlp         # metrics and traces to an OTLP/HTTP collector
//
// The OTLP exporters read the standard environment variables
// (OTEL_EXPORTER_OTLP_ENDPOINT, default http://localhost:4318, and
// OTEL_EXPORTER_OTLP_HEADERS). It is a module of its own so that the
// exporters' dependencies stay out of redisync's and redisyncotel's.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"net/http"
	"os"
	"os/signal"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/exporters/otlp/otlpmetric/otlpmetrichttp"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/redisync/redisync"
	"github.com/redisync/redisync/redisyncotel"
)

func main() {
	exporter := flag.String("exporter", "prometheus", "prometheus or otlp")
	addr := flag.String("redis", "localhost:6379", "Redis address")
	listen := flag.String("listen", "localhost:9464", "where Prometheus scrapes /metrics (-exporter prometheus; \":9464\" for every interface)")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, *exporter, *addr, *listen); err != nil {
		log.Fatal(err)
	}
}

func run(ctx context.Context, exporter, addr, listen string) error {
	var opts []redisyncotel.Option
	switch exporter {
	case "prometheus":
		mp, err := prometheusMeters(listen)
		if err != nil {
			return err
		}
		defer mp.Shutdown(context.Background())
		opts = append(opts, redisyncotel.WithMeterProvider(mp))
	case "otlp":
		mp, tp, err := otlpProviders(ctx)
		if err != nil {
			return err
		}
		defer mp.Shutdown(context.Background()) // flushes what is left
		defer tp.Shutdown(context.Background())
		opts = append(opts, redisyncotel.WithMeterProvider(mp), redisyncotel.WithTracerProvider(tp))
	default:
		return fmt.Errorf("-exporter %q: want prometheus or otlp", exporter)
	}

	obs, err := redisyncotel.New(opts...)
	if err != nil {
		return err
	}
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	defer rdb.Close()
	client, err := redisync.New(rdb, redisync.WithObserver(obs))
	if err != nil {
		return err
	}
	defer client.Close()
	return work(ctx, client)
}

// prometheusMeters returns a MeterProvider whose metrics Prometheus
// scrapes at listen/metrics.
func prometheusMeters(listen string) (*sdkmetric.MeterProvider, error) {
	reader, err := prometheus.New() // registers with prometheus.DefaultRegisterer
	if err != nil {
		return nil, err
	}
	go func() {
		http.Handle("/metrics", promhttp.Handler())
		if err := http.ListenAndServe(listen, nil); !errors.Is(err, http.ErrServerClosed) {
			log.Fatal(err)
		}
	}()
	return sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)), nil
}

// otlpProviders returns providers that push metrics every 10 s and spans
// in batches to an OTLP/HTTP collector.
func otlpProviders(ctx context.Context) (*sdkmetric.MeterProvider, *sdktrace.TracerProvider, error) {
	me, err := otlpmetrichttp.New(ctx)
	if err != nil {
		return nil, nil, err
	}
	te, err := otlptracehttp.New(ctx)
	if err != nil {
		return nil, nil, err
	}
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewPeriodicReader(me, sdkmetric.WithInterval(10*time.Second))))
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(te))
	return mp, tp, nil
}

// work runs four workers that take the lock "example" in turn, holding it
// 20 ms and giving up after 50 ms of waiting, until ctx ends.
func work(ctx context.Context, client *redisync.Client) error {
	m, err := client.NewMutex("example") // shared: its goroutines exclude each other
	if err != nil {
		return err
	}
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for ctx.Err() == nil {
				wctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
				err := m.Lock(wctx)
				cancel()
				if err != nil {
					continue // a timeout: counted by redisync.lock.wait.duration{outcome=timeout}
				}
				time.Sleep(20 * time.Millisecond)
				_ = m.Unlock(context.WithoutCancel(ctx))
			}
		})
	}
	wg.Wait()
	return nil
}
