// Package container starts a redis:7 container through testcontainers-go,
// the integration tests' last way to a Redis when there is neither
// REDIS_ADDR nor redis-server on PATH (see redistest.Main). It lives in the
// integration module so that testcontainers-go and Docker's client stay out
// of the root module's graph.
package container

import (
	"context"
	"fmt"
	"time"

	"github.com/testcontainers/testcontainers-go"
	"github.com/testcontainers/testcontainers-go/wait"
)

// Redis starts redis:7 and returns its address and a function that removes
// the container. It fails when no Docker engine answers.
func Redis() (addr string, stop func(), err error) {
	defer func() {
		if r := recover(); r != nil { // testcontainers panics without an engine
			err = fmt.Errorf("no Docker engine (testcontainers: %v)", r)
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := testcontainers.Run(ctx, "redis:7",
		testcontainers.WithExposedPorts("6379/tcp"),
		testcontainers.WithWaitStrategy(wait.ForListeningPort("6379/tcp")))
	if err != nil {
		if c != nil {
			_ = testcontainers.TerminateContainer(c)
		}
		return "", nil, fmt.Errorf("redis:7 container: %w", err)
	}
	addr, err = c.PortEndpoint(ctx, "6379/tcp", "")
	if err != nil {
		_ = testcontainers.TerminateContainer(c)
		return "", nil, err
	}
	return addr, func() { _ = testcontainers.TerminateContainer(c) }, nil
}
