// Package proctest holds what tests of process supervision share: a buffer that several
// goroutines write to, and the checks that a job's processes and their children are gone.
//
// It is test support: production code must not import it.
package proctest

import (
	"bytes"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// Buffer is a bytes.Buffer that concurrent writers (a runner's output copiers, a logger's
// timer) may write to while the test reads it.
type Buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *Buffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *Buffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// Alive reports whether pid exists and is not a zombie: a killed orphan stays a zombie until
// init reaps it, and counts as gone.
func Alive(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i < 0 || i+2 >= len(s) || s[i+2] != 'Z'
}

// AwaitGone waits up to 5 s until none of pids is alive, and fails the test for each that is.
func AwaitGone(t testing.TB, pids []int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for _, pid := range pids {
		for Alive(pid) {
			if time.Now().After(deadline) {
				t.Errorf("process %d outlived its rank", pid)
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
}

var childPid = regexp.MustCompile(`child=(\d+)`)

// ChildPids reads the pids that test ranks print as "child=PID" for the processes they start.
func ChildPids(out string) []int {
	var pids []int
	for _, m := range childPid.FindAllStringSubmatch(out, -1) {
		n, _ := strconv.Atoi(m[1])
		pids = append(pids, n)
	}
	return pids
}
