package redisyncotel_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.uber.org/goleak"

	"github.com/redisync/redisync"
	"github.com/redisync/redisync/redisyncotel"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// telemetry is an Observer recording into an in-memory reader and
// exporter.
type telemetry struct {
	obs    *redisyncotel.Observer
	reader *sdkmetric.ManualReader
	spans  *tracetest.InMemoryExporter
	tp     *sdktrace.TracerProvider
}

func newTelemetry(t *testing.T, opts ...redisyncotel.Option) *telemetry {
	t.Helper()
	tel := &telemetry{reader: sdkmetric.NewManualReader(), spans: tracetest.NewInMemoryExporter()}
	tel.tp = sdktrace.NewTracerProvider(sdktrace.WithSyncer(tel.spans))
	t.Cleanup(func() { _ = tel.tp.Shutdown(context.Background()) })
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(tel.reader))
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
	obs, err := redisyncotel.New(append(opts, redisyncotel.WithMeterProvider(mp), redisyncotel.WithTracerProvider(tel.tp))...)
	if err != nil {
		t.Fatal(err)
	}
	tel.obs = obs
	return tel
}

// metric returns the collected metric called name, or nil when nothing
// was recorded in it.
func (tel *telemetry) metric(t *testing.T, name string) metricdata.Aggregation {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := tel.reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name == name {
				return m.Data
			}
		}
	}
	return nil
}

// byOutcome returns a histogram's counts by its outcome attribute.
func byOutcome(t *testing.T, data metricdata.Aggregation) map[string]uint64 {
	t.Helper()
	h, ok := data.(metricdata.Histogram[float64])
	if !ok {
		t.Fatalf("%T is not a float64 histogram", data)
	}
	n := map[string]uint64{}
	for _, dp := range h.DataPoints {
		v, _ := dp.Attributes.Value(redisyncotel.AttrOutcome)
		n[v.AsString()] += dp.Count
	}
	return n
}

// sum returns the total of an int64 sum (0 when nothing was recorded).
func sum(t *testing.T, data metricdata.Aggregation) int64 {
	t.Helper()
	if data == nil {
		return 0
	}
	s, ok := data.(metricdata.Sum[int64])
	if !ok {
		t.Fatalf("%T is not an int64 sum", data)
	}
	var n int64
	for _, dp := range s.DataPoints {
		n += dp.Value
	}
	return n
}

func newRedis(t *testing.T) (*miniredis.Miniredis, *redis.Client) {
	t.Helper()
	mr := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	t.Cleanup(func() { _ = rdb.Close() })
	return mr, rdb
}

// outcomeOf classifies what a Lock or Acquire returned, as the caller
// sees it.
func outcomeOf(err error) string {
	switch {
	case err == nil:
		return "acquired"
	case errors.Is(err, context.DeadlineExceeded):
		return "timeout"
	case errors.Is(err, context.Canceled):
		return "canceled"
	}
	return "error"
}

// A contended run, with timeouts, cancellations and errors mixed in:
// the wait histogram counts, per outcome, exactly the calls that ended
// so; the waiters gauge is back to zero; a lost hold is counted once.
func TestContendedRunMetrics(t *testing.T) {
	mr, rdb := newRedis(t)
	tel := newTelemetry(t)
	c, err := redisync.New(rdb, redisync.WithObserver(tel.obs), redisync.WithCrashTimeout(300*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()

	var mu sync.Mutex
	made := map[string]uint64{}
	count := func(err error) {
		mu.Lock()
		defer mu.Unlock()
		made[outcomeOf(err)]++
	}
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Go(func() {
			m := must(c.NewMutex("hot"))
			s := must(c.NewSemaphore("hot", 2))
			for i := range 15 {
				cctx, cancel := context.WithCancel(ctx)
				switch i % 3 {
				case 1: // a timeout, often before the lock comes
					cctx, cancel = context.WithTimeout(ctx, time.Duration(rand.N(3)+1)*time.Millisecond)
				case 2: // a cancellation from another goroutine
					go func() {
						time.Sleep(time.Duration(rand.N(3)) * time.Millisecond) // when, not what: any moment will do
						cancel()
					}()
				}
				var err error
				if w%2 == 0 {
					if err = m.Lock(cctx); err == nil {
						time.Sleep(time.Millisecond) // the work under the lock
						err = m.Unlock(ctx)
						if err != nil {
							t.Error(err)
						}
					}
				} else {
					if err = s.Acquire(cctx, 1); err == nil {
						time.Sleep(time.Millisecond)
						if err := s.Release(ctx, 1); err != nil {
							t.Error(err)
						}
					}
				}
				cancel()
				count(err)
			}
		})
	}
	wg.Wait()
	// Errors: a key of another type, and a semaphore of another size.
	if err := mr.Set("redisync:lock:{wrong}", "not a lock"); err != nil {
		t.Fatal(err)
	}
	count(must(c.NewMutex("wrong")).Lock(ctx))
	count(must(c.NewSemaphore("hot", 3)).Acquire(ctx, 1))

	// A hold lost: its key removed behind its back.
	m := must(c.NewMutex("lost"))
	if err := m.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	count(nil)
	mr.Del("redisync:lock:{lost}")
	select {
	case <-m.Lost(): // by the next renewal, within 100 ms
	case <-time.After(5 * time.Second):
		t.Fatal("Lost not closed")
	}
	if err := m.Unlock(ctx); !errors.Is(err, redisync.ErrLockLost) {
		t.Fatalf("Unlock = %v", err)
	}
	if _, err := m.TTL(ctx); !errors.Is(err, redisync.ErrNotHeld) {
		t.Fatalf("TTL = %v", err)
	}
	_ = c.Close() // delivers the events queued

	if made["timeout"] == 0 || made["canceled"] == 0 || made["acquired"] == 0 {
		t.Fatalf("the run did not mix outcomes: %v", made)
	}
	got := byOutcome(t, tel.metric(t, "redisync.lock.wait.duration"))
	for _, o := range []string{"acquired", "timeout", "canceled", "error"} {
		if got[o] != made[o] {
			t.Errorf("wait histogram counts %d calls %s, %d were made", got[o], o, made[o])
		}
	}
	if len(got) != 4 {
		t.Errorf("wait histogram outcomes %v, want those of %v", got, made)
	}
	if n := sum(t, tel.metric(t, "redisync.lock.acquisitions")); uint64(n) != made["acquired"]+made["timeout"]+made["canceled"]+made["error"] {
		t.Errorf("acquisitions %d, calls %v", n, made)
	}
	if n := sum(t, tel.metric(t, "redisync.lock.waiters")); n != 0 {
		t.Errorf("waiters %d after every call returned", n)
	}
	if n := sum(t, tel.metric(t, "redisync.lock.holds.lost")); n != 1 {
		t.Errorf("holds lost %d, want 1", n)
	}
	if held := byOutcome(t, tel.metric(t, "redisync.lock.hold.duration")); held["lost"] != 1 || held["released"] != made["acquired"]-1 {
		t.Errorf("hold durations %v, want %d released and 1 lost", held, made["acquired"]-1)
	}
	if n := sum(t, tel.metric(t, "redisync.events.dropped")); n != 0 {
		t.Errorf("%d events dropped", n)
	}
}

// Each call's span is a child of the caller's, with the token and the
// wait on it; a failed call's span says so.
func TestSpansAreChildrenOfTheCallersSpan(t *testing.T) {
	_, rdb := newRedis(t)
	tel := newTelemetry(t)
	c, err := redisync.New(rdb, redisync.WithObserver(tel.obs))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, parent := tel.tp.Tracer("test").Start(context.Background(), "request")
	m := must(c.NewMutex("traced"))
	if err := m.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	token := m.Token()
	if ok, err := must(c.NewMutex("traced")).TryLock(ctx); ok || err != nil {
		t.Fatalf("TryLock = %v, %v", ok, err)
	}
	if err := m.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := m.Unlock(ctx); !errors.Is(err, redisync.ErrNotHeld) {
		t.Fatal(err)
	}
	parent.End()

	spans := tel.spans.GetSpans()
	want := []string{"redisync.lock", "redisync.trylock", "redisync.unlock", "redisync.unlock", "request"}
	if len(spans) != len(want) {
		t.Fatalf("%d spans, want %v", len(spans), want)
	}
	for i, s := range spans {
		if s.Name != want[i] {
			t.Errorf("span %d is %s, want %s", i, s.Name, want[i])
		}
		if i < 4 && (s.Parent.SpanID() != parent.SpanContext().SpanID() || s.SpanContext.TraceID() != parent.SpanContext().TraceID()) {
			t.Errorf("span %s is not a child of the caller's span", s.Name)
		}
	}
	attrs := attribute.NewSet(spans[0].Attributes...)
	if v, _ := attrs.Value(redisyncotel.AttrToken); v.AsInt64() != token {
		t.Errorf("lock span token %v, want %d", v.AsInt64(), token)
	}
	if v, ok := attrs.Value(redisyncotel.AttrWaitTime); !ok || v.AsFloat64() <= 0 {
		t.Errorf("lock span wait time %v", v.AsFloat64())
	}
	if v, _ := attrs.Value(redisyncotel.AttrName); v.AsString() != "traced" {
		t.Errorf("lock span name %q", v.AsString())
	}
	try := attribute.NewSet(spans[1].Attributes...)
	if v, _ := try.Value(redisyncotel.AttrOutcome); v.AsString() != "busy" {
		t.Errorf("trylock span outcome %q", v.AsString())
	}
	if spans[2].Status.Code != 0 || spans[3].Status.Code == 0 || len(spans[3].Events) == 0 {
		t.Errorf("unlock spans' status %v and %v: want unset, then an error recorded", spans[2].Status, spans[3].Status)
	}
}

// The lock name is on the metrics only when asked for.
func TestNameAttributeIsOptIn(t *testing.T) {
	for _, withName := range []bool{false, true} {
		_, rdb := newRedis(t)
		var opts []redisyncotel.Option
		if withName {
			opts = append(opts, redisyncotel.WithNameAttribute())
		}
		tel := newTelemetry(t, opts...)
		c, err := redisync.New(rdb, redisync.WithObserver(tel.obs))
		if err != nil {
			t.Fatal(err)
		}
		m := must(c.NewMutex("per-user-42"))
		if err := m.Lock(context.Background()); err != nil {
			t.Fatal(err)
		}
		_ = m.Unlock(context.Background())
		_ = c.Close()
		h := tel.metric(t, "redisync.lock.wait.duration").(metricdata.Histogram[float64])
		_, has := h.DataPoints[0].Attributes.Value(redisyncotel.AttrName)
		if has != withName {
			t.Errorf("WithNameAttribute %v: name attribute present %v", withName, has)
		}
	}
}

// must returns v, a value that a constructor made, and panics with err,
// the constructor's error: a test whose arguments are valid by design
// fails at once (and loudly) if they are not.
func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

// TestNewRefusesNilProviders: a nil provider is an invalid option, as
// redisync's own options are, not a panic at the first call.
func TestNewRefusesNilProviders(t *testing.T) {
	for _, opt := range []redisyncotel.Option{redisyncotel.WithMeterProvider(nil), redisyncotel.WithTracerProvider(nil)} {
		if obs, err := redisyncotel.New(opt); obs != nil || !errors.Is(err, redisync.ErrInvalidOption) {
			t.Errorf("New with a nil provider: %v, %v; want ErrInvalidOption", obs, err)
		}
	}
}
