// Package negotiate decides, from what every rank asked for, which collectives all ranks run and in
// which order: the pure core of kolo's background engine, plus the wire codec for its messages.
//
// Every rank's engine sends the ops its user code submitted (named, in any order) to rank 0, which
// feeds them to a Coordinator. An op becomes ready when every rank has submitted it (matched by
// name, never by arrival order) or has joined; the Coordinator checks that the ranks agree, fuses
// ready ops into groups up to a byte threshold, and emits Responses that rank 0 sends, in order, to
// every rank, which executes them in exactly that order. A response cache gives each negotiated
// signature a small id so that a steady-state step costs each rank a bit-vector, not a list of names.
// Process sets (subsets of ranks running their own ops) each get a Coordinator of their own; rank 0
// holds them all in a Hub (hub.go), and every rank keeps the same SetTable of them (sets.go).
//
// The package must stay pure (etcd-raft style): no sockets, no goroutines, no clocks (time is an
// argument), no logging. Nothing here executes a collective or touches a tensor's bytes; the engine
// moves the messages and acts on what comes back.
package negotiate

import (
	"fmt"
	"strings"
	"time"

	"github.com/kolo-dl/kolo/internal/dtype"
)

// OpKind is the collective an op asks for. The numeric values are part of the wire format: append
// only. The zero value is invalid so that a forgotten field is caught.
type OpKind uint8

const (
	InvalidOp     OpKind = iota
	Allreduce            // every rank gets the elementwise reduction of all ranks' tensors
	Allgather            // every rank gets all ranks' tensors concatenated along dim 0
	Broadcast            // every rank gets Root's tensor
	Alltoall             // rank r sends Splits[d] rows of its tensor to each rank d
	ReduceScatter        // the reduction, split along dim 0, each rank keeping its share
	Barrier              // no data: every rank waits for every other
	Join                 // only in Responses: every rank has called Join
	// Retune, only in Responses of the global set, brings its Tune into force on every rank:
	// the responses after it run under those collective settings, those before it under the
	// earlier ones (the autotuner's; see Collectives).
	Retune
)

var opNames = [...]string{
	InvalidOp:     "invalid",
	Allreduce:     "allreduce",
	Allgather:     "allgather",
	Broadcast:     "broadcast",
	Alltoall:      "alltoall",
	ReduceScatter: "reducescatter",
	Barrier:       "barrier",
	Join:          "join",
	Retune:        "retune",
}

func (k OpKind) String() string {
	if int(k) < len(opNames) && k != InvalidOp {
		return opNames[k]
	}
	return fmt.Sprintf("op(%d)", uint8(k))
}

// ParseOpKind accepts the names String returns ("reduce_scatter" too).
func ParseOpKind(s string) (OpKind, error) {
	s = strings.ToLower(strings.TrimSpace(s))
	if s == "reduce_scatter" {
		return ReduceScatter, nil
	}
	for k := Allreduce; k <= Join; k++ {
		if opNames[k] == s {
			return k, nil
		}
	}
	return InvalidOp, fmt.Errorf("unknown op kind %q (want allreduce, allgather, broadcast, alltoall, reducescatter, barrier or join)", s)
}

// Reduction operators, with the numeric values of reduce.Op (the engine converts with a plain cast),
// and then ReduceAdasum, which is no elementwise reduce.Op: the engine runs
// collective.AdasumAllreduce for it (allreduce of floating-point tensors only, no joined ranks).
// Average is not one of them: it is Sum plus a post-scale of 1/n, which the executor applies where
// Request.Average says so.
const (
	ReduceSum    uint8 = 1
	ReduceMin    uint8 = 2
	ReduceMax    uint8 = 3
	ReduceProd   uint8 = 4
	ReduceAdasum uint8 = 5
)

// ReduceOpName names a reduction operator as errors and tests print it ("average" when avg is set).
func ReduceOpName(op uint8, avg bool) string {
	if avg {
		if op == ReduceSum {
			return "average"
		}
		return ReduceOpName(op, false) + "+average"
	}
	switch op {
	case ReduceSum:
		return "sum"
	case ReduceMin:
		return "min"
	case ReduceMax:
		return "max"
	case ReduceProd:
		return "prod"
	case ReduceAdasum:
		return "adasum"
	}
	return fmt.Sprintf("reduceop(%d)", op)
}

// Request is one op as one rank submitted it. Fields an op's kind does not use are ignored (not
// compared, not cached, not sent back). The Coordinator keeps the slices it is given: callers must
// not modify them after Submit.
type Request struct {
	// Name identifies the op across ranks; the API layer names unnamed ops deterministically.
	Name string
	// Kind is the collective; Join is not a Request (call Coordinator.Join).
	Kind OpKind
	// DType is the element type (unused by Barrier).
	DType dtype.DType
	// Shape is the full shape of this rank's tensor. Allgather and Alltoall tensors may differ in
	// dim 0 across ranks; every other dim (and every dim for the other kinds) must agree.
	Shape []int64
	// ReduceOp is one of ReduceSum..ReduceAdasum (Allreduce, ReduceScatter; Adasum: Allreduce only).
	ReduceOp uint8
	// Average marks a Sum divided by the number of ranks: the executor folds 1/n into the
	// postscale, as Horovod does.
	Average bool
	// GPU marks a tensor that lives in GPU memory, which the binding stages through host memory.
	// Every rank must agree, as Horovod fails an op whose ranks mix CPU and GPU tensors, and a
	// float16 tensor's scale factors are first rounded to float16, as Horovod's CUDA kernels do.
	GPU bool
	// Root is the rank whose tensor a Broadcast sends.
	Root int
	// PreScale and PostScale multiply the data before and after the reduction (Allreduce,
	// ReduceScatter). 0 means 1: the zero Request does not scale.
	PreScale, PostScale float64
	// Splits, for Alltoall, is the number of dim-0 rows sent to each rank (len == size, sum ==
	// Shape[0]); nil means an equal split, which needs Shape[0] to be a multiple of size.
	Splits []int64
	// Group, when non-zero, makes this op one of GroupSize ops (horovod's grouped_allreduce) that
	// are released together, once all of them are ready on every rank, and fused only with each
	// other. Every rank must give the same Group and GroupSize.
	Group     int64
	GroupSize int
	// Set is the process set the op runs in (0: the global set, every rank). The engine routes a
	// request by it to that set's Coordinator, which sees only its own set's requests; it is not
	// compared, cached or encoded with the request (a Batch carries its set once).
	Set int
	// Error, when non-empty, says that this rank refused the op before submitting it (a bad
	// argument found on this rank alone: an unsupported dtype, splits that do not add up): the
	// rank still takes its turn, so that the op fails on every rank with this reason instead of
	// leaving the others waiting for it. Such a request is never cached, and only Name, Kind and
	// Group need be set.
	Error string
}

// Cause is why the ops of an error Response failed, for the bindings to raise what Horovod raises
// for each: a precondition error for an op the ranks disagreed on (tf.errors.FailedPreconditionError
// in horovod.tensorflow), an internal error for one that a rank will never submit.
type Cause uint8

const (
	// Failed: a rank that should submit the op never will (it ended, or stalled past the
	// deadline, or its calls went another way), or the ranks' caches disagree (a kolo bug).
	Failed Cause = iota
	// Mismatch: every rank needed is there, but the op cannot run as they submitted it: they
	// disagree on it (kind, group, dtype, device, shape, reduce op, scale factors, root, splits),
	// a rank refused its arguments or submitted it twice, or it cannot run with ranks that joined.
	// The job goes on.
	Mismatch
)

func (c Cause) String() string {
	switch c {
	case Failed:
		return "failed"
	case Mismatch:
		return "mismatch"
	}
	return fmt.Sprintf("cause(%d)", uint8(c))
}

// NoCacheID in Response.CacheIDs means the tensor got no cache id (cache full or disabled, or a
// rank had joined).
const NoCacheID = ^uint32(0)

// Response is one entry of the ordered stream that every rank executes: a fused group of ready ops,
// an error that every rank reports for the named ops, or the completion of Join. Responses the
// Coordinator returns share slices with its cache: treat them as read-only.
type Response struct {
	// Seq is the response's 1-based position in the stream; Cache.Learn checks that none is lost.
	Seq uint64
	// Kind is the collective (for an error, the kind the lowest submitting rank asked for).
	Kind OpKind
	// Names are the tensors of this fused group, in the order to lay them out in the fusion buffer.
	Names []string
	// Error, when non-empty, is the message every rank fails Names with. An error about an unknown
	// cache id has no Names but CacheIDs: Cache.Learn fills Names from the local cache.
	Error string
	// Ended, with Error, are the ranks (of the job) that ended without submitting Names: they
	// reached shutdown while the others still needed them, the cause of the error.
	Ended []int
	// Cause, with Error, is what kind of failure it is (see Cause).
	Cause Cause

	// The fields below are common to every tensor of the group.

	// DType is the element type (none for Barrier and Join).
	DType dtype.DType
	// ReduceOp and Average are as in Request (Allreduce, ReduceScatter).
	ReduceOp uint8
	Average  bool
	// GPU is as in Request (every kind that moves data).
	GPU bool
	// PreScale and PostScale are as in Request, with 0 already replaced by 1.
	PreScale, PostScale float64
	// Root is the Broadcast root.
	Root int
	// Group and GroupSize are as in Request (0 for ungrouped ops).
	Group     int64
	GroupSize int

	// Shapes[i] is the shape of Names[i]. For Allgather, dim 0 is the total over all ranks (the
	// output's shape); for Alltoall, dim 0 is the total rows over all ranks' inputs.
	Shapes [][]int64
	// Dim0, for Allgather, is Dim0[i][r]: the rows rank r contributes to Names[i] (0 for a joined
	// rank). Nil for other kinds.
	Dim0 [][]int64
	// Splits, for Alltoall (never fused: one name), is Splits[src][dst]: rows src sends to dst, with
	// equal splits written out. Nil for other kinds.
	Splits [][]int64
	// Joined lists, ascending, the ranks that had joined without submitting these ops: their
	// executors contribute zeros/identity (Allreduce, ReduceScatter) or nothing (Allgather).
	Joined []int
	// LastJoined, for a Join response, is the rank whose Join completed the set.
	LastJoined int

	// CacheIDs[i] is the cache id that from now on stands for Names[i]'s signature on every rank
	// (NoCacheID: none). Nil when no name has one.
	CacheIDs []uint32
	// Evict lists the cache ids every rank drops before learning CacheIDs.
	Evict []uint32
	// Resync, on the error of calls that went different ways (Config.StallCrossed), is the number
	// past every unnamed op ("noname.<N>") pending in the set when it failed: each rank's count of
	// unnamed ops moves up to it, so that ranks whose counts drifted apart (one skipped an unnamed
	// call) name their next unnamed calls alike again. 0: none.
	Resync uint64
	// FromCache says that every tensor was negotiated from a cache entry every rank already holds,
	// unchanged: the codec then sends only CacheIDs, and Cache.Learn fills in the rest.
	FromCache bool
	// Tune, in a Retune response, is the collective settings every rank runs the responses after
	// it under.
	Tune Collectives
}

// Collectives are the settings by which the collectives choose and pace their algorithms. Unlike
// the fusion threshold or cycle time, which only change how ops are grouped or when they are
// negotiated, every rank must use the same ones for each op, or ranks would run different
// algorithms against each other: so they change only through a Retune response, at one point of
// the response stream that every rank executes in the same order.
type Collectives struct {
	// SmallAllreduceBytes: allreduces of fewer bytes use recursive doubling, larger ones the
	// shared-memory slots or the ring (collective.Tuning); 0: the default.
	SmallAllreduceBytes int64
	// SharedRoundBytes caps the bytes per rank per round of the shared-memory algorithms
	// (collective.Tuning); 0: the default.
	SharedRoundBytes int64
	// Hierarchical is the two-level allreduce (shared memory in hosts, TCP across).
	Hierarchical bool
}

// MaxCollectiveBytes bounds Collectives' byte sizes on the wire.
const MaxCollectiveBytes = 1 << 40

// Stall reports an op that some ranks submitted and others, for a while, have not (or a grouped op
// waiting for the rest of its group). The engine logs it; Fatal ones were also failed with an error
// Response.
type Stall struct {
	Name string
	Kind OpKind
	// Ready are the ranks that submitted the op; Missing those that did not (joined ranks are in
	// neither).
	Ready, Missing []int
	// Since is how long the op has waited.
	Since time.Duration
	// Fatal: the op waited StallShutdown and has been failed.
	Fatal bool
	// Reason explains a stall that is not about missing ranks (a group short of members).
	Reason string
	// Set is the op's process set (0: the global set); the Hub fills it in.
	Set int
}

func (s Stall) String() string {
	fatal := ""
	if s.Fatal {
		fatal = " (fatal)"
	}
	in := ""
	if s.Set != 0 {
		in = fmt.Sprintf(" in process set %d", s.Set)
	}
	if s.Reason != "" {
		return fmt.Sprintf("stall%s %s %q%s after %v: %s", fatal, s.Kind, s.Name, in, s.Since, s.Reason)
	}
	return fmt.Sprintf("stall%s %s %q%s after %v: missing %s; submitted by %s", fatal, s.Kind, s.Name, in,
		s.Since, rankWord(s.Missing), rankWord(s.Ready))
}

// Config tunes a Coordinator. The zero value of each field picks its default.
type Config struct {
	// Size is the number of ranks (required, >= 1).
	Size int
	// FusionBytes caps the bytes of one fused response (default 128 MiB; negative: never fuse).
	// A single tensor larger than the cap goes alone; a group ignores it.
	FusionBytes int64
	// CacheCapacity is the number of live response-cache entries (default 1024; negative:
	// no cache). Every rank's Cache must be made with the same value.
	CacheCapacity int
	// StallWarning is how long an op may wait for missing ranks before a Stall is reported, and
	// then again every StallWarning (default 60 s; negative: never).
	StallWarning time.Duration
	// StallShutdown, when positive, is how long an op may wait before it is failed.
	StallShutdown time.Duration
	// StallCrossed, when positive, is how long an op may wait while every rank missing from it
	// has ops of its own pending that the op's submitters lack, and has submitted nothing
	// meanwhile: the ranks' calls went different ways (one raised and moved on, a conditional
	// call), and no later submission will reconcile them. Such ops fail with an error naming
	// what each rank waits on. It is checked with the stall inspector, even when warnings are
	// off.
	StallCrossed time.Duration
	// Ranks, for the Coordinator of a process set, is the job rank of each of its Size ranks
	// (ascending). The Coordinator works in the set's own ranks 0..Size-1, as do its Requests and
	// Responses (Root, Splits, Dim0, Joined); only what it writes for people (error messages and
	// Stall's Ready and Missing) names job ranks, the processes users know. nil: the identity.
	Ranks []int
}

// Defaults, as horovod's.
const (
	DefaultFusionBytes   = 128 << 20
	DefaultCacheCapacity = 1024
	DefaultStallWarning  = 60 * time.Second
)

func (c Config) withDefaults() Config {
	if c.FusionBytes == 0 {
		c.FusionBytes = DefaultFusionBytes
	}
	if c.CacheCapacity == 0 {
		c.CacheCapacity = DefaultCacheCapacity
	}
	c.CacheCapacity = min(c.CacheCapacity, MaxCacheIDs/2)
	if c.StallWarning == 0 {
		c.StallWarning = DefaultStallWarning
	}
	return c
}

// cacheIDLimit bounds the ids a cache of the given capacity uses. Ids are reused only after every
// rank has learned of their eviction, so the id space is twice the live capacity to leave room for
// evicted ids still waiting for that.
func cacheIDLimit(capacity int) uint32 {
	if capacity <= 0 {
		return 0
	}
	if capacity > MaxCacheIDs/2 {
		capacity = MaxCacheIDs / 2
	}
	return uint32(2 * capacity)
}

// formatRanks writes ranks as "0,2,5-9": runs of three or more collapse to a range.
func formatRanks(ranks []int) string {
	var b strings.Builder
	for i := 0; i < len(ranks); {
		j := i
		for j+1 < len(ranks) && ranks[j+1] == ranks[j]+1 {
			j++
		}
		if b.Len() > 0 {
			b.WriteByte(',')
		}
		switch {
		case j-i >= 2:
			fmt.Fprintf(&b, "%d-%d", ranks[i], ranks[j])
		case j == i+1:
			fmt.Fprintf(&b, "%d,%d", ranks[i], ranks[j])
		default:
			fmt.Fprintf(&b, "%d", ranks[i])
		}
		i = j + 1
	}
	return b.String()
}

// jobRanks maps a Coordinator's ranks to the job ranks its messages name (Config.Ranks); nil is
// the identity.
type jobRanks []int

func (j jobRanks) of(r int) int {
	if r >= 0 && r < len(j) {
		return j[r]
	}
	return r
}

func (j jobRanks) all(ranks []int) []int {
	if j == nil {
		return ranks
	}
	out := make([]int, len(ranks))
	for i, r := range ranks {
		out[i] = j.of(r)
	}
	return out
}

// word is rankWord in job ranks.
func (j jobRanks) word(ranks []int) string { return rankWord(j.all(ranks)) }

// rankWord writes "rank 3" or "ranks 0,2".
func rankWord(ranks []int) string {
	if len(ranks) == 1 {
		return fmt.Sprintf("rank %d", ranks[0])
	}
	return "ranks " + formatRanks(ranks)
}

func formatShape(s []int64) string {
	var b strings.Builder
	b.WriteByte('[')
	for i, d := range s {
		if i > 0 {
			b.WriteByte(' ')
		}
		fmt.Fprintf(&b, "%d", d)
	}
	b.WriteByte(']')
	return b.String()
}
