package kolo_test

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/kolo-dl/kolo/internal/bench"
)

// `kolo bench OP --check` runs every op it offers among 3 local ranks and checks the results: a
// small size, a larger one, and one that does not divide among the ranks; barrier prints one row
// of no data.
func TestBenchEveryOp(t *testing.T) {
	kolo := buildKolo(t)
	for _, op := range bench.Ops {
		t.Run(op, func(t *testing.T) {
			cmd := exec.Command(kolo, "bench", op, "-np", "3", "--check", "--sizes", "4,3KiB,100KiB", "--iters", "5", "--warmup", "2")
			cmd.Env = launchEnv()
			out, err := cmd.CombinedOutput()
			if err != nil {
				t.Fatalf("kolo bench %s: %v\n%s", op, err, out)
			}
			rows := 0
			for _, line := range strings.Split(string(out), "\n") {
				f := strings.Fields(line)
				if len(f) < 6 || !strings.HasSuffix(f[0], "B") || f[0] == "size" {
					continue
				}
				rows++
				if want := "ok"; op != "barrier" && f[len(f)-1] != want {
					t.Errorf("kolo bench %s: row %q is not checked ok", op, line)
				}
			}
			if want := map[bool]int{true: 1, false: 3}[op == "barrier"]; rows != want {
				t.Errorf("kolo bench %s printed %d result rows, want %d:\n%s", op, rows, want, out)
			}
		})
	}
}
