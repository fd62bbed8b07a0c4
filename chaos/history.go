package chaos

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
)

// Op is one recorded operation.
type Op struct {
	Proc string `json:"p"`             // the process and its incarnation ("s0.2"), "sql" for the writer in SQL, "seed"
	Kind string `json:"k"`             // Read, Intent, Write or UnknownLoad
	Via  string `json:"via,omitempty"` // a read's entry point, a write's Guard call
	ID   string `json:"id"`            // AllIDs for a TRUNCATE
	// Ver: a write's version (every write draws one from one sequence, so
	// an ID's versions rise in commit order; 0: it changed nothing); a
	// read's answer, NotFound for "not found".
	Ver    int64  `json:"v"`
	Exists bool   `json:"e,omitempty"` // a write: the row exists after it
	Start  int64  `json:"s"`           // unix nanoseconds: one machine, one clock
	End    int64  `json:"t,omitempty"`
	LSN    uint64 `json:"l,omitempty"` // a write: the WAL position read after its commit (0: unknown)
	// Err: a read's failure (Err503 for a 503: ErrUnconfirmed or
	// ErrUnavailable); a committed write's Guard call that failed (its
	// effect then dates from the follower's confirmation); Outside for a
	// write made in SQL, which only the follower reports.
	Err string `json:"er,omitempty"`
}

// Kinds of Op, answers and errors.
const (
	Read        = "r" // a read: Ver is its answer
	Intent      = "i" // a write about to commit (a process killed before its Write leaves only this)
	Write       = "w" // a committed write
	UnknownLoad = "u" // the loader was called for an ID that never existed
	NotFound    = -1
	Err503      = "503"
	Outside     = "outside"
	AllIDs      = "*"
)

// Recorder appends Ops to a file, one write(2) per Op, so that a process
// SIGKILLed loses none it recorded.
type Recorder struct {
	proc string
	mu   sync.Mutex // guards f and buf
	f    *os.File
	buf  []byte
}

// NewRecorder opens (appending) the history file of process proc.
func NewRecorder(path, proc string) (*Recorder, error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return nil, err
	}
	return &Recorder{proc: proc, f: f}, nil
}

// Record appends o, with the recorder's process.
func (r *Recorder) Record(o Op) {
	o.Proc = r.proc
	line, _ := json.Marshal(o) // Op always encodes
	r.mu.Lock()
	defer r.mu.Unlock()
	r.buf = append(append(r.buf[:0], line...), '\n')
	_, _ = r.f.Write(r.buf)
}

// Close closes the file.
func (r *Recorder) Close() error { return r.f.Close() }

// ReadHistory reads the Ops of a history file. A last line cut short by a
// SIGKILL mid-write is dropped.
func ReadHistory(path string) ([]Op, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var ops []Op
	r := bufio.NewReaderSize(f, 1<<20)
	for {
		line, err := r.ReadBytes('\n')
		if errors.Is(err, io.EOF) {
			return ops, nil // an unterminated last line is a write a SIGKILL cut
		}
		if err != nil {
			return nil, err
		}
		var o Op
		if err := json.Unmarshal(line, &o); err != nil {
			return nil, fmt.Errorf("%s: %w: %q", path, err, line)
		}
		ops = append(ops, o)
	}
}
