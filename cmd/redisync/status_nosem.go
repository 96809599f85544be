//go:build !redisync_sem

package main

import (
	"context"
	"io"

	"github.com/redis/go-redis/v9"
)

// This file stands in for status_sem.go in a build without semaphores
// (without the build tag redisync_sem). Delete it when the tag goes.

// SemStatus would be the state of a semaphore; this build has none, so
// Status.Semaphore is always nil.
type SemStatus struct{}

// readSemaphore queues nothing on p; its result is always nil.
func readSemaphore(context.Context, redis.Pipeliner, string, string) func(int64) (*SemStatus, error) {
	return func(int64) (*SemStatus, error) { return nil, nil }
}

// printSemaphore prints nothing: this build has no semaphores.
func printSemaphore(io.Writer, *Status) {}
