package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/cacheguard/cacheguard/guard"
)

// Exit codes.
const (
	exitOK       = 0
	exitFailed   = 1
	exitUsage    = 2
	exitNotFound = 3
)

const usage = `usage: cacheguard [flags] <command> [args]

commands:
  info                   the filter: generation, sizing, fill, estimated false-positive rate, memory
  rebuild [file]         rebuild the filter from IDs, one per line: from -exec's command, run once the
                         rebuild has begun, or from a file (stdin when no file is given), which misses
                         the IDs created between the list being taken and the rebuild beginning
  check <id>             what the filter and the cache say of one ID
  get <id>               the cached entry of one ID, decoded to JSON, with its TTL
  invalidate <id>...     drop the cached entries of IDs (loads in flight do not store theirs)

connection: REDIS_URL (redis://[user:password@]host:port/db, rediss:// for TLS),
or -addr, -user and REDIS_PASSWORD.
exit codes: 0 done, 1 failed, 2 usage, 3 not found.

flags:
`

// config is what the flags and the environment say.
type config struct {
	name, prefix, version string
	url, addr, user       string
	cluster               bool
	tlsCA                 string
	timeout               time.Duration
	items                 uint64
	fpRate                float64
	force                 bool
	progress              string
	exec                  string
}

// usageError is a mistake in the command line (exit code 2).
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

// notFound is an answer that the thing asked for does not exist (exit 3).
type notFound struct{ msg string }

func (e *notFound) Error() string { return e.msg }

// run is the command: args without the program name, env for the
// environment; it returns the exit code.
func run(ctx context.Context, args []string, env func(string) string, stdin io.Reader, stdout, stderr io.Writer) int {
	var c config
	fs := flag.NewFlagSet("cacheguard", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, usage)
		fs.PrintDefaults()
	}
	fs.StringVar(&c.name, "name", "", "the Guard's name, as passed to guard.New (required)")
	fs.StringVar(&c.prefix, "prefix", "cg", "the Guard's KeyPrefix")
	fs.StringVar(&c.version, "version", "1", "the Guard's Options.Version (get shows the entry of this version)")
	fs.StringVar(&c.addr, "addr", "", "Redis address host:port (default: REDIS_URL, else localhost:6379)")
	fs.StringVar(&c.user, "user", "", "Redis ACL user (password from REDIS_PASSWORD)")
	fs.BoolVar(&c.cluster, "cluster", false, "Redis Cluster: REDIS_URL is a cluster URL (redis://host:port?addr=host2:port), -addr a comma-separated list")
	fs.StringVar(&c.tlsCA, "tls-ca", "", "PEM file of a CA to trust for TLS (rediss://)")
	fs.DurationVar(&c.timeout, "timeout", 5*time.Second, "bound on each command (rebuild: on each round trip)")
	fs.Uint64Var(&c.items, "items", 0, "the filter's ExpectedItems (default: the stored sizing; rebuild grows it to twice the IDs when they outgrow it)")
	fs.Float64Var(&c.fpRate, "fp-rate", 0, "the filter's FalsePositiveRate (default: the stored one)")
	fs.BoolVar(&c.force, "force", false, "rebuild: go ahead with an empty input, fewer than half the IDs the filter holds, or a sizing below the stored one")
	fs.StringVar(&c.exec, "exec", "", "rebuild: run this shell command once the rebuild has begun and take its output as the IDs "+
		"(e.g. \"psql -At -c 'SELECT id FROM products'\"): an ID created meanwhile is in its output or added to the new filter")
	fs.StringVar(&c.progress, "progress", "auto", "rebuild: progress as a bar (bar), as lines (lines), none, or auto (a bar on a terminal, else lines)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitOK
		}
		return exitUsage
	}
	c.url = env("REDIS_URL")
	cmd, rest := fs.Arg(0), fs.Args()
	if len(rest) > 0 { // flags may follow the command too: cacheguard info -name product
		if err := fs.Parse(rest[1:]); err != nil {
			return exitUsage
		}
		rest = fs.Args()
	}
	err := dispatch(ctx, &c, cmd, rest, env, stdin, stdout, stderr)
	var ue *usageError
	var nf *notFound
	switch {
	case err == nil:
		return exitOK
	case errors.As(err, &ue):
		fmt.Fprintln(stderr, message(err))
		fmt.Fprintln(stderr, "run cacheguard -h for the commands and flags")
		return exitUsage
	case errors.As(err, &nf):
		fmt.Fprintln(stderr, message(err))
		return exitNotFound
	}
	fmt.Fprintln(stderr, message(err))
	return exitFailed
}

// message is err for stderr, prefixed once with the program's name (the
// library's errors already start with "cacheguard: ").
func message(err error) string {
	if m := err.Error(); strings.HasPrefix(m, "cacheguard: ") {
		return m
	}
	return "cacheguard: " + err.Error()
}

func dispatch(ctx context.Context, c *config, cmd string, args []string, env func(string) string, stdin io.Reader, stdout, stderr io.Writer) error {
	want := func(min, max int, what string) error {
		if len(args) < min || (max >= 0 && len(args) > max) {
			return &usageError{fmt.Sprintf("%s: want %s", cmd, what)}
		}
		return nil
	}
	var err error
	switch cmd {
	case "":
		return &usageError{"no command"}
	case "info":
		err = want(0, 0, "no arguments")
	case "rebuild":
		err = want(0, 1, "at most one file (stdin when none)")
		if c.exec != "" {
			err = want(0, 0, "no file with -exec (its command's output is the input)")
		}
	case "check", "get":
		err = want(1, 1, "one ID")
	case "invalidate":
		err = want(1, -1, "one or more IDs")
	default:
		return &usageError{fmt.Sprintf("unknown command %q", cmd)}
	}
	if err == nil && c.exec != "" && cmd != "rebuild" {
		err = &usageError{"-exec is rebuild's"}
	}
	if err != nil {
		return err
	}
	if c.name == "" {
		return &usageError{"-name is required (the Guard's name, as passed to guard.New)"}
	}
	rdb, err := c.client(env)
	if err != nil {
		return err
	}
	defer rdb.Close()
	switch cmd {
	case "info":
		return info(ctx, c, rdb, stdout)
	case "rebuild":
		return rebuild(ctx, c, rdb, args, stdin, stdout, stderr)
	case "check":
		return check(ctx, c, rdb, args[0], stdout)
	case "get":
		return get(ctx, c, rdb, args[0], stdout)
	}
	return invalidate(ctx, c, rdb, args, stdout)
}

// client connects as the flags and REDIS_URL say.
func (c *config) client(env func(string) string) (redis.UniversalClient, error) {
	var tlsConf *tls.Config
	if c.tlsCA != "" {
		pem, err := os.ReadFile(c.tlsCA)
		if err != nil {
			return nil, err
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("-tls-ca %s: no PEM certificate in it", c.tlsCA)
		}
		tlsConf = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	}
	password := env("REDIS_PASSWORD")
	if c.cluster {
		var o *redis.ClusterOptions
		switch {
		case c.addr != "":
			o = &redis.ClusterOptions{Addrs: strings.Split(c.addr, ",")}
		case c.url != "":
			var err error
			if o, err = redis.ParseClusterURL(c.url); err != nil {
				return nil, &usageError{fmt.Sprintf("REDIS_URL: %v", err)}
			}
		default:
			return nil, &usageError{"-cluster needs REDIS_URL or -addr"}
		}
		c.connection(&o.Username, &o.Password, &o.TLSConfig, &o.ReadTimeout, &o.WriteTimeout, password, tlsConf)
		o.ContextTimeoutEnabled, o.DialerRetries = true, 1 // -timeout holds, as the guard asks
		return redis.NewClusterClient(o), nil
	}
	var o *redis.Options
	switch {
	case c.addr != "":
		o = &redis.Options{Addr: c.addr}
	case c.url != "":
		var err error
		if o, err = redis.ParseURL(c.url); err != nil {
			return nil, &usageError{fmt.Sprintf("REDIS_URL: %v", err)}
		}
	default:
		o = &redis.Options{Addr: "localhost:6379"}
	}
	c.connection(&o.Username, &o.Password, &o.TLSConfig, &o.ReadTimeout, &o.WriteTimeout, password, tlsConf)
	o.ContextTimeoutEnabled, o.DialerRetries = true, 1 // -timeout holds, as the guard asks
	return redis.NewClient(o), nil
}

// connection lays -user, REDIS_PASSWORD, -tls-ca and -timeout over the
// fields of either client's options (what REDIS_URL set stays otherwise).
func (c *config) connection(user, pass *string, tlsc **tls.Config, rt, wt *time.Duration, password string, tlsConf *tls.Config) {
	if c.user != "" {
		*user = c.user
	}
	if password != "" {
		*pass = password
	}
	if tlsConf != nil {
		*tlsc = withServerName(tlsConf, *tlsc)
	}
	*rt, *wt = c.timeout, c.timeout
}

// withServerName is conf trusting -tls-ca, with the server name that
// rediss:// parsing set (or none: then Go uses the dialled host).
func withServerName(conf, fromURL *tls.Config) *tls.Config {
	c := conf.Clone()
	if fromURL != nil {
		c.ServerName = fromURL.ServerName
	}
	return c
}

// open opens the Guard. The commands that only look (info, check) ask
// first whether its filter exists, so that they never create one.
func (c *config) open(ctx context.Context, rdb redis.UniversalClient, mustExist bool) (*guard.Guard, error) {
	if mustExist {
		ks, err := c.keys()
		if err != nil {
			return nil, err
		}
		n, err := rdb.Exists(ctx, ks.Filter().Meta()).Result()
		if err != nil {
			return nil, fmt.Errorf("redis: %w", err)
		}
		if n == 0 {
			return nil, &notFound{fmt.Sprintf("no Guard %q under prefix %q (no filter at %s; check -name and -prefix)", c.name, c.prefix, ks.Filter().Meta())}
		}
	}
	// No sizing: the Guard takes the stored layout (rebuild resizes it).
	g, err := guard.New(ctx, rdb, c.name, &guard.Options{KeyPrefix: c.prefix, Version: c.version, Tuning: guard.Tuning{RedisTimeout: c.timeout}})
	if err != nil {
		if errors.Is(err, guard.ErrInvalidOptions) {
			return nil, &usageError{err.Error()}
		}
		return nil, err
	}
	return g, nil
}
