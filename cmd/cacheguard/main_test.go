package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/cacheguard/cacheguard/bloom"
	"github.com/cacheguard/cacheguard/guard"
	"github.com/cacheguard/cacheguard/internal/keyspace"
	"github.com/cacheguard/cacheguard/internal/redisserver"
	"github.com/cacheguard/cacheguard/internal/redistest"
	"github.com/cacheguard/cacheguard/internal/testcert"
)

// The CLI runs in-process (run) against private redis-server processes on
// TCP, each test its own, so REDIS_URL is what a user would type.

func tcpServer(t *testing.T, args ...string) (*redisserver.Server, string) {
	t.Helper()
	port, err := redisserver.FreePort(false)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := redisserver.Start(context.Background(), &redisserver.Options{Port: port, Args: args})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Stop() })
	return srv, net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
}

type result struct {
	code           int
	stdout, stderr string
}

func cli(t *testing.T, env map[string]string, stdin string, args ...string) result {
	t.Helper()
	var out, errOut bytes.Buffer
	code := run(context.Background(), args, func(k string) string { return env[k] }, strings.NewReader(stdin), &out, &errOut)
	return result{code, out.String(), errOut.String()}
}

func (r result) want(t *testing.T, code int, what string) {
	t.Helper()
	if r.code != code {
		t.Fatalf("%s: exit %d, want %d\nstdout: %s\nstderr: %s", what, r.code, code, r.stdout, r.stderr)
	}
}

type product struct {
	ID    string
	Name  string
	Price int
	Tags  []string
}

func TestCommandsAgainstRedis(t *testing.T) {
	srv, addr := tcpServer(t)
	env := map[string]string{"REDIS_URL": "redis://" + addr + "/0"}
	ctx := context.Background()

	cli(t, env, "", "info", "-name", "product").want(t, exitNotFound, "info before any rebuild")

	// Rebuild from a file of 1,000 IDs (blank lines and spaces ignored).
	var ids strings.Builder
	for i := 1; i <= 1000; i++ {
		fmt.Fprintf(&ids, " p%d \n", i)
		if i%100 == 0 {
			ids.WriteString("\n")
		}
	}
	file := filepath.Join(t.TempDir(), "ids.txt")
	if err := os.WriteFile(file, []byte(ids.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	r := cli(t, env, "", "-name", "product", "rebuild", file)
	r.want(t, exitOK, "rebuild")
	if !strings.Contains(r.stdout, "from 1000 IDs") {
		t.Fatalf("rebuild summary: %s", r.stdout)
	}
	// A rebuild shorter than a second shows no progress (TestProgress: a
	// longer one does).
	if strings.Contains(r.stderr, "rebuild: ") {
		t.Fatalf("progress lines for a short rebuild:\n%s", r.stderr)
	}
	// An ID that check refuses (a control byte, too long) refuses the
	// file, by its line; the filter keeps its generation.
	for _, bad := range []string{"a\x01b", strings.Repeat("k", 5000)} {
		badFile := filepath.Join(t.TempDir(), "bad.txt")
		if err := os.WriteFile(badFile, []byte(ids.String()+"\n"+bad+"\np-after\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		r := cli(t, env, "", "-name", "product", "rebuild", badFile)
		r.want(t, exitFailed, "a rebuild with an invalid ID")
		if !strings.Contains(r.stderr, "line 1012: cacheguard: invalid key") {
			t.Fatalf("the refused rebuild does not name the line:\n%s", r.stderr)
		}
		cli(t, env, "", "-name", "product", "check", "p-after").want(t, exitNotFound, "an ID after the invalid one")
	}

	r = cli(t, env, "", "info", "-name", "product")
	r.want(t, exitOK, "info")
	for _, want := range []string{"state          ready", "items added    1000", "sizing         1000000 expected items"} {
		if !strings.Contains(r.stdout, want) {
			t.Fatalf("info lacks %q:\n%s", want, r.stdout)
		}
	}

	// The application's Guard caches a value and a marker.
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	defer rdb.Close()
	g, err := guard.New(ctx, rdb, "product", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	load := func(ctx context.Context, id string) (product, error) {
		if id == "p2" {
			return product{}, guard.ErrNotFound
		}
		return product{ID: id, Name: "Desk lamp", Price: 1999, Tags: []string{"home"}}, nil
	}
	for _, id := range []string{"p1", "p2"} {
		_, _ = guard.Get(ctx, g, id, load)
	}

	r = cli(t, env, "", "-name", "product", "get", "p1")
	r.want(t, exitOK, "get a value")
	var e entry
	if err := json.Unmarshal([]byte(r.stdout), &e); err != nil {
		t.Fatalf("get output is not JSON: %v\n%s", err, r.stdout)
	}
	var v product
	if err := json.Unmarshal(e.Value, &v); err != nil || e.Kind != "value" || e.Codec != "msgpack" || e.TTLMillis <= 0 ||
		v.Name != "Desk lamp" || v.Price != 1999 || len(v.Tags) != 1 {
		t.Fatalf("get p1: %+v %+v %v", e, v, err)
	}
	r = cli(t, env, "", "-name", "product", "get", "p2")
	r.want(t, exitOK, "get a marker")
	if !strings.Contains(r.stdout, `"kind": "marker"`) {
		t.Fatalf("get p2: %s", r.stdout)
	}
	cli(t, env, "", "-name", "product", "get", "p3").want(t, exitNotFound, "get an ID with nothing cached")

	r = cli(t, env, "", "-name", "product", "check", "p1")
	r.want(t, exitOK, "check a known ID")
	if !strings.Contains(r.stdout, "filter says may exist; cache holds a value") {
		t.Fatalf("check p1: %s", r.stdout)
	}
	r = cli(t, env, "", "-name", "product", "check", "nope")
	r.want(t, exitNotFound, "check an unknown ID")
	if !strings.Contains(r.stdout, "filter says absent") {
		t.Fatalf("check nope: %s", r.stdout)
	}

	r = cli(t, env, "", "-name", "product", "invalidate", "p1", "p2")
	r.want(t, exitOK, "invalidate")
	cli(t, env, "", "-name", "product", "get", "p1").want(t, exitNotFound, "get after invalidate")
	if loads := 0; true { // the application reloads p1 at its next Get
		_, err := guard.Get(ctx, g, "p1", func(ctx context.Context, id string) (product, error) {
			loads++
			return load(ctx, id)
		})
		if err != nil || loads != 1 {
			t.Fatalf("Get after the CLI's invalidate: loads %d, %v", loads, err)
		}
	}

	// IDs from stdin, more than the filter was sized for: the rebuild
	// counts them first and sizes the filter for twice as many.
	var many strings.Builder
	for i := range 1_250_000 {
		fmt.Fprintf(&many, "q%d\n", i)
	}
	r = cli(t, env, many.String(), "-name", "product", "rebuild")
	r.want(t, exitOK, "rebuild from stdin, sized from its IDs")
	if !strings.Contains(r.stdout, "from 1250000 IDs (stdin)") || !strings.Contains(r.stdout, "sized for 2500000") {
		t.Fatalf("stdin rebuild:\n%s\n%s", r.stderr, r.stdout)
	}
	r = cli(t, env, "", "-name", "product", "info")
	r.want(t, exitOK, "info after the stdin rebuild")
	if !strings.Contains(r.stdout, "2500000 expected items") {
		t.Fatalf("info does not show the filter sized for 2,500,000 IDs:\n%s", r.stdout)
	}
	cli(t, env, "", "-name", "product", "check", "q7").want(t, exitOK, "an ID of the stdin rebuild")
	cli(t, env, "", "-name", "product", "check", "p7").want(t, exitNotFound, "an ID the stdin rebuild did not have")
	// Told to size it below the stored sizing, the rebuild is refused; with
	// -force and far too small, it fails and the filter stays.
	r = cli(t, env, many.String(), "-name", "product", "-items", "1000", "rebuild")
	r.want(t, exitUsage, "a rebuild sized below the stored sizing")
	if !strings.Contains(r.stderr, "below the stored sizing") {
		t.Fatalf("the refused rebuild does not say why:\n%s", r.stderr)
	}
	r = cli(t, env, many.String(), "-name", "product", "-items", "1000", "-force", "rebuild")
	r.want(t, exitFailed, "a rebuild that would saturate the filter")
	if !strings.Contains(r.stderr, "too small") {
		t.Fatalf("the refused rebuild does not say why:\n%s", r.stderr)
	}
	cli(t, env, "", "-name", "product", "check", "q7").want(t, exitOK, "an ID of the generation the refused rebuild kept")

	// Redis gone: a failure, not "not found".
	if err := srv.Kill(); err != nil {
		t.Fatal(err)
	}
	for _, cmd := range [][]string{{"info"}, {"check", "p1"}, {"get", "p1"}, {"invalidate", "p1"}} {
		args := append([]string{"-name", "product", "-timeout", "500ms"}, cmd...)
		cli(t, env, "", args...).want(t, exitFailed, strings.Join(cmd, " ")+" with Redis down")
	}
}

func TestUsageErrors(t *testing.T) {
	_, addr := tcpServer(t)
	env := map[string]string{"REDIS_URL": "redis://" + addr}
	for _, c := range []struct {
		args []string
		want int
	}{
		{nil, exitUsage},
		{[]string{"frobnicate", "-name", "x"}, exitUsage},
		{[]string{"info"}, exitUsage},                              // no -name
		{[]string{"-name", "x", "check"}, exitUsage},               // no ID
		{[]string{"-name", "x", "check", "a", "b"}, exitUsage},     // two IDs
		{[]string{"-name", "x", "invalidate"}, exitUsage},          // no ID
		{[]string{"-name", "x", "rebuild", "a", "b"}, exitUsage},   // two files
		{[]string{"-name", "bad name", "get", "1"}, exitUsage},     // not a Guard name
		{[]string{"-name", "x", "get", "a\x01b"}, exitUsage},       // not an ID
		{[]string{"-name", "x", "-nosuchflag", "info"}, exitUsage}, // unknown flag
		{[]string{"-name", "x", "rebuild", "/no/such/file"}, exitFailed},
		{[]string{"-h"}, exitOK},
	} {
		r := cli(t, env, "", c.args...)
		if r.code != c.want {
			t.Errorf("%q: exit %d, want %d (stderr %q)", c.args, r.code, c.want, r.stderr)
		}
		if c.want == exitUsage && !strings.Contains(r.stderr, "cacheguard") && !strings.Contains(r.stderr, "usage") {
			t.Errorf("%q: no message on stderr", c.args)
		}
	}
	bad := map[string]string{"REDIS_URL": "http://nope"}
	cli(t, bad, "", "-name", "x", "info").want(t, exitUsage, "a REDIS_URL that is not redis://")
	down := map[string]string{"REDIS_URL": "redis://127.0.0.1:1"}
	cli(t, down, "", "-name", "x", "-timeout", "300ms", "info").want(t, exitFailed, "nothing listening")
}

// TestACLUser: the command's least-privilege user of docs/usage.md
// (keyspace.ACLCommand), from REDIS_URL (and from -user with
// REDIS_PASSWORD), runs every subcommand with nothing in ACL LOG; a wrong
// password, and a prefix outside the user's keys, fail.
func TestACLUser(t *testing.T) {
	_, addr := tcpServer(t)
	ctx := context.Background()
	admin := redis.NewClient(&redis.Options{Addr: addr})
	defer admin.Close()
	if err := redistest.SetUser(ctx, admin, "ops", "cg", keyspace.ACLCommand); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{"REDIS_URL": "redis://ops:secret@" + addr}
	cli(t, env, "p1\np2\n", "-name", "product", "rebuild").want(t, exitOK, "rebuild as the ACL user")
	cli(t, env, "", "-name", "product", "check", "p1").want(t, exitOK, "check as the ACL user")
	cli(t, env, "", "-name", "product", "get", "p1").want(t, exitNotFound, "get as the ACL user")
	cli(t, env, "", "-name", "product", "invalidate", "p1", "p2").want(t, exitOK, "invalidate as the ACL user")
	cli(t, env, "p1\np2\np3\n", "-name", "product", "rebuild").want(t, exitOK, "a second rebuild (a switch) as the ACL user")
	env2 := map[string]string{"REDIS_URL": "redis://" + addr, "REDIS_PASSWORD": "secret"}
	cli(t, env2, "", "-name", "product", "-user", "ops", "info").want(t, exitOK, "-user with REDIS_PASSWORD")
	if refused, err := redistest.RefusedOn(ctx, admin, "ops"); err != nil || len(refused) != 0 {
		t.Fatalf("ACL LOG of the command's user: %v, %v", refused, err)
	}
	wrong := map[string]string{"REDIS_URL": "redis://ops:wrong@" + addr}
	cli(t, wrong, "", "-name", "product", "info").want(t, exitFailed, "a wrong password")
	other := map[string]string{"REDIS_URL": "redis://ops:secret@" + addr}
	cli(t, other, "", "-name", "product", "-prefix", "other", "info").want(t, exitFailed, "a prefix outside the user's keys")
}

// TestTLS: rediss:// to a TLS-only redis-server, trusting the test's CA
// with -tls-ca; without it the server's certificate is refused.
func TestTLS(t *testing.T) {
	dir := t.TempDir()
	testcert.Write(t, dir)
	port, err := redisserver.FreePort(false)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := redisserver.Start(context.Background(), &redisserver.Options{Args: []string{
		"--tls-port", strconv.Itoa(port),
		"--tls-cert-file", filepath.Join(dir, "server.crt"), "--tls-key-file", filepath.Join(dir, "server.key"),
		"--tls-ca-cert-file", filepath.Join(dir, "ca.crt"), "--tls-auth-clients", "no",
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Stop()
	env := map[string]string{"REDIS_URL": "rediss://localhost:" + strconv.Itoa(port)}
	ca := filepath.Join(dir, "ca.crt")
	cli(t, env, "p1\n", "-name", "product", "-tls-ca", ca, "rebuild").want(t, exitOK, "rebuild over TLS")
	r := cli(t, env, "", "-name", "product", "-tls-ca", ca, "check", "p1")
	r.want(t, exitOK, "check over TLS")
	cli(t, env, "", "-name", "product", "-timeout", time.Second.String(), "info").want(t, exitFailed, "TLS without the CA")
	plain := map[string]string{"REDIS_URL": "redis://localhost:" + strconv.Itoa(port)}
	cli(t, plain, "", "-name", "product", "-timeout", time.Second.String(), "info").want(t, exitFailed, "plain text to a TLS port")
}

func TestThousands(t *testing.T) {
	for n, want := range map[int64]string{0: "0", 999: "999", 1000: "1,000", 1234567: "1,234,567", -5: "-5"} {
		if got := thousands(n); got != want {
			t.Errorf("thousands(%d) = %q, want %q", n, got, want)
		}
	}
}

// TestDocsGiveTheIDLimit: where the docs say which IDs rebuild refuses,
// they give the limit it enforces (keyspace.MaxKeyLen).
func TestDocsGiveTheIDLimit(t *testing.T) {
	limit := thousands(keyspace.MaxKeyLen) + " bytes"
	for file, start := range map[string]string{"../../docs/operations.md": "`rebuild` takes each ID", "../../CHANGELOG.md": "`cacheguard rebuild` refuses"} {
		b, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		_, para, ok := strings.Cut(string(b), start)
		para, _, _ = strings.Cut(para, "\n\n")
		para, _, _ = strings.Cut(para, "\n- ") // the CHANGELOG's next entry
		if !ok || !strings.Contains(strings.Join(strings.Fields(para), " "), limit) {
			t.Errorf("%s: the paragraph %q... does not give the limit %q:\n%s", file, start, limit, para)
		}
	}
}

// TestRebuildRefusesAShortInput: an empty input (what a failed
// `psql ... | cacheguard rebuild` pipe gives) or one cut short would make
// existing IDs answer "not found": rebuild refuses both and the filter
// keeps answering; -force goes ahead. No command warns about sizing that
// the user never gave.
func TestRebuildRefusesAShortInput(t *testing.T) {
	_, addr := tcpServer(t)
	env := map[string]string{"REDIS_URL": "redis://" + addr + "/0"}
	var all strings.Builder
	for i := range 1000 {
		fmt.Fprintf(&all, "p%d\n", i)
	}
	cli(t, env, all.String(), "-name", "user", "rebuild").want(t, exitOK, "rebuild from 1,000 IDs")
	for _, in := range []struct{ name, ids, says string }{
		{"empty", "", "no IDs in stdin"},
		{"blank lines only", "\n\n \n", "no IDs in stdin"},
		{"truncated", all.String()[:all.Len()/4], "fewer than half"},
	} {
		r := cli(t, env, in.ids, "-name", "user", "rebuild")
		r.want(t, exitFailed, in.name+" input")
		if !strings.Contains(r.stderr, in.says) && !strings.Contains(r.stderr, "far fewer IDs") {
			t.Fatalf("%s input: stderr does not say why:\n%s", in.name, r.stderr)
		}
		for _, id := range []string{"p1", "p2", "p100", "p999"} {
			cli(t, env, "", "-name", "user", "check", id).want(t, exitOK, id+" after the refused "+in.name+" rebuild")
		}
	}
	r := cli(t, env, "", "-name", "user", "info")
	r.want(t, exitOK, "info")
	if strings.Contains(r.stderr, "sized otherwise") || strings.Contains(r.stdout, "-0") {
		t.Fatalf("info:\n%s\n%s", r.stdout, r.stderr)
	}
	cli(t, env, "", "-name", "user", "-force", "rebuild").want(t, exitOK, "an empty rebuild with -force")
	cli(t, env, "", "-name", "user", "check", "p1").want(t, exitNotFound, "p1 after the forced empty rebuild")
	r = cli(t, env, "", "-name", "user", "info")
	if !strings.Contains(r.stdout, "estimated from the bits: 0)") {
		t.Fatalf("info of an empty filter:\n%s", r.stdout)
	}
}

// TestProgress: as lines, a rebuild that has run for a second shows one per
// tenth of its IDs and the upload; a shorter one shows none.
func TestProgress(t *testing.T) {
	for _, slow := range []bool{false, true} {
		var buf bytes.Buffer
		p := newProgress("lines", &buf, 1000)
		if slow {
			p.start = p.start.Add(-quietFor)
		}
		for range p.count(guard.IDs(make([]string, 1000))) {
		}
		p.upload(bloom.RebuildProgress{BytesUploaded: 10, BytesTotal: 10})
		p.done(nil)
		n := strings.Count(buf.String(), "rebuild: read ")
		if slow && (n != 10 || !strings.Contains(buf.String(), "1,000 of 1,000 IDs (100%)") || !strings.Contains(buf.String(), "rebuild: uploaded")) ||
			!slow && buf.Len() != 0 {
			t.Errorf("slow %v: %d lines:\n%s", slow, n, buf.String())
		}
	}
}

// TestRebuildExec: -exec runs the ID query once the rebuild has begun, so an
// ID created after the query (and Added) is in the new filter; a list taken
// before the rebuild began misses it (the control: stdin). A failing
// command and one that prints nothing leave the filter as it was.
func TestRebuildExec(t *testing.T) {
	ctx := context.Background()
	_, addr := tcpServer(t)
	env := map[string]string{"REDIS_URL": "redis://" + addr + "/0"}
	var list strings.Builder
	for i := range 1000 {
		fmt.Fprintf(&list, "p%d\n", i)
	}
	cli(t, env, list.String(), "-name", "user", "rebuild").want(t, exitOK, "rebuild from stdin")
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	defer rdb.Close()
	g, err := guard.New(ctx, rdb, "user", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()

	// The control: the list is taken, then late1 is created and added, then
	// the rebuild runs from the list.
	if err := g.Add(ctx, "late1"); err != nil {
		t.Fatal(err)
	}
	cli(t, env, list.String(), "-name", "user", "rebuild").want(t, exitOK, "rebuild from a list taken before late1")
	cli(t, env, "", "-name", "user", "check", "late1").want(t, exitNotFound, "late1 after a rebuild from a list taken before it")

	// -exec: the command has begun (its query taken) when late2 is created
	// and added; it prints the list after.
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "list"), []byte(list.String()), 0o644)
	script := fmt.Sprintf("touch %[1]s/began; while [ ! -e %[1]s/added ]; do sleep 0.01; done; cat %[1]s/list", dir)
	done := make(chan result, 1)
	go func() { done <- cli(t, env, "", "-name", "user", "-exec", script, "rebuild") }()
	for _, err := os.Stat(filepath.Join(dir, "began")); err != nil; _, err = os.Stat(filepath.Join(dir, "began")) {
		time.Sleep(10 * time.Millisecond) // polling for the command to begin
	}
	if err := g.Add(ctx, "late2"); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(dir, "added"), nil, 0o644)
	r := <-done
	r.want(t, exitOK, "rebuild -exec")
	if !strings.Contains(r.stdout, "from 1000 IDs (-exec)") {
		t.Fatalf("stdout: %s", r.stdout)
	}
	for _, id := range []string{"late2", "p0", "p999"} {
		cli(t, env, "", "-name", "user", "check", id).want(t, exitOK, id+" after rebuild -exec")
	}

	for _, bad := range []struct{ script, says string }{{"exit 3", "exit status 3"}, {"true", "printed no IDs"}} {
		r := cli(t, env, "", "-name", "user", "-exec", bad.script, "rebuild")
		r.want(t, exitFailed, "rebuild -exec "+bad.script)
		if !strings.Contains(r.stderr, bad.says) {
			t.Fatalf("-exec %q: stderr does not say %q:\n%s", bad.script, bad.says, r.stderr)
		}
		cli(t, env, "", "-name", "user", "check", "late2").want(t, exitOK, "late2 after the refused -exec "+bad.script)
	}
	cli(t, env, "", "-name", "user", "-exec", "true", "rebuild", "ids.txt").want(t, exitUsage, "-exec and a file")
	cli(t, env, "", "-name", "user", "-exec", "true", "info").want(t, exitUsage, "-exec with info")
}
