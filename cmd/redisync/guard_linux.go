// The guard: on Linux, the command that lock and sem run dies with
// redisync, and so does everything it started.
//
// A parent-death signal (PR_SET_PDEATHSIG) set on the command alone is not
// enough: it reaches only the command, not what the command started, and
// it fires when the thread that forked the command exits, not the process
// (golang/go#27505). Process groups are no answer either: a command in a
// group of its own loses the terminal (Ctrl-C, reading stdin), and a
// grandchild may leave the group with setsid.
//
// So redisync starts the command through a small supervisor, itself
// re-executed in "guard" mode (/proc/self/exe internal-guard PATH ARGV...):
//
//	redisync ──pipe──▶ guard ──▶ command ──▶ what the command starts
//
//   - The guard makes itself a child subreaper (PR_SET_CHILD_SUBREAPER):
//     every orphaned descendant of the command is re-parented to it, not
//     to init, however it was started (double fork, setsid).
//   - redisync holds the write end of a pipe whose read end is the guard's
//     fd 3. Bytes on it are signal numbers that redisync passes on to the
//     command. End of file means redisync is gone, however it died
//     (SIGKILL, OOM kill): the kernel closes the pipe. The guard then
//     kills the command and every descendant with SIGKILL, and keeps
//     killing the orphans re-parented to it until it has no child left.
//     A SIGKILL passed on by redisync (--grace ran out) does the same.
//   - The command has PR_SET_PDEATHSIG = SIGKILL, set by the guard on a
//     thread locked for the guard's whole life, should the guard itself
//     be killed.
//   - All three stay in redisync's process group, so the terminal's
//     signals (Ctrl-C, Ctrl-\, Ctrl-Z) and stdin reach the command as if
//     redisync ran it directly. The guard catches and drops the signals
//     redisync forwards; the command gets them from the terminal, or from
//     redisync through the pipe.
//   - The guard exits as the command did: the same code, or killed by the
//     same signal (SIGINT, SIGTERM, SIGHUP, SIGKILL; 128+N for others).
//     Descendants left running by a command that exited by itself are not
//     killed, as without the guard.
//   - The guard reports the command's pid, or why it could not start it,
//     on its fd 4 before anything else.

package main

import (
	"bufio"
	"cmp"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
)

// guardCommand is the hidden subcommand of the guard.
const guardCommand = "internal-guard"

// prSetChildSubreaper is PR_SET_CHILD_SUBREAPER from linux/prctl.h.
const prSetChildSubreaper = 36

// child is a command that runs, through its guard.
type child struct {
	cmd *exec.Cmd // the guard: it exits as the command did
	pid int       // the command's
	ctl *os.File  // the pipe to the guard; closing it kills the command
}

// startChild starts argv with env through a guard, with redisync's stdin,
// stdout and stderr. It fails with exec.ErrNotFound or fs.ErrNotExist when
// the command is not found.
func startChild(argv, env []string) (*child, error) {
	path, err := exec.LookPath(argv[0])
	if err != nil {
		return nil, err
	}
	ctlR, ctlW, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	repR, repW, err := os.Pipe()
	if err != nil {
		_, _ = ctlR.Close(), ctlW.Close()
		return nil, err
	}
	defer func() { _ = repR.Close() }()
	cmd := exec.Command("/proc/self/exe", append([]string{guardCommand, path}, argv...)...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.Env = env
	cmd.ExtraFiles = []*os.File{ctlR, repW} // fds 3 and 4
	err = cmd.Start()
	_, _ = ctlR.Close(), repW.Close()
	if err != nil {
		_ = ctlW.Close()
		return nil, err
	}
	report, _ := io.ReadAll(repR) // until the guard closes it: a line
	if pid, ok := strings.CutPrefix(string(report), "pid "); ok {
		if n, err := strconv.Atoi(strings.TrimSpace(pid)); err == nil {
			return &child{cmd: cmd, pid: n, ctl: ctlW}, nil
		}
	}
	_ = ctlW.Close()
	_ = cmd.Wait()
	msg := strings.TrimSpace(strings.TrimPrefix(string(report), "error "))
	return nil, errors.New(cmp.Or(msg, "the guard process failed"))
}

// signal passes sig on to the command.
func (c *child) signal(sig os.Signal) error {
	s, ok := sig.(syscall.Signal)
	if !ok {
		return errors.New("not a signal number")
	}
	_, err := c.ctl.Write([]byte{byte(s)})
	return err
}

// wait waits for the command to exit.
func (c *child) wait() error {
	err := c.cmd.Wait()
	_ = c.ctl.Close()
	return err
}

// runGuard is the guard: args are the command's path and argv.
func runGuard(args []string) int {
	if len(args) < 2 {
		return exitUsage
	}
	syscall.CloseOnExec(3) // neither pipe goes on to the command
	syscall.CloseOnExec(4)
	ctl, report := os.NewFile(3, "ctl"), os.NewFile(4, "report")
	// Dropped: the command gets them from the terminal, or from redisync
	// through the pipe. (Notify, not Ignore: ignored signals stay ignored
	// in the command.)
	signal.Notify(make(chan os.Signal, 1), forwarded...)
	if _, _, errno := syscall.RawSyscall(syscall.SYS_PRCTL, prSetChildSubreaper, 1, 0); errno != 0 {
		fmt.Fprintf(report, "error cannot become a subreaper: %v\n", errno)
		return exitCannotRun
	}
	// The command's parent-death signal fires when this thread exits:
	// keep it until the process exits.
	runtime.LockOSThread()
	p, err := os.StartProcess(args[0], args[1:], &os.ProcAttr{
		Files: []*os.File{os.Stdin, os.Stdout, os.Stderr},
		Sys:   &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL},
	})
	if err != nil {
		fmt.Fprintf(report, "error %v\n", err)
		return exitCannotRun
	}
	fmt.Fprintf(report, "pid %d\n", p.Pid)
	_ = report.Close()

	var dying atomic.Bool
	go func() {
		r := bufio.NewReader(ctl)
		for {
			b, err := r.ReadByte()
			if err != nil || syscall.Signal(b) == syscall.SIGKILL {
				break // redisync is gone, or wants the command dead
			}
			_ = p.Signal(syscall.Signal(b))
		}
		dying.Store(true)
		killChildren()
	}()
	return reap(p.Pid, &dying)
}

// reap waits for the command (pid) and for the orphans re-parented to the
// guard, and returns the guard's exit code. Once dying is set, it kills
// every child after each one it reaped, until none is left.
func reap(pid int, dying *atomic.Bool) int {
	var status syscall.WaitStatus
	for {
		var ws syscall.WaitStatus
		got, err := syscall.Wait4(-1, &ws, 0, nil)
		if errors.Is(err, syscall.EINTR) {
			continue
		}
		if err != nil {
			break // ECHILD: no child left
		}
		if got == pid {
			status = ws
			if !dying.Load() {
				break
			}
		}
		if dying.Load() {
			killChildren() // the reaped one's children are ours now
		}
	}
	switch {
	case status.Exited():
		return status.ExitStatus()
	case status.Signaled():
		sig := status.Signal()
		switch sig {
		case syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGKILL:
			signal.Reset(sig)
			_ = syscall.Kill(os.Getpid(), sig)
		}
		return exitSignal + int(sig)
	}
	return exitSignal + int(syscall.SIGKILL)
}

// killChildren sends SIGKILL to every child of the guard, found in /proc.
func killChildren() {
	self := strconv.Itoa(os.Getpid())
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...; comm may hold spaces and parentheses.
		i := strings.LastIndexByte(string(stat), ')')
		if f := strings.Fields(string(stat[i+1:])); i >= 0 && len(f) > 1 && f[1] == self {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}
