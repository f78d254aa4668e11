package settings

//go:generate go run ./gen ../../README.md

import (
	"fmt"
	"strings"
	"time"
)

// TableBegin and TableEnd enclose the settings table in README.md, which go run ./internal/settings/gen
// writes from the declarations (TestReadmeTable fails when the two differ).
const (
	TableBegin = "<!-- settings table: written by `go run ./internal/settings/gen` from internal/settings/registry.go; do not edit -->"
	TableEnd   = "<!-- end of settings table -->"
)

// Table is the Markdown table of the User settings, in declaration order.
func Table() string {
	var b strings.Builder
	b.WriteString("| variable | Horovod's name | `kolo run` flag | accepts | default | meaning |\n|---|---|---|---|---|---|\n")
	code := func(s string) string {
		if s == "" {
			return ""
		}
		return "`" + s + "`"
	}
	for _, s := range All {
		if s.Who != User {
			continue
		}
		var hv []string
		for _, h := range s.Horovod {
			hv = append(hv, code(h))
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %s |\n", code(s.Name), strings.Join(hv, ", "), code(s.Flag), s.Accepts(), s.Default, s.Help)
	}
	return b.String()
}

// WithTable returns doc with the text between TableBegin and TableEnd replaced by Table.
func WithTable(doc string) (string, error) {
	i := strings.Index(doc, TableBegin)
	j := strings.Index(doc, TableEnd)
	if i < 0 || j < i {
		return "", fmt.Errorf("no settings table: want a line %q, the table, then %q", TableBegin, TableEnd)
	}
	return doc[:i] + TableBegin + "\n" + Table() + doc[j:], nil
}

// Accepts says in a few words what values the setting's parser takes: its range.
func (s *Setting) Accepts() string {
	switch s.Kind {
	case Switch:
		return "1/0, true/false, on/off, yes/no"
	case Bool:
		return "true/false, 1/0"
	case Count:
		return "an integer >= 0"
	case Fraction:
		return "a number in [0, 1]"
	case Bytes:
		return "bytes (`64MiB`, `1.5G`), at most 1 TiB"
	case Duration:
		return unitName(s.Unit) + " >= 0, or a Go duration (`5ms`)"
	case Seconds:
		return "seconds > 0"
	case Choice:
		c := strings.Join(s.Choices, ", ")
		if s.HorovodChoices != nil {
			c += "; Horovod's: " + strings.Join(s.HorovodChoices, ", ")
		}
		return c
	}
	return "text"
}

func unitName(u time.Duration) string {
	switch u {
	case time.Microsecond:
		return "microseconds"
	case time.Millisecond:
		return "milliseconds"
	}
	return "seconds"
}
