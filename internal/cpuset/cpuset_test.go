package cpuset

import (
	"os"
	"runtime"
	"slices"
	"strings"
	"testing"
)

func TestStringParse(t *testing.T) {
	for _, tc := range []struct {
		list string
		set  Set
	}{
		{"", nil},
		{"0", Set{0}},
		{"0-3", Set{0, 1, 2, 3}},
		{"0-1,4,6-7", Set{0, 1, 4, 6, 7}},
		{"8,10-11", Set{8, 10, 11}},
	} {
		got, err := Parse(tc.list)
		if err != nil || !slices.Equal(got, tc.set) {
			t.Errorf("Parse(%q) = %v, %v; want %v", tc.list, got, err, tc.set)
		}
		if s := tc.set.String(); s != tc.list {
			t.Errorf("%v.String() = %q, want %q", tc.set, s, tc.list)
		}
	}
	for _, bad := range []string{"a", "3-1", "-1", "1-x"} {
		if _, err := Parse(bad); err == nil {
			t.Errorf("Parse(%q) accepted", bad)
		}
	}
	if got, _ := Parse("3,1-2,2"); !slices.Equal(got, Set{1, 2, 3}) {
		t.Errorf("Parse sorts and drops repeats: got %v", got)
	}
}

// smt: 2 packages x 2 cores x 2 threads, numbered as Linux usually does: siblings are 4 apart.
func smt(cpu int) (pkg, core int, ok bool) {
	c := cpu % 4
	return c / 2, c % 2, true
}

func unknown(int) (int, int, bool) { return 0, 0, false }

func TestCores(t *testing.T) {
	all := Set{0, 1, 2, 3, 4, 5, 6, 7}
	got := Cores(all, smt)
	want := []Set{{0, 4}, {1, 5}, {2, 6}, {3, 7}}
	if !slices.EqualFunc(got, want, slices.Equal) {
		t.Errorf("Cores with hyperthreads = %v, want %v", got, want)
	}
	if got := Cores(Set{1, 5, 2}, smt); !slices.EqualFunc(got, []Set{{1, 5}, {2}}, slices.Equal) {
		t.Errorf("Cores of an allowed subset = %v", got)
	}
	if got := Cores(Set{3, 0, 2}, unknown); !slices.EqualFunc(got, []Set{{0}, {2}, {3}}, slices.Equal) {
		t.Errorf("Cores without topology = %v, want one core per CPU", got)
	}
}

// TestSplit covers Split and, where overload is set, Overload (more ranks than CPUs, round robin).
func TestSplit(t *testing.T) {
	ht := Cores(Set{0, 1, 2, 3, 4, 5, 6, 7}, smt)
	for _, tc := range []struct {
		name     string
		overload bool
		cores    []Set
		n        int
		want     []Set
		err      string
	}{
		{"one rank takes all", false, ht, 1, []Set{{0, 1, 2, 3, 4, 5, 6, 7}}, ""},
		{"two ranks, whole cores each", false, ht, 2, []Set{{0, 1, 4, 5}, {2, 3, 6, 7}}, ""},
		{"three ranks, sizes differ by one", false, ht, 3, []Set{{0, 1, 4, 5}, {2, 6}, {3, 7}}, ""},
		{"four ranks, a core each", false, ht, 4, []Set{{0, 4}, {1, 5}, {2, 6}, {3, 7}}, ""},
		{"more ranks than cores: logical CPUs", false, ht, 5, []Set{{0, 4}, {1, 5}, {2, 6}, {3}, {7}}, ""},
		{"a CPU each", false, ht, 8, []Set{{0}, {4}, {1}, {5}, {2}, {6}, {3}, {7}}, ""},
		{"more ranks than CPUs", false, ht, 9, nil, "9 ranks but only 8 CPUs"},
		{"no ranks", false, ht, 0, nil, "0 ranks"},
		{"two plain CPUs", false, []Set{{0}, {1}}, 2, []Set{{0}, {1}}, ""},
		{"overload: two plain CPUs, four ranks round robin", true, []Set{{0}, {1}}, 4, []Set{{0}, {1}, {0}, {1}}, ""},
		{"overload: two plain CPUs, five ranks", true, []Set{{0}, {1}}, 5, []Set{{0}, {1}, {0}, {1}, {0}}, ""},
		{"overload: every core's first thread, then the second ones", true, ht, 10, []Set{{0}, {1}, {2}, {3}, {4}, {5}, {6}, {7}, {0}, {1}}, ""},
		{"overload: no more ranks than CPUs is Split", true, ht, 3, []Set{{0, 1, 4, 5}, {2, 6}, {3, 7}}, ""},
		{"overload: no ranks", true, ht, 0, nil, "0 ranks"},
	} {
		split := Split
		if tc.overload {
			split = Overload
		}
		got, err := split(tc.cores, tc.n)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%s: err = %v, want %q", tc.name, err, tc.err)
			}
			continue
		}
		if err != nil || !slices.EqualFunc(got, tc.want, slices.Equal) {
			t.Errorf("%s: got %v, %v; want %v", tc.name, got, err, tc.want)
		}
	}
}

// threadAllowed is the kernel's own account of the calling thread's CPUs.
func threadAllowed(t *testing.T) Set {
	b, err := os.ReadFile("/proc/thread-self/status")
	if err != nil {
		t.Skipf("no /proc/thread-self: %v", err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "Cpus_allowed_list:"); ok {
			s, err := Parse(v)
			if err != nil {
				t.Fatal(err)
			}
			return s
		}
	}
	t.Fatal("no Cpus_allowed_list in /proc/thread-self/status")
	return nil
}

func TestCurrentAndApply(t *testing.T) {
	if runtime.GOOS != "linux" {
		if _, err := Current(); err != ErrUnsupported {
			t.Fatalf("Current on %s: %v, want ErrUnsupported", runtime.GOOS, err)
		}
		return
	}
	runtime.LockOSThread()
	// Not unlocked: the thread's mask changes, so the runtime must retire it with this goroutine.
	cur, err := Current()
	if err != nil {
		t.Fatal(err)
	}
	if want := threadAllowed(t); !slices.Equal(cur, want) {
		t.Fatalf("Current = %v, the kernel says %v", cur, want)
	}
	one := cur[len(cur)-1:]
	if err := Apply(one); err != nil {
		t.Fatal(err)
	}
	if got := threadAllowed(t); !slices.Equal(got, one) {
		t.Errorf("after Apply(%v) the kernel says %v", one, got)
	}
	if got, _ := Current(); !slices.Equal(got, one) {
		t.Errorf("after Apply(%v) Current = %v", one, got)
	}
	if err := Apply(Set{maskWords * 64}); err == nil {
		t.Error("Apply of an out-of-range CPU succeeded")
	}
}
