package negotiate

import (
	"encoding/binary"
	"fmt"
	"slices"
)

// Process sets are registered and removed collectively: every rank proposes the same SetChange,
// the engine exchanges the proposals (an allgather in the global set, so the change lands at one
// place of the response stream on every rank), and every rank's SetTable applies the same list of
// proposals to the same table, reaching the same verdict (the new id, or the same error) with no
// further message.

// SetChange is one rank's proposal: register a set of ranks, or remove a set.
type SetChange struct {
	Remove bool
	Ranks  []int // to add: job ranks, ascending (the API sorts them)
	ID     int   // to remove; after an add, the id it got
}

func (c SetChange) String() string {
	if c.Remove {
		return fmt.Sprintf("remove process set %d", c.ID)
	}
	return "add process set " + fmt.Sprint(c.Ranks) // [0 2 5]
}

const (
	setChangeAdd    = 1
	setChangeRemove = 2
)

// EncodeSetChange appends c's encoding (the bytes a rank contributes to the exchange) to dst.
func EncodeSetChange(dst []byte, c SetChange) []byte {
	dst = append(dst, WireVersion)
	if c.Remove {
		dst = append(dst, setChangeRemove)
		return binary.AppendUvarint(dst, uint64(c.ID))
	}
	dst = append(dst, setChangeAdd)
	dst = binary.AppendUvarint(dst, uint64(len(c.Ranks)))
	for _, r := range c.Ranks {
		dst = binary.AppendVarint(dst, int64(r))
	}
	return dst
}

// DecodeSetChange decodes EncodeSetChange's bytes.
func DecodeSetChange(p []byte) (SetChange, error) {
	d := decoder{p: p, msg: "process set change"}
	if len(p) < 2 || p[0] != WireVersion {
		d.fail("bad header")
		return SetChange{}, d.err
	}
	d.off = 2
	var c SetChange
	switch p[1] {
	case setChangeRemove:
		c.Remove = true
		c.ID = d.setID()
	case setChangeAdd:
		n := d.count("ranks", MaxRanks)
		c.Ranks = make([]int, 0, n)
		for range n {
			v := d.varint("rank")
			if v < -MaxRanks || v > MaxRanks {
				d.fail("rank %d out of range", v)
				break
			}
			c.Ranks = append(c.Ranks, int(v))
		}
	default:
		d.fail("unknown process set change %d", p[1])
	}
	return c, d.end()
}

// SetTable is the registry of process sets every rank keeps: id -> job ranks. Id 0 is the global
// set; new sets get increasing ids, never reused, so an op naming a removed set cannot land in a
// later one. Not safe for concurrent use.
type SetTable struct {
	size int
	sets map[int][]int
	next int
}

// NewSetTable makes the table of a job of size ranks, holding the global set.
func NewSetTable(size int) *SetTable {
	all := make([]int, size)
	for i := range all {
		all[i] = i
	}
	return &SetTable{size: size, sets: map[int][]int{0: all}, next: 1}
}

// Ranks returns the job ranks of set id (read-only).
func (t *SetTable) Ranks(id int) ([]int, bool) {
	r, ok := t.sets[id]
	return r, ok
}

// Removed reports whether id was registered once and has been removed since.
func (t *SetTable) Removed(id int) bool {
	_, ok := t.sets[id]
	return !ok && id > 0 && id < t.next
}

// IDs returns the registered set ids, ascending.
func (t *SetTable) IDs() []int {
	ids := make([]int, 0, len(t.sets))
	for id := range t.sets {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids
}

// Apply decides the change that proposals (indexed by job rank, one per rank) ask for and applies
// it: it returns the change (an add with its new id), or the error every rank fails it with,
// leaving the table as it was. Ranks must agree exactly; the message says what each sent.
func (t *SetTable) Apply(proposals []SetChange) (SetChange, error) {
	if len(proposals) != t.size {
		return SetChange{}, fmt.Errorf("process set change: %d proposals for %d ranks", len(proposals), t.size)
	}
	all := make([]int, len(proposals))
	for i := range all {
		all[i] = i
	}
	if v := tally(all, func(r int) string { return proposals[r].String() }); len(v) > 1 {
		return SetChange{}, fmt.Errorf("process set change: ranks disagree (every rank must make the same call, in the same order): %s",
			jobRanks(nil).describe(v))
	}
	c := proposals[0]
	if c.Remove {
		switch _, ok := t.sets[c.ID]; {
		case c.ID == 0:
			return SetChange{}, fmt.Errorf("%s: the global process set cannot be removed", c)
		case !ok:
			return SetChange{}, fmt.Errorf("%s: no such process set (never added, or removed already)", c)
		}
		delete(t.sets, c.ID)
		return c, nil
	}
	if err := checkSetRanks(c.Ranks, t.size); err != "" {
		return SetChange{}, fmt.Errorf("%s: %s", c, err)
	}
	for _, id := range t.IDs() {
		if slices.Equal(t.sets[id], c.Ranks) {
			if id == 0 {
				return SetChange{}, fmt.Errorf("%s: these are all the job's ranks: use the global process set (id 0)", c)
			}
			return SetChange{}, fmt.Errorf("%s: process set %d already has these ranks", c, id)
		}
	}
	c.ID = t.next
	t.next++
	t.sets[c.ID] = slices.Clone(c.Ranks)
	return c, nil
}
