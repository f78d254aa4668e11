// Package cpuset reads and sets which CPUs a thread may run on, groups CPUs into physical cores, and
// divides cores among the ranks of one host, so that kolo run can bind each rank it starts to
// cores of its own (--bind-to core). The planning (Cores, Split) is pure; only Current and Apply
// touch the kernel, and only on Linux: elsewhere they report ErrUnsupported. It must not decide
// policy (how many ranks, which flag): the launcher does.
package cpuset

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
)

// ErrUnsupported means this system cannot bind threads to CPUs through this package.
var ErrUnsupported = errors.New("binding to CPUs is supported on Linux only")

// Set is a sorted list of logical CPU numbers, without repeats.
type Set []int

// String writes s as Linux does in Cpus_allowed_list and taskset -c takes it: "0-3,8,10-11".
func (s Set) String() string {
	var b strings.Builder
	for i := 0; i < len(s); {
		j := i
		for j+1 < len(s) && s[j+1] == s[j]+1 {
			j++
		}
		if b.Len() > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.Itoa(s[i]))
		if j > i {
			b.WriteString("-" + strconv.Itoa(s[j]))
		}
		i = j + 1
	}
	return b.String()
}

// Parse reads a list in String's form ("0-3,8"); it is how tests read /proc/PID/status.
func Parse(list string) (Set, error) {
	var s Set
	for _, part := range strings.Split(strings.TrimSpace(list), ",") {
		if part == "" {
			continue
		}
		lo, hi, isRange := strings.Cut(part, "-")
		a, err := strconv.Atoi(lo)
		b := a
		if err == nil && isRange {
			b, err = strconv.Atoi(hi)
		}
		if err != nil || a < 0 || b < a {
			return nil, fmt.Errorf("cpu list %q: bad part %q", list, part)
		}
		for c := a; c <= b; c++ {
			s = append(s, c)
		}
	}
	slices.Sort(s)
	return slices.Compact(s), nil
}

// Topology says which physical core a logical CPU belongs to: the package (socket) and the core
// within it. ok is false when it is not known.
type Topology func(cpu int) (pkg, core int, ok bool)

// SysfsTopology reads /sys/devices/system/cpu/cpuN/topology, as the kernel exposes it.
func SysfsTopology(cpu int) (pkg, core int, ok bool) {
	read := func(name string) (int, bool) {
		b, err := os.ReadFile(fmt.Sprintf("/sys/devices/system/cpu/cpu%d/topology/%s", cpu, name))
		if err != nil {
			return 0, false
		}
		v, err := strconv.Atoi(strings.TrimSpace(string(b)))
		return v, err == nil
	}
	pkg, ok1 := read("physical_package_id")
	core, ok2 := read("core_id")
	return pkg, core, ok1 && ok2
}

// Cores groups the CPUs of s by physical core (hyperthreads of one core together), ordered by
// package, then core. A CPU whose topology is unknown is a core of its own.
func Cores(s Set, topo Topology) []Set {
	type key struct{ pkg, core, cpu int }
	byKey := map[key]Set{}
	var keys []key
	for _, c := range s {
		k := key{cpu: c}
		if pkg, core, ok := topo(c); ok {
			k = key{pkg: pkg, core: core, cpu: -1}
		}
		if _, seen := byKey[k]; !seen {
			keys = append(keys, k)
		}
		byKey[k] = append(byKey[k], c)
	}
	slices.SortStableFunc(keys, func(a, b key) int {
		if a.pkg != b.pkg {
			return a.pkg - b.pkg
		}
		if a.core != b.core {
			return a.core - b.core
		}
		return a.cpu - b.cpu
	})
	out := make([]Set, len(keys))
	for i, k := range keys {
		out[i] = byKey[k]
	}
	return out
}

// Split divides cores among n ranks: rank i gets a contiguous block of whole cores, the blocks'
// sizes differing by at most one, so ranks never share a core's hyperthreads. With fewer cores than
// ranks it divides the logical CPUs instead, in core order (ranks then share cores, never a CPU).
// With fewer CPUs than ranks it fails: binding would stack ranks on one CPU (Overload does).
func Split(cores []Set, n int) ([]Set, error) {
	if n < 1 {
		return nil, fmt.Errorf("cannot split CPUs among %d ranks", n)
	}
	units := cores
	if len(units) < n {
		units = nil
		for _, c := range cores {
			for _, cpu := range c {
				units = append(units, Set{cpu})
			}
		}
	}
	if len(units) < n {
		return nil, fmt.Errorf("%d ranks but only %d CPUs to bind them to", n, len(units))
	}
	out := make([]Set, n)
	per, extra := len(units)/n, len(units)%n
	at := 0
	for i := range out {
		k := per
		if i < extra {
			k++
		}
		var s Set
		for _, u := range units[at : at+k] {
			s = append(s, u...)
		}
		slices.Sort(s)
		out[i] = s
		at += k
	}
	return out, nil
}

// Overload is Split for more ranks than CPUs (mpirun's --bind-to core:overload-allowed): rank i
// gets logical CPU i mod CPUs, the CPUs ordered first threads of every core first, so that
// neighbouring ranks sit on different cores where they can and each CPU's ranks are spread evenly
// (their counts differ by at most one). With no more ranks than CPUs it is Split.
//
// Why bind at all when ranks share CPUs: left to the kernel, 4 ranks on 2 vCPUs whose waits yield
// ran 4-byte allreduces in two states, 15-17 us and 31-37 us for stretches of thousands of ops;
// bound this way they ran 14-17 us from the first op (docs/benchmarks.md).
func Overload(cores []Set, n int) ([]Set, error) {
	var cpus []int
	for t := 0; ; t++ {
		more := false
		for _, c := range cores {
			if t < len(c) {
				cpus = append(cpus, c[t])
				more = true
			}
		}
		if !more {
			break
		}
	}
	if n < 1 || len(cpus) == 0 || n <= len(cpus) {
		return Split(cores, n)
	}
	out := make([]Set, n)
	for i := range out {
		out[i] = Set{cpus[i%len(cpus)]}
	}
	return out, nil
}
