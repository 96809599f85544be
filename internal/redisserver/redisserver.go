// Package redisserver starts redis-server processes on free loopback
// ports, without persistence, each in a directory of its own: one server,
// or a Redis Cluster joined by redis-cli. It is the one launcher of the
// repository: the tests reach it through internal/redistest, and the
// benchmark (bench/) uses it as it is.
package redisserver

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// startTimeout bounds how long a started server may take to answer PING.
const startTimeout = 10 * time.Second

// Server is a redis-server process on a loopback port. Its methods are
// safe for concurrent use.
type Server struct {
	// Addr is host:port.
	Addr   string
	binary string
	port   int
	args   []string
	dir    string

	mu   sync.Mutex
	proc *process // nil while killed
}

// process is one run of the server.
type process struct {
	cmd    *exec.Cmd
	exited chan struct{} // closed when cmd has exited
}

// Start runs binary (redis-server, found on PATH if it has no slash) on a
// free loopback port, with no persistence unless args ask for it, and
// waits until it answers PING. A non-empty conf is written to a
// configuration file the server starts with (a Sentinel needs one). The
// server is killed if this process dies; Stop stops it.
func Start(binary, conf string, args ...string) (*Server, error) {
	return start(freePort, binary, conf, args...)
}

// start is Start on a port from pick.
func start(pick func() (int, error), binary, conf string, args ...string) (*Server, error) {
	dir, err := os.MkdirTemp("", "redisserver-")
	if err != nil {
		return nil, err
	}
	if conf != "" {
		path := filepath.Join(dir, "redis.conf")
		if err := os.WriteFile(path, []byte(conf), 0o600); err != nil {
			return nil, errors.Join(err, os.RemoveAll(dir))
		}
		args = append([]string{path}, args...)
	}
	var errs []error
	for range 5 {
		port, err := pick()
		if err != nil {
			return nil, errors.Join(err, os.RemoveAll(dir))
		}
		s := &Server{Addr: "127.0.0.1:" + strconv.Itoa(port), binary: binary, port: port, args: args, dir: dir}
		err = s.Restart()
		if err == nil {
			return s, nil
		}
		// Another process may have taken the port meanwhile: try another.
		errs = append(errs, err)
	}
	return nil, errors.Join(append(errs, os.RemoveAll(dir))...)
}

// Restart starts the server on its port: after Kill, or for the first time.
func (s *Server) Restart() error {
	argv := []string{
		"--port", strconv.Itoa(s.port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", s.dir,
		"--logfile", "redis.log", "--protected-mode", "no",
	}
	if len(s.args) > 0 && !strings.HasPrefix(s.args[0], "--") {
		// A configuration file goes first.
		argv = append([]string{s.args[0]}, append(argv, s.args[1:]...)...)
	} else {
		argv = append(argv, s.args...)
	}
	// What the server says before its log is open (a bad option) goes
	// to its output.
	out, err := os.OpenFile(filepath.Join(s.dir, "redis.out"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer out.Close() // the child has its own copy
	cmd := exec.Command(s.binary, argv...)
	cmd.Dir = s.dir
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %w", s.binary, err)
	}
	p := &process{cmd: cmd, exited: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(p.exited) }()
	for deadline := time.Now().Add(startTimeout); !ping(s.Addr); {
		select {
		case <-p.exited:
			return fmt.Errorf("%s on %s exited: %s", s.binary, s.Addr, s.log())
		case <-time.After(10 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			_ = cmd.Process.Kill()
			<-p.exited
			return fmt.Errorf("%s on %s did not answer within %v: %s", s.binary, s.Addr, startTimeout, s.log())
		}
	}
	s.mu.Lock()
	s.proc = p
	s.mu.Unlock()
	return nil
}

// log returns the end of the server's output and log, for an error.
func (s *Server) log() string {
	out, _ := os.ReadFile(filepath.Join(s.dir, "redis.out"))
	log, _ := os.ReadFile(filepath.Join(s.dir, "redis.log"))
	b := bytes.TrimSpace(append(out, log...))
	return string(b[max(0, len(b)-2000):])
}

// Kill ends the server with SIGKILL and waits until it has exited. It
// does nothing when the server is not running.
func (s *Server) Kill() {
	s.mu.Lock()
	p := s.proc
	s.proc = nil
	s.mu.Unlock()
	if p == nil {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGCONT) // in case it was paused
	_ = p.cmd.Process.Kill()
	<-p.exited
}

// Signal sends sig (such as SIGSTOP or SIGCONT) to the server process.
func (s *Server) Signal(sig os.Signal) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc == nil {
		return fmt.Errorf("redisserver: %s is not running", s.Addr)
	}
	return s.proc.cmd.Process.Signal(sig)
}

// Running reports whether the server process runs (not killed).
func (s *Server) Running() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.proc != nil
}

// Stop kills the server and removes its directory.
func (s *Server) Stop() error {
	s.Kill()
	return os.RemoveAll(s.dir)
}

// ping reports whether a Redis answers PING on addr.
func ping(addr string) bool {
	conn, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
	if err != nil {
		return false
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(time.Second))
	if _, err := conn.Write([]byte("PING\r\n")); err != nil {
		return false
	}
	buf := make([]byte, 7)
	n, _ := conn.Read(buf)
	return string(buf[:n]) == "+PONG\r\n"
}

// freePort asks the kernel for a free loopback port.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
