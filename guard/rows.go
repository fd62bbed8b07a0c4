package guard

import "iter"

// Rows makes the result of a one-column query a source for Rebuild (and
// Options' ID source), read as it streams, from database/sql (*sql.Rows) or
// pgx (pgx.Rows): the query's error, a Scan's or the rows' own is yielded
// and ends it. Range it once: that closes the rows.
//
//	return guard.Rows(db.QueryContext(ctx, "SELECT id FROM products"))
func Rows[R interface {
	Next() bool
	Scan(dest ...any) error
	Err() error
}](rows R, err error) iter.Seq2[string, error] {
	return func(yield func(string, error) bool) {
		if err != nil {
			yield("", err)
			return
		}
		switch c := any(rows).(type) {
		case interface{ Close() error }: // *sql.Rows
			defer c.Close()
		case interface{ Close() }: // pgx.Rows
			defer c.Close()
		}
		for rows.Next() {
			var id string
			if err := rows.Scan(&id); err != nil {
				yield("", err)
				return
			}
			if !yield(id, nil) {
				return
			}
		}
		if err := rows.Err(); err != nil {
			yield("", err)
		}
	}
}

// IDs makes a slice a source for Rebuild (and Options' ID source).
func IDs(ids []string) iter.Seq2[string, error] {
	return func(yield func(string, error) bool) {
		for _, id := range ids {
			if !yield(id, nil) {
				return
			}
		}
	}
}
