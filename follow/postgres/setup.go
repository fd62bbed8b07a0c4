package pgfollow

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
)

// What PostgreSQL needs (Setup creates the last two):
//
//	wal_level = logical                  in postgresql.conf, then a restart
//	ALTER ROLE <role> REPLICATION;       the follower's role
//	CREATE PUBLICATION <pub> FOR TABLE <tables> WITH (publish_via_partition_root = true);
//	SELECT pg_create_logical_replication_slot('<slot>', 'pgoutput');
//
// Each followed table needs its key column in its replica identity (the
// primary key by default, or REPLICA IDENTITY FULL / USING INDEX), so that
// a DELETE sends the key. Publishing via the partition root sends a
// partitioned table's changes under its own name, the one followed.

// connect opens a replication connection (replication=database). A role
// without REPLICATION is an ErrSetup.
func (f *Follower) connect(ctx context.Context) (*pgconn.PgConn, error) {
	cfg, err := pgconn.ParseConfig(f.conn)
	if err != nil {
		return nil, fmt.Errorf("%w: connection string: %w", ErrSetup, err)
	}
	cfg.RuntimeParams["replication"] = "database"
	conn, err := pgconn.ConnectConfig(ctx, cfg)
	var pe *pgconn.PgError
	if errors.As(err, &pe) && pe.Code == "42501" { // insufficient_privilege: no WAL sender for this role
		return nil, fmt.Errorf("%w: role %s cannot replicate (%s): ALTER ROLE %s REPLICATION", ErrSetup, cfg.User, pe.Message, ident(cfg.User))
	}
	return conn, err
}

// check verifies the set-up and returns each table's key column.
func (f *Follower) check(ctx context.Context, conn *pgconn.PgConn) (map[string]string, error) {
	rows, err := query(ctx, conn, "SHOW wal_level")
	if err != nil {
		return nil, err
	}
	if len(rows) != 1 || rows[0][0] != "logical" {
		return nil, fmt.Errorf("%w: wal_level is not logical (%v): ALTER SYSTEM SET wal_level = logical; then restart PostgreSQL", ErrSetup, rows)
	}
	slot, pub := f.opts.Slot, f.opts.Publication
	// wal_status (PostgreSQL 13+), conflicting (16+) and invalidation_reason
	// (17+) say whether the slot was invalidated; older servers have none.
	if rows, err = query(ctx, conn, "SELECT plugin, j->>'wal_status', j->>'conflicting', j->>'invalidation_reason' "+
		"FROM pg_replication_slots s, to_jsonb(s) j WHERE slot_name = "+literal(slot)); err != nil {
		return nil, err
	}
	if len(rows) > 0 && (rows[0][1] == "lost" || rows[0][2] == "true" || rows[0][3] != "") {
		why := "wal_status " + rows[0][1]
		if rows[0][2] == "true" {
			why += ", conflicting"
		}
		if rows[0][3] != "" {
			why += ", invalidation_reason " + rows[0][3]
		}
		return nil, slotLost(slot, "was invalidated by PostgreSQL ("+why+"; max_slot_wal_keep_size bounds the WAL a slot keeps)")
	}
	if len(rows) == 0 && f.followedBefore(ctx) {
		return nil, slotLost(slot, "was dropped (a Guard's Redis holds a position of it)")
	}
	if len(rows) == 0 {
		return nil, fmt.Errorf("%w: no replication slot %s: run the follower's command with -create, or "+
			"SELECT pg_create_logical_replication_slot('%s', 'pgoutput')", ErrSetup, slot, slot)
	}
	if rows[0][0] != "pgoutput" {
		return nil, fmt.Errorf("%w: replication slot %s uses plugin %s, not pgoutput: follow another slot, or drop this one "+
			"and run the follower's command with -create: SELECT pg_drop_replication_slot('%s')", ErrSetup, slot, rows[0][0], slot)
	}
	if rows, err = query(ctx, conn, "SELECT pubinsert AND pubupdate AND pubdelete AND pubtruncate, pubviaroot FROM pg_publication WHERE pubname = "+
		literal(pub)); err != nil {
		return nil, err
	}
	if len(rows) == 0 {
		return nil, fmt.Errorf("%w: no publication %s: run the follower's command with -create, or CREATE PUBLICATION %s FOR TABLE %s %s",
			ErrSetup, pub, ident(pub), strings.Join(f.quoted(), ", "), viaRoot)
	}
	if rows[0][0] != "t" {
		return nil, fmt.Errorf("%w: publication %s does not publish every kind of change: "+
			"ALTER PUBLICATION %s SET (publish = 'insert, update, delete, truncate')", ErrSetup, pub, ident(pub))
	}
	keys := map[string]string{}
	for _, name := range f.names() {
		t := f.tables[name]
		key, err := f.checkTable(ctx, conn, t, rows[0][1] == "t")
		if err != nil {
			return nil, err
		}
		keys[name] = key
	}
	return keys, nil
}

// checkTable checks that t is published under its own name (a partitioned
// table needs the publication's viaRoot) and that its key is in its replica
// identity, and returns the key column.
func (f *Follower) checkTable(ctx context.Context, conn *pgconn.PgConn, t *Table, viaRoot bool) (string, error) {
	schema, table, _ := strings.Cut(t.Name, ".")
	rows, err := query(ctx, conn, fmt.Sprintf(`SELECT c.oid, c.relreplident, c.relkind,
		  (SELECT count(*) FROM pg_publication_tables p WHERE p.pubname = %s AND p.schemaname = n.nspname AND p.tablename = c.relname)
		FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE n.nspname = %s AND c.relname = %s AND c.relkind IN ('r', 'p')`, literal(f.opts.Publication), literal(schema), literal(table)))
	if err != nil {
		return "", err
	}
	if len(rows) == 0 {
		return "", fmt.Errorf("%w: no table %s", ErrSetup, t.Name)
	}
	oid, replident, kind, published := rows[0][0], rows[0][1], rows[0][2], rows[0][3]
	pub := f.opts.Publication
	switch {
	case published == "0" && kind == "p" && !viaRoot:
		return "", fmt.Errorf("%w: table %s is partitioned and publication %s sends its changes under the partitions' names: "+
			"ALTER PUBLICATION %s SET (publish_via_partition_root = true)", ErrSetup, t.Name, pub, ident(pub))
	case published == "0":
		return "", fmt.Errorf("%w: table %s is not in publication %s: ALTER PUBLICATION %s ADD TABLE %s",
			ErrSetup, t.Name, pub, ident(pub), quoted(t.Name))
	}
	columns := func(where string) ([]string, error) {
		rows, err := query(ctx, conn, "SELECT a.attname FROM pg_attribute a WHERE a.attrelid = "+oid+
			" AND a.attnum > 0 AND NOT a.attisdropped"+where+" ORDER BY a.attnum")
		names := make([]string, len(rows))
		for i, r := range rows {
			names[i] = r[0]
		}
		return names, err
	}
	inIndex := func(which string) string {
		return " AND a.attnum = ANY (SELECT unnest(i.indkey) FROM pg_index i WHERE i.indrelid = " + oid + " AND i." + which + ")"
	}
	pk, err := columns(inIndex("indisprimary"))
	if err != nil {
		return "", err
	}
	key := t.Key
	if key == "" {
		if len(pk) != 1 {
			return "", fmt.Errorf("%w: table %s has no one-column primary key (%v): set Table.Key to its key column, "+
				"and put that in its replica identity (FULL, or USING INDEX a unique index on it): ALTER TABLE %s REPLICA IDENTITY FULL",
				ErrSetup, t.Name, pk, quoted(t.Name))
		}
		key = pk[0]
	}
	var identity []string
	switch replident {
	case "d":
		identity = pk
	case "i":
		identity, err = columns(inIndex("indisreplident"))
	case "f":
		identity, err = columns("")
	}
	if err != nil {
		return "", err
	}
	if !slices.Contains(identity, key) {
		return "", fmt.Errorf("%w: column %s of table %s is not in its replica identity (%v), so a DELETE would not send it "+
			"(FULL, or USING INDEX a unique index on it): ALTER TABLE %s REPLICA IDENTITY FULL", ErrSetup, key, t.Name, identity, quoted(t.Name))
	}
	return key, nil
}

// Setup creates the publication (or adds the missing tables to it) and
// the replication slot, as a role that may (the table owner with
// REPLICATION, or a superuser). The publication sends a partitioned table's
// changes under its own name (publish_via_partition_root, set on one made
// before). Changes committed before the slot exists are not followed.
func Setup(ctx context.Context, conn string, opts *Options, tables ...string) error {
	f := &Follower{conn: conn, tables: map[string]*Table{}}
	if opts != nil {
		f.opts = *opts
	}
	if err := f.opts.resolve(); err != nil {
		return err
	}
	for _, t := range tables {
		f.tables[qualified(t)] = nil
	}
	c, err := f.connect(ctx)
	if err != nil {
		return err
	}
	defer c.Close(context.WithoutCancel(ctx))
	pub := f.opts.Publication
	rows, err := query(ctx, c, "SELECT pubviaroot FROM pg_publication WHERE pubname = "+literal(pub))
	if err != nil {
		return err
	}
	quoted := f.quoted()
	switch {
	case len(rows) == 0:
		_, err = query(ctx, c, "CREATE PUBLICATION "+ident(pub)+" FOR TABLE "+strings.Join(quoted, ", ")+" "+viaRoot)
	case rows[0][0] != "t":
		_, err = query(ctx, c, "ALTER PUBLICATION "+ident(pub)+" SET (publish_via_partition_root = true)")
	}
	if err == nil && len(rows) > 0 {
		for i, name := range f.names() {
			schema, table, _ := strings.Cut(name, ".")
			rows, err = query(ctx, c, fmt.Sprintf("SELECT 1 FROM pg_publication_tables WHERE pubname = %s AND schemaname = %s AND tablename = %s",
				literal(pub), literal(schema), literal(table)))
			if err == nil && len(rows) == 0 {
				_, err = query(ctx, c, "ALTER PUBLICATION "+ident(pub)+" ADD TABLE "+quoted[i])
			}
			if err != nil {
				break
			}
		}
	}
	if err != nil {
		return fmt.Errorf("pgfollow: publication %s: %w", pub, grants(ctx, c, quoted, err))
	}
	if rows, err = query(ctx, c, "SELECT 1 FROM pg_replication_slots WHERE slot_name = "+literal(f.opts.Slot)); err != nil || len(rows) > 0 {
		return err
	}
	return createSlot(ctx, c, f.opts.Slot)
}

// grants turns PostgreSQL's refusal to make or change the publication
// (insufficient_privilege) into an ErrSetup that gives the grants: CREATE
// on the database, and ownership of each table published.
func grants(ctx context.Context, c *pgconn.PgConn, tables []string, err error) error {
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || pe.Code != "42501" {
		return err
	}
	who, qerr := query(ctx, c, "SELECT current_database(), current_user")
	if qerr != nil || len(who) != 1 || len(who[0]) != 2 {
		return fmt.Errorf("%w: %s: the role needs CREATE on the database and to own the tables", ErrSetup, pe.Message)
	}
	db, role := ident(who[0][0]), ident(who[0][1])
	fix := []string{"GRANT CREATE ON DATABASE " + db + " TO " + role}
	for _, t := range tables {
		fix = append(fix, "ALTER TABLE "+t+" OWNER TO "+role)
	}
	return fmt.Errorf("%w: %s: a publication is made by a role with CREATE on the database that owns its tables "+
		"(or run -create once as a superuser): %s", ErrSetup, pe.Message, strings.Join(fix, "; "))
}

// createSlot creates a pgoutput slot: it keeps the changes from now on.
func createSlot(ctx context.Context, c *pgconn.PgConn, slot string) error {
	_, err := pglogrepl.CreateReplicationSlot(ctx, c, slot, "pgoutput", pglogrepl.CreateReplicationSlotOptions{
		Mode: pglogrepl.LogicalReplication, SnapshotAction: "NOEXPORT_SNAPSHOT",
	})
	if err != nil {
		return fmt.Errorf("pgfollow: replication slot %s: %w", slot, err)
	}
	return nil
}

// slotLost is the error of a lost slot: why, and how to recover.
func slotLost(slot, why string) error {
	return fmt.Errorf("%w: slot %s %s; the changes committed since the follower last confirmed its position are gone: "+
		"its tables' Guards may serve stale values and a false \"not found\" to their TTL. To recover, Follower.Recover "+
		"(cacheguard-pgfollow -recover) makes the slot anew, then drops the tables' entries and rebuilds their filters", ErrSlotLost, slot, why)
}

// Recover mends a lost slot (ErrSlotLost): it drops the slot, if any, and
// creates it anew first, so the changes from then on are kept; then, for
// what the lost changes did, it drops every entry of each followed table's
// Guard and rebuilds its filter from the table's keys. Call it while no
// follower consumes the slot; Run then follows from the new slot.
func (f *Follower) Recover(ctx context.Context) error {
	c, err := f.connect(ctx)
	if err != nil {
		return err
	}
	defer c.Close(context.WithoutCancel(ctx))
	err = pglogrepl.DropReplicationSlot(ctx, c, f.opts.Slot, pglogrepl.DropReplicationSlotOptions{})
	var pe *pgconn.PgError
	if err != nil && !(errors.As(err, &pe) && pe.Code == "42704") { // undefined_object: no slot to drop
		return fmt.Errorf("pgfollow: dropping replication slot %s: %w", f.opts.Slot, err)
	}
	if err := createSlot(ctx, c, f.opts.Slot); err != nil {
		return err
	}
	if f.keys, err = f.check(ctx, c); err != nil {
		return err
	}
	confirmed, err := f.confirmed(ctx, c)
	if err != nil {
		return err
	}
	f.mem, f.memChanges, f.memFrom = nil, 0, 0 // the new slot's positions are not comparable with the old one's
	for _, h := range f.held {
		for _, t := range h.tables {
			if err := f.reset(ctx, t, "slot made anew"); err != nil {
				return err
			}
		}
		// The Guards now agree with the tables as of the new slot's start.
		at, err := h.e.Position(ctx, f.feed())
		if err == nil {
			_, err = h.e.SetPosition(ctx, f.feed(), at, uint64(confirmed))
		}
		if err != nil {
			return fmt.Errorf("pgfollow: recovering: setting the position in redis: %w", err)
		}
	}
	return nil
}

// DropSlot drops the replication slot, so the server stops keeping WAL
// for it (a follower that stays down keeps it all). A follower started
// afterwards needs a new slot, and misses the changes in between.
func DropSlot(ctx context.Context, conn, slot string) error {
	if !identifier(slot) {
		return fmt.Errorf("%w: slot %q must be lower-case letters, digits and _", ErrOptions, slot)
	}
	c, err := (&Follower{conn: conn}).connect(ctx)
	if err != nil {
		return err
	}
	defer c.Close(context.WithoutCancel(ctx))
	return pglogrepl.DropReplicationSlot(ctx, c, slot, pglogrepl.DropReplicationSlotOptions{})
}

// names are the followed tables, sorted.
func (f *Follower) names() []string {
	names := make([]string, 0, len(f.tables))
	for n := range f.tables {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// quoted are the followed tables, sorted, as SQL names.
func (f *Follower) quoted() []string {
	names := f.names()
	for i, n := range names {
		names[i] = quoted(n)
	}
	return names
}

// quoted is a "schema.table" name as SQL.
func quoted(name string) string {
	schema, table, _ := strings.Cut(name, ".")
	return ident(schema) + "." + ident(table)
}

// viaRoot is the publication option under which a partitioned table's
// changes come under its own name, not its partitions'.
const viaRoot = "WITH (publish_via_partition_root = true)"

// query runs sql (simple protocol: a replication connection takes no
// parameters) and returns its rows as text.
func query(ctx context.Context, conn *pgconn.PgConn, sql string) ([][]string, error) {
	results, err := conn.Exec(ctx, sql).ReadAll()
	if err != nil {
		return nil, err
	}
	var rows [][]string
	for _, r := range results {
		for _, row := range r.Rows {
			cols := make([]string, len(row))
			for i, c := range row {
				cols[i] = string(c)
			}
			rows = append(rows, cols)
		}
	}
	return rows, nil
}

// literal quotes s as an SQL string (standard_conforming_strings, on by
// default since PostgreSQL 9.1).
func literal(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

// ident quotes s as an SQL identifier.
func ident(s string) string { return `"` + strings.ReplaceAll(s, `"`, `""`) + `"` }
