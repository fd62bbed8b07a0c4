// Package redisserver starts and stops private redis-server processes for
// tests, benchmarks and demos.
//
// A Server is a child process listening on a unix socket (or a TCP port when
// asked) in a temporary directory of its own, with persistence switched off.
// It is stopped by PID: Stop sends SIGTERM and waits, Kill sends SIGKILL. The
// child also gets SIGKILL if the starting thread dies, so a crashed test binary
// does not leave servers behind.
package redisserver

import (
	"context"
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

	"github.com/redis/go-redis/v9"
)

// ErrNoServer is returned when the redis-server binary cannot be found.
var ErrNoServer = errors.New("redisserver: redis-server not found on PATH (install it: apt-get install -y redis-server, or run `make test`, which does)")

// Options configures Start. The zero value starts a server on a fresh unix socket.
type Options struct {
	// Port makes the server listen on 127.0.0.1:Port instead of a unix socket.
	// Use FreePort to pick one.
	Port int
	// Dir is the working directory (socket, log, cluster config). Default: a
	// new temporary directory, removed by Stop.
	Dir string
	// Args are extra redis-server arguments, e.g. "--cluster-enabled", "yes".
	Args []string
	// Sentinel, if set, starts a Redis Sentinel (redis-sentinel) with this
	// configuration instead of a server (see StartSentinels).
	Sentinel string
}

// Server is a running redis-server child process.
type Server struct {
	// Network and Addr are what a go-redis client dials ("unix" or "tcp").
	Network, Addr string
	// Dir is the server's working directory.
	Dir string

	opts    Options
	ownsDir bool

	mu   sync.Mutex // guards cmd and done across Stop/Kill/Restart
	cmd  *exec.Cmd
	done chan struct{} // closed when cmd has been waited for
}

// Start launches redis-server and waits until it answers PING.
func Start(ctx context.Context, opts *Options) (*Server, error) {
	var o Options
	if opts != nil {
		o = *opts
	}
	s := &Server{opts: o}
	if o.Dir == "" {
		dir, err := os.MkdirTemp("", "cg-redis-")
		if err != nil {
			return nil, fmt.Errorf("redisserver: %w", err)
		}
		s.Dir, s.ownsDir = dir, true
	} else {
		s.Dir = o.Dir
	}
	if o.Port > 0 {
		s.Network, s.Addr = "tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(o.Port))
	} else {
		s.Network, s.Addr = "unix", filepath.Join(s.Dir, "redis.sock")
	}
	if err := s.launch(ctx); err != nil {
		s.cleanup()
		return nil, err
	}
	return s, nil
}

func (s *Server) launch(ctx context.Context) error {
	if s.opts.Sentinel != "" {
		return s.launchSentinel(ctx)
	}
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return ErrNoServer
	}
	args := []string{
		"--save", "", "--appendonly", "no",
		"--dir", s.Dir,
		"--bind", "127.0.0.1",
		"--protected-mode", "no",
		"--loglevel", "warning",
		"--logfile", filepath.Join(s.Dir, "redis.log"),
		"--daemonize", "no",
	}
	if s.Network == "unix" {
		args = append(args, "--port", "0", "--unixsocket", s.Addr, "--unixsocketperm", "700")
	} else {
		args = append(args, "--port", strconv.Itoa(s.opts.Port))
	}
	args = append(args, s.opts.Args...)
	return s.run(ctx, bin, args)
}

// run starts bin with args in the server's directory and waits for PING.
func (s *Server) run(ctx context.Context, bin string, args []string) error {
	cmd := exec.Command(bin, args...)
	cmd.Dir = s.Dir
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("redisserver: start %s: %w", bin, err)
	}
	done := make(chan struct{})
	go func() { // owned by the Server; ends when the process exits
		_ = cmd.Wait()
		close(done)
	}()
	s.mu.Lock()
	s.cmd, s.done = cmd, done
	s.mu.Unlock()

	if err := s.waitReady(ctx, done); err != nil {
		_ = s.Kill()
		return err
	}
	return nil
}

func (s *Server) waitReady(ctx context.Context, done <-chan struct{}) error {
	c := redis.NewClient(&redis.Options{Network: s.Network, Addr: s.Addr, MaxRetries: -1, DialTimeout: time.Second})
	defer c.Close()
	deadline := time.Now().Add(15 * time.Second)
	for {
		select {
		case <-done:
			log, _ := os.ReadFile(filepath.Join(s.Dir, "redis.log"))
			return fmt.Errorf("redisserver: redis-server exited during start-up; log:\n%s", log)
		case <-ctx.Done():
			return ctx.Err()
		default:
		}
		pctx, cancel := context.WithTimeout(ctx, time.Second)
		err := c.Ping(pctx).Err()
		cancel()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("redisserver: redis-server at %s not ready after 15s: %w", s.Addr, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// exited reports whether the process has ended.
func (s *Server) exited() bool {
	s.mu.Lock()
	done := s.done
	s.mu.Unlock()
	if done == nil {
		return true
	}
	select {
	case <-done:
		return true
	default:
		return false
	}
}

// Options returns go-redis options that dial this server.
func (s *Server) Options() *redis.Options {
	return &redis.Options{Network: s.Network, Addr: s.Addr}
}

// PID is the process id of the running server, or 0.
func (s *Server) PID() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil || s.cmd.Process == nil {
		return 0
	}
	return s.cmd.Process.Pid
}

// Stop terminates the server (SIGTERM, then SIGKILL after 5 s) and removes its
// directory if Start created it.
func (s *Server) Stop() error {
	err := s.signal(syscall.SIGTERM, 5*time.Second)
	s.cleanup()
	return err
}

// Kill sends SIGKILL and waits for the process to exit. The directory is kept
// so that Restart can bring the server back on the same address.
func (s *Server) Kill() error { return s.signal(syscall.SIGKILL, 5*time.Second) }

// Restart starts the server again on the same address after Kill or a SHUTDOWN.
func (s *Server) Restart(ctx context.Context) error {
	if err := s.signal(syscall.SIGKILL, 5*time.Second); err != nil {
		return err
	}
	return s.launch(ctx)
}

func (s *Server) signal(sig syscall.Signal, wait time.Duration) error {
	s.mu.Lock()
	cmd, done := s.cmd, s.done
	s.mu.Unlock()
	if cmd == nil {
		return nil
	}
	select {
	case <-done:
		return nil
	default:
	}
	_ = cmd.Process.Signal(sig)
	select {
	case <-done:
		return nil
	case <-time.After(wait):
	}
	_ = cmd.Process.Kill()
	select {
	case <-done:
		return nil
	case <-time.After(wait):
		return fmt.Errorf("redisserver: pid %d did not exit", cmd.Process.Pid)
	}
}

func (s *Server) cleanup() {
	if s.ownsDir {
		_ = os.RemoveAll(s.Dir)
	}
}

// packages are the Debian packages of the binaries Need checks.
var packages = map[string]string{"redis-server": "redis-server", "redis-sentinel": "redis-sentinel", "redis-cli": "redis-tools"}

// Need returns nil if every one of bins (redis-server, redis-sentinel,
// redis-cli) is on PATH, and otherwise one line naming the missing ones and
// what installs them: `make deps` (scripts/ensure-deps.sh), or apt-get.
func Need(bins ...string) error {
	var missing, pkgs []string
	for _, b := range bins {
		if _, err := exec.LookPath(b); err != nil {
			missing, pkgs = append(missing, b), append(pkgs, packages[b])
		}
	}
	if len(missing) == 0 {
		return nil
	}
	return fmt.Errorf("redisserver: %s not found on PATH: run `make deps` (as root it installs them), or apt-get install -y %s",
		strings.Join(missing, ", "), strings.Join(pkgs, " "))
}

// FreePort asks the kernel for a free TCP port on 127.0.0.1. When bus is
// true it also checks that port+10000 (the cluster bus port) is free.
func FreePort(bus bool) (int, error) {
	for range 50 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return 0, fmt.Errorf("redisserver: free port: %w", err)
		}
		port := l.Addr().(*net.TCPAddr).Port
		_ = l.Close()
		if !bus {
			return port, nil
		}
		if port+10000 > 65535 {
			continue
		}
		l2, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port+10000)))
		if err != nil {
			continue
		}
		_ = l2.Close()
		return port, nil
	}
	return 0, errors.New("redisserver: no free port found")
}
