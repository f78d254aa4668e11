// Package layout is kolo run's placement as plain data: the hosts of -H and hostfiles (parsed, with
// errors naming file and line) and the rank plan that places -np ranks on them, each rank's Slot
// being all that its environment contract derives from. It must not start processes, read the
// network or the clock: everything here is a pure function with table tests.
package layout

import (
	"fmt"
	"strings"
)

// Host is one machine and how many ranks it may run.
type Host struct {
	Name  string
	Slots int
}

// Slot is one rank's place in the job: the environment contract derives entirely from it.
type Slot struct {
	Rank      int
	Size      int
	Host      string
	LocalRank int
	LocalSize int
	CrossRank int // index of this host among the hosts that have a rank with this LocalRank
	CrossSize int // number of hosts that have a rank with this LocalRank
}

// Plan places np ranks on hosts in order, filling each host's slots before the next (Horovod's
// default placement), and returns one Slot per rank. It fails when np exceeds the total slots,
// listing the hosts so the user sees what was available.
func Plan(hosts []Host, np int) ([]Slot, error) {
	if np <= 0 {
		return nil, fmt.Errorf("-np must be at least 1, got %d", np)
	}
	if len(hosts) == 0 {
		return nil, fmt.Errorf("no hosts to place %d ranks on", np)
	}
	total := 0
	for _, h := range hosts {
		if h.Slots <= 0 {
			return nil, fmt.Errorf("host %q has %d slots; every host needs at least 1", h.Name, h.Slots)
		}
		total += h.Slots
	}
	if np > total {
		return nil, fmt.Errorf("-np %d exceeds the %d slots available: %s", np, total, describe(hosts))
	}

	// Hosts are filled in order, so a host's cross rank at local rank l is the number of hosts
	// before it that have local rank l (next[l], as it goes), and the cross size all of them.
	slots := make([]Slot, 0, np)
	var next []int
	for _, h := range hosts {
		n := min(h.Slots, np-len(slots))
		for l := range n {
			if l == len(next) {
				next = append(next, 0)
			}
			slots = append(slots, Slot{Rank: len(slots), Size: np, Host: h.Name, LocalRank: l, LocalSize: n, CrossRank: next[l]})
			next[l]++
		}
	}
	for i := range slots {
		slots[i].CrossSize = next[slots[i].LocalRank]
	}
	return slots, nil
}

func describe(hosts []Host) string {
	parts := make([]string, len(hosts))
	for i, h := range hosts {
		parts[i] = fmt.Sprintf("%s:%d", h.Name, h.Slots)
	}
	return strings.Join(parts, ",")
}
