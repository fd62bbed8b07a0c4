package guard_test

import (
	"context"
	"flag"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/cacheguard/cacheguard/guard"
	"github.com/cacheguard/cacheguard/internal/keyspace"
	"github.com/cacheguard/cacheguard/internal/redisserver"
)

// The cluster pass. `make test` runs every test of this package against
// the package's standalone redis-server, then runs it again with
// CG_TEST_CLUSTER=1 against a 3-master, 3-replica Redis Cluster. That second
// pass runs only the tests whose first statement is clusterToo(t): those
// whose behaviour can differ on a Cluster (keys and slots of multi-key
// scripts and pipelines, the filter's shards, SCAN over every master, write
// marks per slot, pub/sub wakes, Rebuild, processes meeting on one key).
// A test of in-process logic (options, the local cache, codecs, one
// process's flights, logging) or on servers of its own (redistest.Private,
// ownCluster) leaves it out: the standalone pass covers it, and the
// cluster pass would repeat it. Leaving it out never drops a test from
// make test; it drops it from the cluster pass alone.
//
// TestMain finds the marked tests in this directory's source (a call
// anywhere else, in a helper or a subtest, is not seen: clusterToo fails
// the test then) and sets -test.run to them, unless -run was given: then
// CG_TEST_CLUSTER=1 go test -run TestX ./guard runs TestX on a cluster,
// marked or not.

// clusterToo marks t (a Test function, calling it first) to run in the
// cluster pass as well; see above.
func clusterToo(t *testing.T) {
	t.Helper()
	name, _, _ := strings.Cut(t.Name(), "/")
	marked, err := clusterTests()
	if err != nil {
		t.Fatal(err)
	}
	if name != t.Name() || !slices.Contains(marked, name) {
		t.Fatalf("clusterToo(t) must be the first statement of the Test function itself (%s): "+
			"TestMain selects the cluster pass from the source", t.Name())
	}
}

// clusterTests lists the Test functions of this directory whose first
// statement is clusterToo(t).
var clusterTests = sync.OnceValues(func() ([]string, error) {
	files, err := filepath.Glob("*_test.go")
	if err != nil || len(files) == 0 {
		return nil, fmt.Errorf("cluster pass: no test source in the working directory (%v)", err)
	}
	var names []string
	fset := token.NewFileSet()
	for _, f := range files {
		file, err := parser.ParseFile(fset, f, nil, parser.SkipObjectResolution)
		if err != nil {
			return nil, fmt.Errorf("cluster pass: %w", err)
		}
		for _, d := range file.Decls {
			fn, ok := d.(*ast.FuncDecl)
			if !ok || fn.Recv != nil || !strings.HasPrefix(fn.Name.Name, "Test") || len(fn.Body.List) == 0 {
				continue
			}
			if st, ok := fn.Body.List[0].(*ast.ExprStmt); ok {
				if call, ok := st.X.(*ast.CallExpr); ok {
					if id, ok := call.Fun.(*ast.Ident); ok && id.Name == "clusterToo" {
						names = append(names, fn.Name.Name)
					}
				}
			}
		}
	}
	if len(names) == 0 {
		return nil, fmt.Errorf("cluster pass: no test calls clusterToo(t)")
	}
	slices.Sort(names)
	return names, nil
})

// selectClusterPass sets -test.run to the tests marked clusterToo, unless
// the command line chose tests itself. TestMain calls it in cluster mode.
func selectClusterPass() {
	flag.Parse()
	if flag.Lookup("test.run").Value.String() != "" {
		return
	}
	names, err := clusterTests()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	if err := flag.Set("test.run", "^("+strings.Join(names, "|")+")$"); err != nil {
		fmt.Fprintln(os.Stderr, "cluster pass:", err)
		os.Exit(2)
	}
}

// ownCluster starts a 3-master cluster of the test's own, replicas per
// master, stopped when it ends, and runs t in parallel with the other slow
// tests (in the standalone pass: its test is not clusterToo).
func ownCluster(t *testing.T, replicas int) *redisserver.Cluster {
	t.Parallel() // its own keys or servers: runs beside the other slow ones
	cl, err := redisserver.StartCluster(context.Background(), 3, replicas)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Stop)
	return cl
}

// TestIdleGuardRepairsLostWritesOnACluster: a master of a 3-master
// cluster is SIGKILLed and restarts from a dump older than the writer's
// Invalidates; the writer, idle, replays those of that master's slots
// (their old entries deleted) with no Get.
func TestIdleGuardRepairsLostWritesOnACluster(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a cluster and restarts a master")
	}
	ctx := context.Background()
	cl := ownCluster(t, 0)
	rdb := redis.NewClusterClient(cl.Options())
	defer rdb.Close()
	const n = 30
	d := newDB(n)
	h := hooked(rdb)
	g := openRebuilt(t, rdb, guard.Options{}, 1000, n)
	names := make([]string, n)
	for i := range names {
		names[i] = pid(i)
	}
	cache(t, g, d, names...)
	if err := rdb.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error { return c.Save(ctx).Err() }); err != nil {
		t.Fatal(err)
	}
	for _, id := range names {
		d.set(product{ID: id, Name: "changed " + id, Price: 1000})
		if err := g.Invalidate(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	keys := keyspace.ForGuard("cg", "product", 128) // the default KeyPrefix
	p0, _ := keys.Value("p0")
	master, err := rdb.MasterForKey(ctx, p0)
	if err != nil {
		t.Fatal(err)
	}
	i := slices.IndexFunc(cl.Nodes, func(s *redisserver.Server) bool { return s.Addr == master.Options().Addr })
	h.watchOff.Store(true) // until the old entries are seen back
	crash(t, cl.Nodes[i])
	back := time.Now()
	// old counts the entries Redis holds, and the keys it did not answer for.
	old := func() (held, failed int) {
		for _, id := range names {
			k, _ := keys.Value(id)
			switch e, err := rdb.Exists(ctx, k).Result(); {
			case err != nil:
				failed++
			case e != 0:
				held++
			}
		}
		return held, failed
	}
	eventually(t, 10*time.Second, "the restarted master answering", func() bool { h, f := old(); return h > 0 && f == 0 })
	if held, _ := old(); held == n {
		t.Fatalf("all %d old entries back: the other masters lost the Invalidates too", n)
	}
	answered := time.Now()
	h.watchOff.Store(false)
	eventually(t, 20*time.Second, "the old entries deleted without a Get", func() bool { h, f := old(); return h == 0 && f == 0 })
	t.Logf("repaired %v after the master restarted, %v after it answered",
		time.Since(back).Round(time.Millisecond), time.Since(answered).Round(time.Millisecond))
	if st := g.Stats(); st.WritesLost == 0 || st.WritesLost == n {
		t.Fatalf("WritesLost %d: want the Invalidates of the restarted master's slots alone", st.WritesLost)
	}
}
