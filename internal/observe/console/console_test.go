package console

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// screen is a fake terminal: it interprets what the Console writes (text, CR, LF, cursor up, erase
// below) into the lines a user would see, so tests check the screen, not the byte stream.
type screen struct {
	width    int
	tty      bool
	rows     [][]rune
	row, col int
	raw      bytes.Buffer
}

func newScreen(width int, tty bool) *screen {
	return &screen{width: width, tty: tty, rows: [][]rune{nil}}
}

func (s *screen) Width() (int, bool) { return s.width, s.tty }

func (s *screen) Write(p []byte) (int, error) {
	s.raw.Write(p)
	text := []rune(string(p))
	for i := 0; i < len(text); i++ {
		switch r := text[i]; r {
		case '\r':
			s.col = 0
		case '\n':
			s.row++
			s.col = 0
			if s.row == len(s.rows) {
				s.rows = append(s.rows, nil)
			}
		case 0x1b:
			j := i + 2 // ESC [ params final
			for j < len(text) && (text[j] >= '0' && text[j] <= '9') {
				j++
			}
			n := 1
			if j > i+2 {
				n, _ = strconv.Atoi(string(text[i+2 : j]))
			}
			switch text[j] {
			case 'A':
				s.row = max(0, s.row-n)
			case 'J': // erase from the cursor to the end of the screen
				s.rows[s.row] = s.rows[s.row][:min(s.col, len(s.rows[s.row]))]
				s.rows = s.rows[:s.row+1]
			default:
				panic(fmt.Sprintf("unexpected control sequence %q", string(text[i:j+1])))
			}
			i = j
		default:
			line := s.rows[s.row]
			for len(line) <= s.col {
				line = append(line, ' ')
			}
			line[s.col] = r
			s.rows[s.row] = line
			s.col++
			if s.col > s.width {
				panic("a line wrapped")
			}
		}
	}
	return len(p), nil
}

// lines is the screen's text, without the empty row the cursor sits in after a final newline.
func (s *screen) lines() []string {
	var out []string
	for _, r := range s.rows {
		out = append(out, string(r))
	}
	if len(out) > 0 && out[len(out)-1] == "" {
		out = out[:len(out)-1]
	}
	return out
}

func TestConsole(t *testing.T) {
	type op struct {
		status []string // SetStatus, if not nil
		out    string   // else written through the Writer
		close  bool
	}
	tests := []struct {
		name  string
		width int
		ops   []op
		want  []string
	}{
		{"output only", 80, []op{{out: "[0] hello\n"}, {out: "[1] hi\n"}}, []string{"[0] hello", "[1] hi"}},
		{"status under output", 80, []op{
			{out: "[0] epoch 1\n"},
			{status: []string{"kolo: step 10", "slowest: rank 3"}},
			{out: "[1] epoch 1\n"},
			{out: "[0] loss 0.3\n[1] loss 0.3\n"},
		}, []string{"[0] epoch 1", "[1] epoch 1", "[0] loss 0.3", "[1] loss 0.3", "kolo: step 10", "slowest: rank 3"}},
		{"status shrinks and grows", 80, []op{
			{status: []string{"a", "b", "c"}},
			{status: []string{"d"}},
			{out: "x\n"},
			{status: []string{"e", "f"}},
		}, []string{"x", "e", "f"}},
		{"a line in pieces waits for its end", 80, []op{
			{status: []string{"s"}},
			{out: "Sat Nov 28:"},
			{out: "[0] part"},
			{out: "ial\n[0] next"},
			{out: " done\n"},
		}, []string{"Sat Nov 28:[0] partial", "[0] next done", "s"}},
		{"long status cut to the width", 12, []op{
			{status: []string{"kolo: step 1234 · 8.3 steps/s", "short"}},
		}, []string{"kolo: step…", "short"}}, // 11 cells: the width less one
		{"close erases the block and flushes", 80, []op{
			{out: "a\n"},
			{status: []string{"s1", "s2"}},
			{out: "unfinished"},
			{close: true},
		}, []string{"a", "unfinished"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			scr := newScreen(tt.width, true)
			c := New(scr)
			if !c.Drawing() {
				t.Fatal("not drawing on a terminal")
			}
			w := c.Writer(scr)
			for _, o := range tt.ops {
				switch {
				case o.close:
					c.Close()
				case o.status != nil:
					c.SetStatus(o.status)
				default:
					io.WriteString(w, o.out)
				}
			}
			if got := scr.lines(); strings.Join(got, "\n") != strings.Join(tt.want, "\n") {
				t.Fatalf("screen:\n%s\nwant:\n%s\nraw: %q", strings.Join(got, "\n"), strings.Join(tt.want, "\n"), scr.raw.String())
			}
		})
	}
}

// TestNotATerminal: on a pipe nothing is drawn and the writer is the one given.
func TestNotATerminal(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	out := File{w}
	if _, ok := out.Width(); ok {
		t.Fatal("a pipe is a terminal")
	}
	c := New(out)
	if c.Drawing() {
		t.Fatal("drawing on a pipe")
	}
	if got := c.Writer(w); got != io.Writer(w) {
		t.Fatal("Writer wrapped a pipe")
	}
	c.SetStatus([]string{"kolo: step 1"})
	io.WriteString(c.Writer(w), "[0] hello\n")
	c.Close()
	w.Close()
	got, _ := io.ReadAll(r)
	if string(got) != "[0] hello\n" {
		t.Fatalf("pipe got %q", got)
	}
}

// TestConcurrentWriters: ranks' lines and status redraws from several goroutines stay whole.
func TestConcurrentWriters(t *testing.T) {
	scr := newScreen(80, true)
	c := New(scr)
	var wg sync.WaitGroup
	for g := range 4 {
		w := c.Writer(scr)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 50 {
				fmt.Fprintf(w, "[%d] line %d\n", g, i)
				if i%10 == 0 {
					c.SetStatus([]string{fmt.Sprintf("status %d %d", g, i)})
				}
			}
		}()
	}
	wg.Wait()
	c.Close()
	lines := scr.lines()
	if len(lines) != 200 {
		t.Fatalf("%d lines on screen, want 200", len(lines))
	}
	for _, l := range lines {
		var g, i int
		if _, err := fmt.Sscanf(l, "[%d] line %d", &g, &i); err != nil {
			t.Fatalf("broken line %q", l)
		}
	}
}
