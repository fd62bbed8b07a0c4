package guard_test

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"io"
	"slices"
	"testing"

	"github.com/cacheguard/cacheguard/guard"
)

// fakeDriver answers every query with the IDs of its DSN's table, then
// failAt's error if set; it counts the rows still open.
type fakeDriver struct {
	ids    []string
	failAt int // yield an error instead of row failAt (-1: none)
	open   int
	read   int // rows handed to database/sql
}

var errRowsBroke = errors.New("the connection broke mid-result")

func (d *fakeDriver) Open(string) (driver.Conn, error)             { return fakeConn{d}, nil }
func (d *fakeDriver) Connect(context.Context) (driver.Conn, error) { return fakeConn{d}, nil }
func (d *fakeDriver) Driver() driver.Driver                        { return d }

type fakeConn struct{ d *fakeDriver }

func (c fakeConn) Prepare(string) (driver.Stmt, error) { return fakeStmt(c), nil }
func (fakeConn) Close() error                          { return nil }
func (fakeConn) Begin() (driver.Tx, error)             { return nil, errors.New("no transactions") }

type fakeStmt struct{ d *fakeDriver }

func (fakeStmt) Close() error                               { return nil }
func (fakeStmt) NumInput() int                              { return 0 }
func (fakeStmt) Exec([]driver.Value) (driver.Result, error) { return nil, errors.New("no exec") }
func (s fakeStmt) Query([]driver.Value) (driver.Rows, error) {
	s.d.open++
	return &fakeRows{d: s.d}, nil
}

type fakeRows struct {
	d *fakeDriver
	i int
}

func (*fakeRows) Columns() []string { return []string{"id"} }
func (r *fakeRows) Close() error    { r.d.open--; return nil }
func (r *fakeRows) Next(dest []driver.Value) error {
	switch {
	case r.i == r.d.failAt:
		return errRowsBroke
	case r.i >= len(r.d.ids):
		return io.EOF
	}
	dest[0] = r.d.ids[r.i]
	r.i++
	r.d.read++
	return nil
}

// TestRows: Rows streams a query's IDs (a consumer that stops early reads
// no more), passes the query's and the rows' errors through, and closes
// the rows.
func TestRows(t *testing.T) {
	ctx := context.Background()
	d := &fakeDriver{ids: []string{"p1", "p2", "p3", "p4"}, failAt: -1}
	db := sql.OpenDB(d) // not Register: -count=2 would register the name twice
	defer db.Close()
	var got []string
	for id, err := range guard.Rows(db.QueryContext(ctx, "SELECT id FROM products")) {
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, id)
	}
	if !slices.Equal(got, d.ids) || d.open != 0 {
		t.Fatalf("IDs %v, %d rows open", got, d.open)
	}
	d.read = 0
	for range guard.Rows(db.QueryContext(ctx, "SELECT id FROM products")) {
		break // streaming: the rest is never read
	}
	if d.read > 1 || d.open != 0 {
		t.Fatalf("stopped after one ID: %d rows read, %d open", d.read, d.open)
	}
	d.failAt = 2
	var last error
	n := 0
	for _, err := range guard.Rows(db.QueryContext(ctx, "SELECT id FROM products")) {
		if err != nil {
			last = err
			continue
		}
		n++
	}
	if n != 2 || !errors.Is(last, errRowsBroke) || d.open != 0 {
		t.Fatalf("a result that breaks after 2 rows: %d IDs, error %v, %d open", n, last, d.open)
	}
	queryErr := errors.New("relation does not exist")
	var yields []error
	for _, err := range guard.Rows[*sql.Rows](nil, queryErr) {
		yields = append(yields, err)
	}
	if len(yields) != 1 || !errors.Is(yields[0], queryErr) {
		t.Fatalf("the query's error: yielded %v, want it once", yields)
	}
}
