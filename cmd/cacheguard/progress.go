package main

import (
	"fmt"
	"io"
	"iter"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/cacheguard/cacheguard/bloom"
)

// progress shows a rebuild's progress on w once it has run for quietFor: a
// bar redrawn in place on a terminal (with rate and ETA), plain lines
// otherwise (logs and CI keep every line: one per tenth of the input when
// its size is known, else one per 100,000 IDs; one per quarter of the upload).
type progress struct {
	w     io.Writer
	mode  string // bar, lines or none
	total int64  // IDs in the input, or -1 when unknown (stdin)
	start time.Time

	mu       sync.Mutex // guards the fields below: the ID count and the upload are reported from Rebuild's goroutines
	ids      int64
	lastDraw time.Time
	nextLine int64 // lines: the ID count of the next line
	upStep   int   // lines: the quarter of the upload reported last
	drawn    bool  // bar: a bar is on screen (end it with a newline)
}

// quietFor: a rebuild that ends sooner shows no progress, only its result.
const quietFor = time.Second

func newProgress(mode string, w io.Writer, total int64) *progress {
	if mode == "auto" {
		mode = "lines"
		if f, ok := w.(*os.File); ok && isTerminal(f) {
			mode = "bar"
		}
	}
	now := time.Now()
	p := &progress{w: w, mode: mode, total: total, start: now, lastDraw: now.Add(quietFor - 100*time.Millisecond)} // the first bar at quietFor
	p.nextLine = p.lineStep()
	return p
}

func isTerminal(f *os.File) bool {
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

func (p *progress) lineStep() int64 {
	if p.total > 0 {
		return max(p.total/10, 1)
	}
	return 100_000
}

// count passes ids through, counting them.
func (p *progress) count(ids iter.Seq2[string, error]) iter.Seq2[string, error] {
	return func(yield func(string, error) bool) {
		for id, err := range ids {
			if err == nil {
				p.add()
			}
			if !yield(id, err) {
				return
			}
		}
	}
}

func (p *progress) add() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.ids++
	switch p.mode {
	case "bar":
		if now := time.Now(); now.Sub(p.lastDraw) >= 100*time.Millisecond {
			p.lastDraw = now
			p.drawBar()
		}
	case "lines":
		if p.ids >= p.nextLine {
			p.nextLine += p.lineStep()
			if time.Since(p.start) >= quietFor {
				fmt.Fprintf(p.w, "rebuild: read %s\n", p.status())
			}
		}
	}
}

// status is "520,000 of 1,000,000 IDs (52%), 410,000 IDs/s, ETA 1s".
func (p *progress) status() string {
	el := time.Since(p.start).Seconds()
	rate := float64(p.ids) / max(el, 1e-9)
	if p.total <= 0 {
		return fmt.Sprintf("%s IDs, %s IDs/s", thousands(p.ids), thousands(int64(rate)))
	}
	eta := time.Duration(float64(p.total-p.ids) / max(rate, 1e-9) * float64(time.Second)).Round(time.Second)
	return fmt.Sprintf("%s of %s IDs (%d%%), %s IDs/s, ETA %v", thousands(p.ids), thousands(p.total),
		100*p.ids/p.total, thousands(int64(rate)), eta)
}

func (p *progress) drawBar() {
	const width = 30
	bar := strings.Repeat("·", width)
	if p.total > 0 {
		done := int(int64(width) * min(p.ids, p.total) / p.total)
		bar = strings.Repeat("█", done) + strings.Repeat("·", width-done)
	}
	fmt.Fprintf(p.w, "\r\x1b[K%s %s", bar, p.status())
	p.drawn = true
}

// upload is bloom.RebuildOptions.Progress: the IDs are read, the bitmap
// goes up.
func (p *progress) upload(r bloom.RebuildProgress) {
	if r.BytesTotal == 0 || time.Since(p.start) < quietFor {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	pct := 100 * r.BytesUploaded / r.BytesTotal
	switch p.mode {
	case "bar":
		if p.drawn {
			fmt.Fprintln(p.w)
			p.drawn = false
		}
		fmt.Fprintf(p.w, "\r\x1b[Kuploading the filter: %s of %s (%d%%)", bytesText(int64(r.BytesUploaded)), bytesText(int64(r.BytesTotal)), pct)
		if r.BytesUploaded == r.BytesTotal {
			fmt.Fprintln(p.w)
		}
	case "lines":
		if step := int(4 * r.BytesUploaded / r.BytesTotal); step > p.upStep || r.BytesUploaded == r.BytesTotal {
			p.upStep = step
			fmt.Fprintf(p.w, "rebuild: uploaded %s of %s (%d%%)\n", bytesText(int64(r.BytesUploaded)), bytesText(int64(r.BytesTotal)), pct)
		}
	}
}

// done ends the display.
func (p *progress) done(err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.mode == "bar" && p.drawn {
		p.drawBar()
		fmt.Fprintln(p.w)
	}
	if err != nil && p.mode != "none" && p.ids > 0 {
		fmt.Fprintf(p.w, "rebuild: failed after reading %s IDs\n", thousands(p.ids))
	}
}

// thousands writes n with thousands separators: 1,000,000.
func thousands(n int64) string {
	s := fmt.Sprint(n)
	if n < 0 {
		return s
	}
	var b strings.Builder
	for i, r := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(r)
	}
	return b.String()
}
