package guard_test

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestGuaranteesNameTheirTests: the Test functions docs/guarantees.md names
// exist (somewhere in the repository), and its Bounded row names those of a
// frozen Redis: the guard's Peek and writes, the adapters' requests.
func TestGuaranteesNameTheirTests(t *testing.T) {
	doc, err := os.ReadFile("../docs/guarantees.md")
	if err != nil {
		t.Fatal(err)
	}
	var src strings.Builder
	err = filepath.WalkDir("..", func(path string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() && (strings.HasSuffix(path, "_test.go") || strings.HasSuffix(path, "adaptertest.go")) {
			b, err := os.ReadFile(path)
			src.Write(b)
			return err
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range regexp.MustCompile("`(Test[A-Za-z0-9_]+)`").FindAllStringSubmatch(string(doc), -1) {
		if !strings.Contains(src.String(), "func "+m[1]+"(") {
			t.Errorf("docs/guarantees.md names %s, which no test defines", m[1])
		}
	}
	_, row, _ := strings.Cut(string(doc), "| **Bounded**")
	row, _, _ = strings.Cut(row, "\n")
	for name, def := range map[string]string{
		"`TestFrozenRedisBoundsPeekAndWrites`": "func TestFrozenRedisBoundsPeekAndWrites(",
		"`TestAdapter/FrozenRedisIsBounded`":   `t.Run("FrozenRedisIsBounded"`,
	} {
		if !strings.Contains(row, name) || !strings.Contains(src.String(), def) {
			t.Errorf("the Bounded row of docs/guarantees.md does not name %s, or no test defines it", name)
		}
	}
}
