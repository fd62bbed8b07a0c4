package main

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"iter"
	"os"
	"strings"
)

// lines yields the non-blank lines of r, trimmed; the first that check
// refuses ends them with an error naming its line.
func lines(r io.Reader, check func(id string) error) iter.Seq2[string, error] {
	return func(yield func(string, error) bool) {
		sc := bufio.NewScanner(r)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for n := 1; sc.Scan(); n++ {
			id := strings.TrimSpace(sc.Text())
			if id == "" {
				continue
			}
			if err := check(id); err != nil {
				yield("", fmt.Errorf("line %d: %w", n, err))
				return
			}
			if !yield(id, nil) {
				return
			}
		}
		if err := sc.Err(); err != nil {
			yield("", fmt.Errorf("reading IDs: %w", err))
		}
	}
}

// countLines counts the non-blank lines of r (for the progress total and
// the filter's sizing).
func countLines(r io.Reader) (int64, error) {
	var n int64
	br := bufio.NewReaderSize(r, 1<<20)
	for {
		line, err := br.ReadSlice('\n')
		if len(bytes.TrimSpace(line)) > 0 {
			n++
		}
		switch {
		case err == nil:
		case errors.Is(err, bufio.ErrBufferFull):
			// a line longer than the buffer: count it once, skip its rest
			for errors.Is(err, bufio.ErrBufferFull) {
				_, err = br.ReadSlice('\n')
			}
			if err != nil && !errors.Is(err, io.EOF) {
				return 0, err
			}
			if errors.Is(err, io.EOF) {
				return n, nil
			}
		case errors.Is(err, io.EOF):
			return n, nil
		default:
			return 0, err
		}
	}
}

func bytesText(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}

// spool copies r into a temporary file (removed by the caller) and returns
// it, so that stdin can be counted before it is read for the rebuild.
func spool(r io.Reader) (*os.File, error) {
	f, err := os.CreateTemp("", "cacheguard-ids-*")
	if err != nil {
		return nil, err
	}
	_, err = io.Copy(f, r)
	if err == nil {
		_, err = f.Seek(0, io.SeekStart)
	}
	if err != nil {
		f.Close()
		os.Remove(f.Name())
		return nil, fmt.Errorf("reading IDs: %w", err)
	}
	return f, nil
}
