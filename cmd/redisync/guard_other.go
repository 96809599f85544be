//go:build !linux

// Elsewhere than Linux there is no guard (see guard_linux.go): the command
// is redisync's direct child. If redisync is killed with SIGKILL (or
// crashes), the command and what it started keep running without the
// lock, and once the lease runs out another holder may start. Signals
// that redisync receives, and the terminal's, still reach the command.

package main

import (
	"os"
	"os/exec"
)

// guardCommand is the hidden subcommand of the guard, unused here.
const guardCommand = "internal-guard"

// runGuard exists on Linux only.
func runGuard([]string) int { return exitUsage }

// child is a command that runs.
type child struct {
	cmd *exec.Cmd
	pid int
}

// startChild starts argv with env, with redisync's stdin, stdout and
// stderr.
func startChild(argv, env []string) (*child, error) {
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.Env = env
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	return &child{cmd: cmd, pid: cmd.Process.Pid}, nil
}

// signal passes sig on to the command.
func (c *child) signal(sig os.Signal) error { return c.cmd.Process.Signal(sig) }

// wait waits for the command to exit.
func (c *child) wait() error { return c.cmd.Wait() }
