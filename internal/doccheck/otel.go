package doccheck

import (
	"fmt"
	"regexp"
	"sort"
	"strings"
)

var otelName = regexp.MustCompile(`^cacheguard\.[A-Za-z_][A-Za-z0-9_.]*$`)

// CheckOTel: the OpenTelemetry names the docs quote (spans, instruments,
// attributes: `cacheguard.gets`) are string literals of guard's telemetry,
// and each of those is quoted somewhere.
func CheckOTel(docs []*Doc, files map[string][]string) (problems []string, checked int) {
	lit := regexp.MustCompile(`"(cacheguard\.[A-Za-z_][A-Za-z0-9_.]*)"`)
	code := map[string]string{}
	for f, lines := range files {
		if !strings.HasPrefix(f, "guard/") || strings.HasSuffix(f, "_test.go") || strings.Count(f, "/") != 1 {
			continue
		}
		for i, l := range lines {
			for _, m := range lit.FindAllStringSubmatch(l, -1) {
				code[m[1]] = At(f, i+1)
			}
		}
	}
	quoted := map[string]bool{}
	for _, d := range docs {
		for _, s := range d.Spans {
			if !otelName.MatchString(s.Text) {
				continue
			}
			checked++
			quoted[s.Text] = true
			if code[s.Text] == "" {
				problems = append(problems, fmt.Sprintf("%s: OpenTelemetry name %s: guard's code has no such name (it has %s)",
					At(s.Path, s.Line), s.Text, strings.Join(keys(code), ", ")))
			}
		}
	}
	for _, n := range keys(code) {
		if !quoted[n] {
			problems = append(problems, fmt.Sprintf("%s: OpenTelemetry name %s is named in no code span of the docs", code[n], n))
		}
	}
	return problems, checked
}

func keys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
