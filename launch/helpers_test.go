package launch

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

// These helpers have twins in launch/proc's tests: a job test watches processes the way a starter
// test does.

// syncBuffer is a bytes.Buffer safe for the runner's concurrent writers.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// alive reports whether pid exists and is not a zombie (a killed orphan waits for init to reap it).
func alive(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i < 0 || i+2 >= len(s) || s[i+2] != 'Z'
}

// pidsGone waits until none of pids is alive.
func pidsGone(t *testing.T, pids []int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for _, pid := range pids {
		for alive(pid) {
			if time.Now().After(deadline) {
				t.Errorf("process %d outlived its rank", pid)
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
}

var childPid = regexp.MustCompile(`child=(\d+)`)

func childPids(out string) []int {
	var pids []int
	for _, m := range childPid.FindAllStringSubmatch(out, -1) {
		n, _ := strconv.Atoi(m[1])
		pids = append(pids, n)
	}
	return pids
}
