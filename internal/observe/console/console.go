// Package console keeps a few status lines at the bottom of the launcher's terminal, under the
// ranks' output, redrawn in place: every output line goes through the Console, which erases the
// status block, writes the line where the block was, and draws the block again below it.
//
// It draws only on a terminal: when stdout is a pipe or a file, Writer hands back the writer it is
// given and SetStatus draws nothing, so logs and scripts see exactly the ranks' output, as before.
// It must not decide what the lines say (package view does) and must not read the ranks' output
// beyond finding line ends.
//
// Libraries: golang.org/x/term answers "is this a terminal, how wide" (a syscall each, from the Go
// team); github.com/charmbracelet/x/ansi supplies the two control sequences the block needs (cursor
// up, erase below) and cuts status lines to the terminal's width by display cells, so wide runes
// and escape sequences inside a line do not make it wrap and break the redraw. A full-screen
// library (tcell, bubbletea) would take the terminal over, which the ranks' scrolling output must
// keep.
package console

import (
	"bytes"
	"io"
	"os"
	"strings"
	"sync"

	"github.com/charmbracelet/x/ansi"
	"golang.org/x/term"
)

// Terminal is where the Console draws.
type Terminal interface {
	io.Writer
	// Width is the terminal's width in columns; ok is false when the writer is no terminal.
	Width() (cols int, ok bool)
}

// File is a Terminal over an *os.File (the launcher's stdout).
type File struct{ *os.File }

// Width reports the file's terminal width, and ok false when it is not a terminal.
func (f File) Width() (int, bool) {
	fd := int(f.Fd())
	if !term.IsTerminal(fd) {
		return 0, false
	}
	w, _, err := term.GetSize(fd)
	if err != nil || w <= 0 {
		return 80, true
	}
	return w, true
}

// Console owns the status block on out. Its methods are safe for concurrent use.
type Console struct {
	mu     sync.Mutex
	out    Terminal
	tty    bool
	status []string
	drawn  int // status lines on the screen now
	lines  []*lineWriter
}

// New returns a Console drawing on out, if out is a terminal now.
func New(out Terminal) *Console {
	_, tty := out.Width()
	return &Console{out: out, tty: tty}
}

// Drawing reports whether the Console draws (out is a terminal).
func (c *Console) Drawing() bool { return c.tty }

// SetStatus replaces the status block with lines and redraws it.
func (c *Console) SetStatus(lines []string) {
	if !c.tty {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.status = append(c.status[:0], lines...)
	var b bytes.Buffer
	c.erase(&b)
	c.draw(&b)
	c.flush(&b)
}

// flush writes b to out in one Write (one redraw, no flicker between its parts) and empties it.
func (c *Console) flush(b *bytes.Buffer) {
	if b.Len() > 0 {
		c.out.Write(b.Bytes())
		b.Reset()
	}
}

// Writer returns a writer whose whole lines go to w above the status block. Bytes after the last
// line end wait for the rest of their line (the launcher may write a line in pieces), until Close.
// When the Console does not draw, Writer returns w itself.
func (c *Console) Writer(w io.Writer) io.Writer {
	if !c.tty {
		return w
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	l := &lineWriter{c: c, w: w}
	c.lines = append(c.lines, l)
	return l
}

// Close erases the status block and writes what the writers hold of unfinished lines, leaving the
// terminal as if no status had been drawn.
func (c *Console) Close() error {
	if !c.tty {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	var b bytes.Buffer
	c.erase(&b)
	c.flush(&b)
	c.status = nil
	for _, l := range c.lines {
		if len(l.partial) > 0 {
			l.w.Write(l.partial)
			l.partial = nil
		}
	}
	return nil
}

// erase moves to the start of the block's first line and erases it and everything below. The
// cursor rests at the end of the block's last line (draw writes no final newline, so the block
// does not cost a blank line at the bottom of the screen).
func (c *Console) erase(b *bytes.Buffer) {
	if c.drawn == 0 {
		return
	}
	b.WriteByte('\r')
	if c.drawn > 1 {
		b.WriteString(ansi.CursorUp(c.drawn - 1))
	}
	b.WriteString(ansi.EraseScreenBelow)
	c.drawn = 0
}

// draw writes the block from the cursor, each line cut to the width less one column (a line that
// fills the last column leaves some terminals in a pending wrap, which would shift the redraw).
func (c *Console) draw(b *bytes.Buffer) {
	if len(c.status) == 0 {
		return
	}
	width, ok := c.out.Width()
	if !ok {
		width = 80
	}
	for i, s := range c.status {
		if i > 0 {
			b.WriteByte('\n')
		}
		s = strings.ReplaceAll(s, "\n", " ")
		b.WriteString(ansi.Truncate(s, max(width-1, 1), "…"))
	}
	c.drawn = len(c.status)
}

// lineWriter buffers a stream until line ends and writes whole lines above the block.
type lineWriter struct {
	c       *Console
	w       io.Writer
	partial []byte
}

func (l *lineWriter) Write(p []byte) (int, error) {
	c := l.c
	c.mu.Lock()
	defer c.mu.Unlock()
	end := bytes.LastIndexByte(p, '\n')
	if end < 0 {
		l.partial = append(l.partial, p...)
		return len(p), nil
	}
	var b bytes.Buffer
	c.erase(&b)
	c.flush(&b)
	whole := append(l.partial, p[:end+1]...)
	_, err := l.w.Write(whole)
	l.partial = append(l.partial[:0], p[end+1:]...)
	c.draw(&b)
	c.flush(&b)
	if err != nil {
		return 0, err
	}
	return len(p), nil
}
