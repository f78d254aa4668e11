package proc

import (
	"context"
	"io"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/kolo-dl/kolo/internal/cpuset"
	"github.com/kolo-dl/kolo/internal/launch/layout"
)

// TestLocalStarterBinds starts each local rank of a job as large as this machine allows (up to 4)
// and asks the kernel, from inside the rank, which CPUs it may use.
func TestLocalStarterBinds(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("binding is Linux only")
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	own, err := cpuset.Current()
	if err != nil {
		t.Fatal(err)
	}
	n := min(len(own), 4)
	bind, err := NewBinding(n, false)
	if err != nil {
		t.Fatal(err)
	}
	var union cpuset.Set
	for l := range n {
		s := layout.Slot{Rank: l, Size: n, Host: "localhost", LocalRank: l, LocalSize: n}
		p, err := LocalStarter{Bind: bind}.Start(context.Background(), Worker{Slot: s,
			Argv: []string{"/bin/sh", "-c", "grep Cpus_allowed_list /proc/self/status; echo host_cpus=$KOLO_HOST_CPUS"}})
		if err != nil {
			t.Fatal(err)
		}
		out, _ := io.ReadAll(p.Stdout())
		if e := p.Wait(); e.Code != 0 {
			t.Fatalf("rank %d: %v", l, e)
		}
		status, hostCPUs, _ := strings.Cut(strings.TrimSpace(string(out)), "\nhost_cpus=")
		if hostCPUs != strconv.Itoa(len(own)) {
			t.Errorf("local rank %d was told the machine gives its ranks %q CPUs, want %d", l, hostCPUs, len(own))
		}
		_, list, _ := strings.Cut(status, ":")
		got, err := cpuset.Parse(list)
		if err != nil {
			t.Fatal(err)
		}
		want, err := bind.cpus(s)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(got, want) || len(got) == 0 {
			t.Errorf("local rank %d of %d runs on CPUs %v, want %v", l, n, got, want)
		}
		for _, c := range got {
			if slices.Contains(union, c) {
				t.Errorf("CPU %d given to two ranks", c)
			}
		}
		union = append(union, got...)
	}
	if after, _ := cpuset.Current(); !slices.Equal(after, own) {
		t.Errorf("the launcher thread kept a rank's binding: %v, was %v", after, own)
	}
	// Without Bind a rank gets whatever the launcher has.
	p, err := LocalStarter{}.Start(context.Background(), Worker{Slot: layout.Slot{LocalSize: 1},
		Argv: []string{"/bin/sh", "-c", "grep Cpus_allowed_list /proc/self/status"}})
	if err != nil {
		t.Fatal(err)
	}
	out, _ := io.ReadAll(p.Stdout())
	p.Wait()
	_, list, _ := strings.Cut(string(out), ":")
	if got, _ := cpuset.Parse(list); !slices.Equal(got, own) {
		t.Errorf("unbound rank runs on %v, want the launcher's %v", got, own)
	}
}

func TestBindMoreRanksThanCPUs(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("binding is Linux only")
	}
	own, err := cpuset.Current()
	if err != nil {
		t.Fatal(err)
	}
	_, err = NewBinding(len(own)+1, false)
	if err == nil || !strings.Contains(err.Error(), "--bind-to core") || !strings.Contains(err.Error(), "ranks but only") ||
		!strings.Contains(err.Error(), "core:overload-allowed") {
		t.Fatalf("err = %v, want a --bind-to core error saying there are too few CPUs and naming core:overload-allowed", err)
	}
	// Overload allowed: every rank gets one of the CPUs, round robin, each CPU the same number
	// of ranks give or take one.
	n := 2*len(own) + 1
	b, err := NewBinding(n, true)
	if err != nil {
		t.Fatal(err)
	}
	per := map[int]int{}
	for r := range n {
		cpus, err := b.cpus(layout.Slot{Rank: r, LocalRank: r})
		if err != nil || len(cpus) != 1 || !slices.Contains(own, cpus[0]) {
			t.Fatalf("rank %d: CPUs %v, %v; want one of %v", r, cpus, err, own)
		}
		per[cpus[0]]++
	}
	for cpu, k := range per {
		if k < 2 || k > 3 {
			t.Errorf("CPU %d has %d of %d ranks", cpu, k, n)
		}
	}
}
