// Package scripttest replays the scenario scripts of kolo's pure state machines (internal/engine/negotiate,
// internal/launch/elastic): text files of blocks, each some command lines (and # comments), a "----" line,
// then the expected output up to a blank line. A package supplies only its commands; the format,
// the comparison and -rewrite (write back what the code prints now) live here once.
package scripttest

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// Block is one block of a script.
type Block struct {
	Cmds     []string // verbatim, comments included
	Line     int      // of the first command
	Expected []string
}

// Parse splits a script into its blocks.
func Parse(t testing.TB, text string) []Block {
	t.Helper()
	var blocks []Block
	lines := strings.Split(strings.TrimRight(text, "\n"), "\n")
	for i := 0; i < len(lines); {
		b := Block{Line: i + 1}
		for i < len(lines) && lines[i] != "----" {
			b.Cmds = append(b.Cmds, lines[i])
			i++
		}
		if i == len(lines) {
			if strings.TrimSpace(strings.Join(b.Cmds, "")) != "" {
				t.Fatalf("line %d: commands with no ---- after them", b.Line)
			}
			break
		}
		i++ // ----
		for i < len(lines) && lines[i] != "" {
			b.Expected = append(b.Expected, lines[i])
			i++
		}
		if i < len(lines) {
			i++ // the blank line that ends the block
		}
		blocks = append(blocks, b)
	}
	return blocks
}

// Uncomment drops a trailing "# comment" from a command line.
func Uncomment(line string) string {
	if i := strings.Index(line, "#"); i >= 0 {
		return line[:i]
	}
	return line
}

// RunDir runs every dir/*.txt script as a subtest, each with a fresh exec from newExec.
func RunDir(t *testing.T, dir string, rewrite bool, newExec func(t *testing.T) func(line string) ([]string, error)) {
	files, err := filepath.Glob(filepath.Join(dir, "*.txt"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no scenarios in %s: %v", dir, err)
	}
	for _, f := range files {
		t.Run(strings.TrimSuffix(filepath.Base(f), ".txt"), func(t *testing.T) { Run(t, f, rewrite, newExec(t)) })
	}
}

// Run replays the script at path: exec runs one command line (comment lines and blank lines are
// skipped; a trailing comment is exec's to drop, with Uncomment, since some commands quote '#')
// and returns what it printed, which must equal the block's expected output. With rewrite, the
// file is written back with the output the code produces now.
func Run(t *testing.T, path string, rewrite bool, exec func(line string) ([]string, error)) {
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var rewritten strings.Builder
	for bi, b := range Parse(t, string(data)) {
		var out []string
		for k, raw := range b.Cmds {
			if s := strings.TrimSpace(raw); s == "" || strings.HasPrefix(s, "#") {
				continue
			}
			got, err := exec(raw)
			if err != nil {
				t.Fatalf("%s:%d: %s: %v", path, b.Line+k, strings.TrimSpace(raw), err)
			}
			out = append(out, got...)
		}
		if rewrite {
			if bi > 0 {
				rewritten.WriteString("\n")
			}
			for _, c := range b.Cmds {
				rewritten.WriteString(c + "\n")
			}
			rewritten.WriteString("----\n")
			for _, o := range out {
				rewritten.WriteString(o + "\n")
			}
			continue
		}
		if !slices.Equal(out, b.Expected) {
			t.Errorf("%s:%d: output differs\ncommands:\n%s\ngot:\n%s\nwant:\n%s", path, b.Line,
				strings.Join(b.Cmds, "\n"), strings.Join(out, "\n"), strings.Join(b.Expected, "\n"))
		}
	}
	if rewrite {
		if err := os.WriteFile(path, []byte(rewritten.String()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}
