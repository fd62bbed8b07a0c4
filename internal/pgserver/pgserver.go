// Package pgserver starts and stops private PostgreSQL servers for tests
// and the demo: initdb into a fresh directory, then pg_ctl on a free
// loopback port, from the Debian package's binaries (`make test` installs
// them). As root the server runs as the package's postgres user. Restart
// stops and starts the same data directory, as an administrator would.
package pgserver

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"

	"github.com/cacheguard/cacheguard/internal/redisserver"
)

// ErrNoServer is returned when PostgreSQL's binaries cannot be found.
var ErrNoServer = errors.New("pgserver: PostgreSQL is not installed (apt-get install -y postgresql; `make test` does it)")

// Server is a running PostgreSQL server of the caller's own.
type Server struct {
	bin, dir, data string
	opts           string
	Port           int
}

// Installed returns ErrNoServer if PostgreSQL's binaries cannot be found.
func Installed() error {
	if bins, _ := filepath.Glob("/usr/lib/postgresql/*/bin/initdb"); len(bins) == 0 {
		return ErrNoServer
	}
	return nil
}

// Start runs initdb and starts a server with trust authentication for the
// user postgres, fsync off, and settings (each "name=value", e.g.
// "wal_level=logical").
func Start(settings ...string) (*Server, error) {
	bins, _ := filepath.Glob("/usr/lib/postgresql/*/bin/initdb")
	if len(bins) == 0 {
		return nil, ErrNoServer
	}
	base := "" // os.TempDir()
	if os.Geteuid() == 0 {
		base = "/tmp" // the postgres user must reach the directory: a TMPDIR private to root would refuse it
	}
	dir, err := os.MkdirTemp(base, "cg-pg-")
	if err != nil {
		return nil, err
	}
	s := &Server{bin: filepath.Dir(bins[len(bins)-1]), dir: dir, data: filepath.Join(dir, "data")}
	if err := s.own(); err != nil {
		s.Remove()
		return nil, err
	}
	if out, err := s.run("initdb", "-D", s.data, "-A", "trust", "-U", "postgres").CombinedOutput(); err != nil {
		s.Remove()
		return nil, fmt.Errorf("pgserver: initdb: %w\n%s", err, out)
	}
	if s.Port, err = redisserver.FreePort(false); err != nil {
		s.Remove()
		return nil, err
	}
	s.opts = fmt.Sprintf("-p %d -k %s -c listen_addresses=127.0.0.1 -c fsync=off", s.Port, dir)
	for _, kv := range settings {
		s.opts += " -c " + kv
	}
	if err := s.Restart(); err != nil {
		s.Remove()
		return nil, err
	}
	return s, nil
}

// URL is the connection URL of database db.
func (s *Server) URL(db string) string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/%s?sslmode=disable", s.Port, db)
}

// Restart starts the server, stopping it first (fast shutdown) if it runs.
func (s *Server) Restart() error {
	_ = s.run("pg_ctl", "-D", s.data, "-m", "fast", "-w", "stop").Run()
	log := filepath.Join(s.dir, "log")
	if out, err := s.run("pg_ctl", "-D", s.data, "-o", s.opts, "-l", log, "-w", "start").CombinedOutput(); err != nil {
		text, _ := os.ReadFile(log)
		return fmt.Errorf("pgserver: pg_ctl start: %w\n%s\n%s", err, out, text)
	}
	return nil
}

// Remove stops the server at once and deletes its directory.
func (s *Server) Remove() {
	_ = s.run("pg_ctl", "-D", s.data, "-m", "immediate", "stop").Run()
	_ = os.RemoveAll(s.dir)
}

func (s *Server) run(name string, args ...string) *exec.Cmd {
	if os.Geteuid() == 0 {
		return exec.Command("runuser", append([]string{"-u", "postgres", "--", filepath.Join(s.bin, name)}, args...)...)
	}
	return exec.Command(filepath.Join(s.bin, name), args...)
}

// own gives the directory to the postgres user when running as root.
func (s *Server) own() error {
	if os.Geteuid() != 0 {
		return nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		return fmt.Errorf("pgserver: no postgres user: %w", err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	return os.Chown(s.dir, uid, gid)
}
