package elastic

import (
	"fmt"
	"slices"
	"strings"
)

// Worker is one worker process's place: a host and a slot index on it. It is the identity the
// launcher keeps a process under across generations; the slot is what GPU binding goes by.
type Worker struct {
	Host string
	Slot int
}

func (w Worker) String() string { return fmt.Sprintf("%s[%d]", bracketed(w.Host), w.Slot) }

// Rank is a worker's place in one generation's world: the values of its environment contract.
type Rank struct {
	Worker
	Rank      int
	Size      int
	LocalRank int // position among the generation's workers on this host, by slot
	LocalSize int
	CrossRank int // index of this host among the hosts that have a rank with this LocalRank
	CrossSize int // number of hosts that have a rank with this LocalRank
}

// Assign lays out a generation. The survivors (workers of the previous generation that go on
// running) keep their host and slot and take ranks 0..len-1 in the order given, so that rank 0,
// which broadcasts the training state, is always a worker that has that state, and no survivor
// needs a restart. Newcomers then fill free slots up to maxNP: hosts that already run survivors
// first, in the order of their first survivor, then the other hosts in the order listed (the
// discovery order); on each host the lowest free slots first. That is Horovod's host assignment
// order, which keeps a job packed onto the hosts it already uses.
//
// Ranks of one host are therefore not always contiguous (a host that gains a slot gets a rank
// after every survivor); LocalRank and CrossRank are computed from the layout, never from rank
// ranges.
func Assign(survivors []Worker, hosts []Host, maxNP int) ([]Rank, error) {
	if maxNP <= 0 {
		return nil, fmt.Errorf("max-np must be at least 1, got %d", maxNP)
	}
	if err := checkHosts(hosts); err != nil {
		return nil, err
	}
	if len(survivors) > maxNP {
		return nil, fmt.Errorf("%d survivors exceed --max-np %d", len(survivors), maxNP)
	}
	slots := make(map[string]int, len(hosts))
	for _, h := range hosts {
		slots[h.Name] = h.Slots
	}
	taken := map[Worker]bool{}
	var order []string // hosts in the order newcomers fill them
	listed := map[string]bool{}
	for _, w := range survivors {
		n, ok := slots[w.Host]
		switch {
		case !ok:
			return nil, fmt.Errorf("survivor %s is on a host that is not available", w)
		case w.Slot < 0 || w.Slot >= n:
			return nil, fmt.Errorf("survivor %s is outside the %d slots of its host", w, n)
		case taken[w]:
			return nil, fmt.Errorf("survivor %s listed twice", w)
		}
		taken[w] = true
		if !listed[w.Host] {
			listed[w.Host] = true
			order = append(order, w.Host)
		}
	}
	for _, h := range hosts {
		if !listed[h.Name] {
			order = append(order, h.Name)
		}
	}

	workers := append([]Worker(nil), survivors...)
	for _, name := range order {
		for s := 0; s < slots[name] && len(workers) < maxNP; s++ {
			if w := (Worker{Host: name, Slot: s}); !taken[w] {
				workers = append(workers, w)
			}
		}
	}
	return layout(workers), nil
}

// layout numbers workers given in rank order. Local ranks go by slot; a host's cross rank at local
// rank l is the number of hosts before it (by first rank) that have local rank l (next[l], as it
// goes), and the cross size all of them.
func layout(workers []Worker) []Rank {
	ranks := make([]Rank, len(workers))
	var hostOrder []string // by first rank
	onHost := map[string][]*Rank{}
	for i, w := range workers {
		ranks[i] = Rank{Worker: w, Rank: i, Size: len(workers)}
		if _, ok := onHost[w.Host]; !ok {
			hostOrder = append(hostOrder, w.Host)
		}
		onHost[w.Host] = append(onHost[w.Host], &ranks[i])
	}
	var next []int
	for _, h := range hostOrder {
		bySlot := slices.SortedFunc(slices.Values(onHost[h]), func(a, b *Rank) int { return a.Slot - b.Slot })
		for l, r := range bySlot {
			if l == len(next) {
				next = append(next, 0)
			}
			r.LocalRank, r.LocalSize, r.CrossRank = l, len(bySlot), next[l]
			next[l]++
		}
	}
	for i := range ranks {
		ranks[i].CrossSize = next[ranks[i].LocalRank]
	}
	return ranks
}

// formatWorkers writes workers grouped by host, slots as ranges: "a[0-2],b[1]". Hosts appear in
// the order of their first worker.
func formatWorkers(ws []Worker) string {
	var hosts []string
	slots := map[string][]int{}
	for _, w := range ws {
		if _, ok := slots[w.Host]; !ok {
			hosts = append(hosts, w.Host)
		}
		slots[w.Host] = append(slots[w.Host], w.Slot)
	}
	parts := make([]string, len(hosts))
	for i, h := range hosts {
		parts[i] = bracketed(h) + "[" + formatInts(slots[h]) + "]"
	}
	return strings.Join(parts, ",")
}

// formatInts writes runs of consecutive integers as ranges: "0-2,5".
func formatInts(v []int) string {
	var b strings.Builder
	for i := 0; i < len(v); {
		j := i
		for j+1 < len(v) && v[j+1] == v[j]+1 {
			j++
		}
		if b.Len() > 0 {
			b.WriteByte(',')
		}
		if j > i {
			fmt.Fprintf(&b, "%d-%d", v[i], v[j])
		} else {
			fmt.Fprintf(&b, "%d", v[i])
		}
		i = j + 1
	}
	return b.String()
}
