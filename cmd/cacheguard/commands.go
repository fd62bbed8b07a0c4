package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/cacheguard/cacheguard/bloom"
	"github.com/cacheguard/cacheguard/codec"
	"github.com/cacheguard/cacheguard/guard"
	"github.com/cacheguard/cacheguard/internal/keyspace"
)

// keys names the Guard's Redis keys, after checking -name and -prefix.
func (c *config) keys() (keyspace.Guard, error) {
	if !keyspace.ValidName(c.name) {
		return keyspace.Guard{}, &usageError{fmt.Sprintf("-name %q: letters, digits, '_', '-', '.' only", c.name)}
	}
	if !keyspace.ValidPrefix(c.prefix) {
		return keyspace.Guard{}, &usageError{fmt.Sprintf("-prefix %q is not a valid KeyPrefix", c.prefix)}
	}
	return keyspace.ForGuard(c.prefix, c.name, keyspace.MaxKeyLen), nil
}

// withGuard opens the Guard (see open), runs fn with it under -timeout,
// and closes it.
func (c *config) withGuard(ctx context.Context, rdb redis.UniversalClient, mustExist bool, fn func(ctx context.Context, g *guard.Guard) error) error {
	g, err := c.open(ctx, rdb, mustExist)
	if err != nil {
		return err
	}
	defer g.Close()
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	return fn(ctx, g)
}

// info prints the filter as Guard.Info reads it.
func info(ctx context.Context, c *config, rdb redis.UniversalClient, stdout io.Writer) error {
	return c.withGuard(ctx, rdb, true, func(ctx context.Context, g *guard.Guard) error { return printInfo(ctx, c, g, stdout) })
}

func printInfo(ctx context.Context, c *config, g *guard.Guard, stdout io.Writer) error {
	in, err := g.Info(ctx)
	if err != nil {
		return err
	}
	state := "ready"
	switch {
	case !in.Ready:
		state = "not ready (never rebuilt, or lost by Redis): until a rebuild, Gets of IDs a Guard's copy of the filter has not seen " +
			"answer ErrUnconfirmed (503), the others load (all load in a Guard with no copy: NoLocalCopy)"
	case in.Rebuilding:
		state = "ready; a rebuild is under way"
	}
	w := bufio.NewWriter(stdout)
	fmt.Fprintf(w, "guard          %s (prefix %s)\n", c.name, c.prefix)
	fmt.Fprintf(w, "state          %s\n", state)
	fmt.Fprintf(w, "generation     %d\n", in.Generation)
	fmt.Fprintf(w, "sizing         %d expected items at a %.4g false-positive rate: %d bits, %d hashes, %d shards\n",
		in.Config.ExpectedItems, in.Config.FalsePositiveRate, in.Config.Bits, in.Config.Hashes, in.Config.Shards)
	fmt.Fprintf(w, "items added    %d (estimated from the bits: %.0f)\n", in.Added, in.EstimatedItems)
	fmt.Fprintf(w, "fill           %.2f%% of the bits set\n", 100*in.FillRatio)
	fmt.Fprintf(w, "est. FP rate   %.4g\n", in.EstimatedFPRate)
	fmt.Fprintf(w, "memory         %s\n", bytesText(in.MemoryBytes))
	return w.Flush()
}

// check prints what the filter says of id, and what the cache holds.
func check(ctx context.Context, c *config, rdb redis.UniversalClient, id string, stdout io.Writer) error {
	return c.withGuard(ctx, rdb, true, func(ctx context.Context, g *guard.Guard) error { return checkID(ctx, c, rdb, g, id, stdout) })
}

func checkID(ctx context.Context, c *config, rdb redis.UniversalClient, g *guard.Guard, id string, stdout io.Writer) error {
	maybe, err := g.MayExist(ctx, id)
	if errors.Is(err, guard.ErrInvalidKey) {
		return &usageError{err.Error()}
	}
	if err != nil {
		return err
	}
	e, err := c.entry(ctx, rdb, id)
	if err != nil {
		return err
	}
	filter := "may exist"
	if !maybe {
		filter = "absent"
	}
	fmt.Fprintf(stdout, "%s: filter says %s; cache holds %s\n", id, filter, e.describe())
	if !maybe {
		return &notFound{fmt.Sprintf("%s: the filter says absent", id)}
	}
	return nil
}

// entry is what the cache holds for an ID.
type entry struct {
	ID        string          `json:"id"`
	Key       string          `json:"key"`
	Field     string          `json:"field"`
	Kind      string          `json:"kind"` // value, marker or none
	TTLMillis int64           `json:"ttl_ms,omitempty"`
	Codec     string          `json:"codec,omitempty"`
	RefreshAt *time.Time      `json:"refresh_at,omitempty"`
	Value     json.RawMessage `json:"value,omitempty"`
	Note      string          `json:"note,omitempty"`
}

func (e entry) describe() string {
	switch e.Kind {
	case "value":
		return fmt.Sprintf("a value (TTL %v)", time.Duration(e.TTLMillis)*time.Millisecond)
	case "marker":
		return fmt.Sprintf("a not-found marker (TTL %v)", time.Duration(e.TTLMillis)*time.Millisecond)
	}
	return "nothing"
}

// entry reads id's value key and its TTL in one round trip, picks the field
// of the Guard's Version (each shape of the value type has its own:
// "version:shape"), and decodes the frame with the codec that wrote it.
func (c *config) entry(ctx context.Context, rdb redis.UniversalClient, id string) (entry, error) {
	ks, err := c.keys()
	if err != nil {
		return entry{}, err
	}
	vkey, err := ks.Value(id)
	if err != nil {
		return entry{}, &usageError{err.Error()}
	}
	e := entry{ID: id, Key: vkey, Field: c.version, Kind: "none"}
	pipe := rdb.Pipeline()
	all := pipe.HGetAll(ctx, vkey)
	pttl := pipe.PTTL(ctx, vkey)
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return entry{}, fmt.Errorf("redis: %w", err)
	}
	var fields []string
	for f := range all.Val() {
		if f == c.version || strings.HasPrefix(f, c.version+":") {
			fields = append(fields, f)
		}
	}
	if len(fields) == 0 {
		return e, nil
	}
	slices.Sort(fields)
	e.Field = fields[0]
	raw := []byte(all.Val()[e.Field])
	if len(fields) > 1 {
		e.Note = fmt.Sprintf("%d shapes of the value type are cached (fields %s); showing the first", len(fields), strings.Join(fields, ", "))
	}
	if d := pttl.Val(); d > 0 {
		e.TTLMillis = d.Milliseconds()
	}
	if at, ok := codec.RefreshAt(raw); ok {
		e.RefreshAt = &at
	}
	for _, cd := range []struct {
		name string
		c    codec.Codec
	}{{"msgpack", codec.Msgpack}, {"json", codec.JSON}} {
		var v any
		switch err := codec.Decode(cd.c, raw, &v); {
		case errors.Is(err, codec.ErrEmpty):
			e.Kind = "marker"
			return e, nil
		case err == nil:
			b, err := json.Marshal(jsonable(v))
			if err != nil {
				return entry{}, fmt.Errorf("%s: the value does not convert to JSON: %w", id, err)
			}
			e.Kind, e.Codec, e.Value = "value", cd.name, b
			return e, nil
		}
	}
	e.Kind, e.Note = "value", fmt.Sprintf("written by a codec this tool does not know (%d bytes); raw bytes not shown", len(raw))
	return e, nil
}

// jsonable turns what msgpack decodes into something encoding/json takes
// (maps with non-string keys become maps with string keys).
func jsonable(v any) any {
	switch t := v.(type) {
	case map[string]any:
		for k, x := range t {
			t[k] = jsonable(x)
		}
		return t
	case map[any]any:
		m := make(map[string]any, len(t))
		for k, x := range t {
			m[fmt.Sprint(k)] = jsonable(x)
		}
		return m
	case []any:
		for i, x := range t {
			t[i] = jsonable(x)
		}
		return t
	}
	return v
}

// get prints id's cached entry as JSON.
func get(ctx context.Context, c *config, rdb redis.UniversalClient, id string, stdout io.Writer) error {
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	e, err := c.entry(ctx, rdb, id)
	if err != nil {
		return err
	}
	b, _ := json.MarshalIndent(e, "", "  ")
	fmt.Fprintf(stdout, "%s\n", b)
	if e.Kind == "none" {
		return &notFound{fmt.Sprintf("%s: nothing cached at %s (field %s)", id, e.Key, e.Field)}
	}
	return nil
}

// invalidate drops the IDs' entries through Guard.Invalidate.
func invalidate(ctx context.Context, c *config, rdb redis.UniversalClient, ids []string, stdout io.Writer) error {
	return c.withGuard(ctx, rdb, false, func(ctx context.Context, g *guard.Guard) error {
		if err := g.Invalidate(ctx, ids...); err != nil {
			if errors.Is(err, guard.ErrInvalidKey) {
				return &usageError{err.Error()}
			}
			return err
		}
		fmt.Fprintf(stdout, "invalidated %d ID(s)\n", len(ids))
		return nil
	})
}

// rebuild rebuilds the filter from the IDs in args[0] (or stdin), one per
// line; blank lines are skipped and surrounding spaces trimmed. Without
// -force it refuses an empty input (a failed query piped in), a sizing
// below the stored one, and (the library's rule) fewer than half the IDs
// the filter holds.
func rebuild(ctx context.Context, c *config, rdb redis.UniversalClient, args []string, stdin io.Reader, stdout, stderr io.Writer) error {
	if c.exec != "" {
		return rebuildExec(ctx, c, rdb, stdout, stderr)
	}
	// The IDs are counted before the rebuild, to size the filter for them
	// (unless -items says otherwise); stdin is spooled to a file first.
	source := "stdin"
	var f *os.File
	if len(args) == 1 && args[0] != "-" {
		var err error
		if f, err = os.Open(args[0]); err != nil {
			return err
		}
		source = args[0]
	} else {
		var err error
		if f, err = spool(stdin); err != nil {
			return err
		}
		defer os.Remove(f.Name())
	}
	defer f.Close()
	total, err := countLines(f)
	if err != nil {
		return err
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return err
	}
	in := io.Reader(f)
	if total == 0 && !c.force {
		return fmt.Errorf("rebuild: no IDs in %s; a filter rebuilt from none answers \"not found\" for every ID "+
			"(-force if that is what you want)", source)
	}
	g, err := c.open(ctx, rdb, false)
	if err != nil {
		return err
	}
	defer g.Close()
	opts, err := c.sizing(ctx, g, uint64(total))
	if err != nil {
		return err
	}
	p := newProgress(c.progress, stderr, total)
	opts.Progress = p.upload
	start := time.Now()
	// Each ID as check and a Guard's Get take it: a file with one they refuse
	// is refused whole, by its line.
	valid := keyspace.ForGuard(c.prefix, c.name, keyspace.MaxKeyLen).Check
	n, err := g.Rebuild(ctx, p.count(lines(in, valid)), opts)
	p.done(err)
	if err != nil {
		return err
	}
	took := time.Since(start)
	fmt.Fprintf(stdout, "rebuilt %s (prefix %s) from %d IDs (%s) in %v (%.0f IDs/s), sized for %d\n",
		c.name, c.prefix, n, source, took.Round(time.Millisecond), float64(n)/took.Seconds(), opts.ExpectedItems)
	return nil
}

// rebuildExec rebuilds the filter from the output of c.exec, run by sh once
// the rebuild has announced the next generation (Guard.Rebuild reads its
// source after that): an ID created before the command's query is in its
// output, one created after it is added to both generations. A list taken
// before the rebuild began misses the IDs created in between: they would
// answer "not found" (the chaos run, seed 1, found one such ID). The
// filter keeps its stored sizing unless -items says otherwise (the IDs
// are not counted first). A command that fails, or prints no ID without
// -force, leaves the filter as it was.
func rebuildExec(ctx context.Context, c *config, rdb redis.UniversalClient, stdout, stderr io.Writer) error {
	g, err := c.open(ctx, rdb, false)
	if err != nil {
		return err
	}
	defer g.Close()
	opts, err := c.sizing(ctx, g, 0)
	if err != nil {
		return err
	}
	p := newProgress(c.progress, stderr, -1)
	opts.Progress = p.upload
	valid := keyspace.ForGuard(c.prefix, c.name, keyspace.MaxKeyLen).Check
	ids := func(yield func(string, error) bool) {
		cmd := exec.CommandContext(ctx, "sh", "-c", c.exec)
		cmd.Stderr = stderr
		out, err := cmd.StdoutPipe()
		if err == nil {
			err = cmd.Start()
		}
		if err != nil {
			yield("", fmt.Errorf("-exec: %w", err))
			return
		}
		defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }() // a refused or abandoned read
		n := 0
		for id, err := range lines(out, valid) {
			if !yield(id, err) || err != nil {
				return
			}
			n++
		}
		switch err := cmd.Wait(); {
		case err != nil:
			yield("", fmt.Errorf("-exec %q: %w", c.exec, err))
		case n == 0 && !c.force:
			yield("", fmt.Errorf("rebuild: -exec %q printed no IDs; a filter rebuilt from none answers \"not found\" "+
				"for every ID (-force if that is what you want)", c.exec))
		}
	}
	start := time.Now()
	n, err := g.Rebuild(ctx, p.count(ids), opts)
	p.done(err)
	if err != nil {
		return err
	}
	took := time.Since(start)
	fmt.Fprintf(stdout, "rebuilt %s (prefix %s) from %d IDs (-exec) in %v (%.0f IDs/s), sized for %d\n",
		c.name, c.prefix, n, took.Round(time.Millisecond), float64(n)/took.Seconds(), opts.ExpectedItems)
	return nil
}

// sizing is the rebuild's: -items and -fp-rate as given, else the stored
// layout, grown to twice the IDs when they outgrow it (room for the IDs
// created next). A sizing below the stored one needs -force.
func (c *config) sizing(ctx context.Context, g *guard.Guard, ids uint64) (*bloom.RebuildOptions, error) {
	opts := &bloom.RebuildOptions{ExpectedItems: c.items, FalsePositiveRate: c.fpRate, Force: c.force}
	cur, err := g.Info(ctx)
	if err != nil {
		return nil, err
	}
	stored := cur.Config.ExpectedItems
	switch {
	case c.items > 0 && c.items < stored && !c.force:
		return nil, &usageError{fmt.Sprintf("-items %d is below the stored sizing (%d): the filter would fill up "+
			"as IDs are created (-force if that is what you want)", c.items, stored)}
	case c.items == 0 && ids > stored:
		opts.ExpectedItems = 2 * ids
	case c.items == 0:
		opts.ExpectedItems = stored
	}
	return opts, nil
}
