// Package bench measures kolo's collectives the way nccl-tests does (size, count, median time,
// algorithm bandwidth, bus bandwidth) with warm buffers, and renders the table or JSON.
//
// It runs inside an initialised kolo process (one per rank); the kolo CLI starts the ranks. It must
// not start processes itself.
package bench

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/kolo-dl/kolo"
	"github.com/kolo-dl/kolo/internal/dtype"
	"github.com/kolo-dl/kolo/internal/engine"
)

// Ops lists the collectives bench can measure.
var Ops = []string{"allreduce", "allgather", "broadcast", "alltoall", "reducescatter", "barrier"}

// Config is one benchmark run.
type Config struct {
	Op     string
	Sizes  []int64 // bytes per rank's input
	DType  dtype.DType
	Iters  int
	Warmup int
	Check  bool
}

// Result is one row of the table.
type Result struct {
	Bytes     int64   `json:"bytes"`
	Count     int64   `json:"count"`
	MedianUS  float64 `json:"median_us"`
	AlgBW     float64 `json:"algbw_GBps"`
	BusBW     float64 `json:"busbw_GBps"`
	CheckedOK *bool   `json:"check_ok,omitempty"`
}

// Report is the JSON document --json writes.
type Report struct {
	Op      string   `json:"op"`
	NP      int      `json:"np"`
	DType   string   `json:"dtype"`
	Iters   int      `json:"iters"`
	Results []Result `json:"results"`
	Startup *Startup `json:"startup,omitempty"`
}

// Startup is what joining the job cost, for the scaling table (bench/scaling.py).
type Startup struct {
	// InitSeconds is the slowest rank's kolo.Init: rendezvous, shared memory, connections.
	InitSeconds float64 `json:"init_s"`
	// FirstAllreduceUnixNano is when rank 0's first allreduce (4 bytes) returned: the script that
	// launched the job takes its own start time from it.
	FirstAllreduceUnixNano int64 `json:"first_allreduce_unix_ns"`
	// Sockets is the most sockets any rank holds once connected (rendezvous client, listener, and
	// every TCP connection to a peer): the connections per rank.
	Sockets int `json:"sockets_max"`
	// SocketsOthers is the most sockets a rank other than rank 0 holds: rank 0 coordinates the
	// negotiation, so it talks to every rank, while the others talk to those their algorithms
	// use.
	SocketsOthers int `json:"sockets_max_not_rank0"`
	// SocketsEnd and SocketsOthersEnd are the same once the benchmark ran: a lazy mesh (the
	// default) connects the peers an algorithm needs when it first runs.
	SocketsEnd       int `json:"sockets_max_end"`
	SocketsOthersEnd int `json:"sockets_max_not_rank0_end"`
}

// maxima returns, for each of vals, its largest value over the ranks (one allreduce).
func maxima(ctx context.Context, name string, vals ...float64) ([]float64, error) {
	buf := make([]byte, 8*len(vals))
	for i, v := range vals {
		binary.LittleEndian.PutUint64(buf[8*i:], math.Float64bits(v))
	}
	t := kolo.Tensor{Data: buf, DType: dtype.Float64, Shape: []int64{int64(len(vals))}}
	if err := kolo.Allreduce(ctx, name, t, kolo.Max); err != nil {
		return nil, err
	}
	out := make([]float64, len(vals))
	for i := range out {
		out[i] = math.Float64frombits(binary.LittleEndian.Uint64(buf[8*i:]))
	}
	return out, nil
}

// sockets is this rank's open sockets, twice: for the maximum over every rank, and for the
// maximum over the ranks but rank 0 (which counts 0 there).
func sockets() (all, notRank0 float64) {
	n := float64(countSockets())
	if kolo.Rank() == 0 {
		return n, 0
	}
	return n, n
}

// MeasureSocketsEnd fills s.SocketsEnd and s.SocketsOthersEnd.
func MeasureSocketsEnd(ctx context.Context, s *Startup) error {
	all, others := sockets()
	m, err := maxima(ctx, "bench.sockets.end", all, others)
	if err != nil {
		return fmt.Errorf("gather the sockets held at the end: %w", err)
	}
	s.SocketsEnd, s.SocketsOthersEnd = int(m[0]), int(m[1])
	return nil
}

// MeasureStartup completes s after kolo.Init, which took initTook on this rank: the first
// allreduce, then the slowest rank's figures (one more allreduce).
func MeasureStartup(ctx context.Context, initTook time.Duration) (*Startup, error) {
	one := kolo.Tensor{Data: make([]byte, 4), DType: dtype.Float32, Shape: []int64{1}}
	if err := kolo.Allreduce(ctx, "bench.startup.first", one, kolo.Sum); err != nil {
		return nil, fmt.Errorf("first allreduce: %w", err)
	}
	s := &Startup{FirstAllreduceUnixNano: time.Now().UnixNano()}
	all, others := sockets()
	m, err := maxima(ctx, "bench.startup.max", initTook.Seconds(), all, others)
	if err != nil {
		return nil, fmt.Errorf("gather start-up figures: %w", err)
	}
	s.InitSeconds, s.Sockets, s.SocketsOthers = m[0], int(m[1]), int(m[2])
	return s, nil
}

// countSockets counts this process's open sockets (0 where /proc is missing).
func countSockets() int {
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return 0
	}
	n := 0
	for _, fd := range fds {
		if l, err := os.Readlink("/proc/self/fd/" + fd.Name()); err == nil && strings.HasPrefix(l, "socket:") {
			n++
		}
	}
	return n
}

// ParseSizes reads "4,4KiB,256KiB,4MiB,64MiB".
func ParseSizes(s string) ([]int64, error) {
	var out []int64
	for _, f := range strings.Split(s, ",") {
		if strings.TrimSpace(f) == "" {
			continue
		}
		n, err := engine.ParseBytes(f)
		if err != nil {
			return nil, fmt.Errorf("size %q: %w", f, err)
		}
		out = append(out, n)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no sizes in %q", s)
	}
	return out, nil
}

// busFactor converts algorithm bandwidth to bus bandwidth (nccl-tests' definitions).
func busFactor(op string, n int) float64 {
	if n <= 1 {
		return 1
	}
	f := float64(n-1) / float64(n)
	switch op {
	case "allreduce":
		return 2 * f
	case "allgather", "reducescatter", "alltoall":
		return f
	}
	return 1 // broadcast
}

// Run measures every size on this rank; every rank must call it with the same Config. Timing is
// the median over iterations of one blocking op, each starting together after a barrier-free
// warm-up (back-to-back ops keep ranks aligned, as nccl-tests does).
func Run(ctx context.Context, cfg Config) ([]Result, error) {
	if cfg.Iters <= 0 {
		cfg.Iters = 20
	}
	if cfg.Warmup <= 0 {
		cfg.Warmup = 3
	}
	n := kolo.Size()
	rank := kolo.Rank()
	es := int64(cfg.DType.Size())
	if cfg.Op == "barrier" {
		// No data: one row, the barrier's latency (negotiation and the barrier itself).
		cfg.Sizes, cfg.Check = []int64{0}, false
	}
	var results []Result
	for _, size := range cfg.Sizes {
		count := size / es
		if cfg.Op == "alltoall" || cfg.Op == "reducescatter" {
			count = count / int64(n) * int64(n) // every rank gets the same share of dim 0
		}
		in := make([]byte, count*es)
		fill(in, rank)
		t := kolo.Tensor{Data: in, DType: cfg.DType, Shape: []int64{count}}
		if err := kolo.Barrier(ctx); err != nil {
			return nil, err
		}
		times := make([]float64, 0, cfg.Iters)
		for it := 0; it < cfg.Warmup+cfg.Iters; it++ {
			name := fmt.Sprintf("bench.%s.%d", cfg.Op, size)
			start := time.Now()
			var err error
			switch cfg.Op {
			case "allreduce":
				err = kolo.Allreduce(ctx, name, t, kolo.Sum)
			case "allgather":
				_, err = kolo.Allgather(ctx, name, t)
			case "broadcast":
				err = kolo.Broadcast(ctx, name, t, 0)
			case "alltoall":
				_, _, err = kolo.Alltoall(ctx, name, t, nil)
			case "reducescatter":
				_, err = kolo.ReduceScatter(ctx, name, t, kolo.Sum)
			case "barrier":
				err = kolo.Barrier(ctx)
			default:
				return nil, fmt.Errorf("unknown op %q (want one of %v)", cfg.Op, Ops)
			}
			el := time.Since(start)
			if err != nil {
				return nil, fmt.Errorf("%s of %d bytes, iteration %d: %w", cfg.Op, size, it, err)
			}
			if it >= cfg.Warmup {
				times = append(times, float64(el.Nanoseconds())/1e3)
			}
		}
		sort.Float64s(times)
		med := times[len(times)/2]
		r := Result{Bytes: int64(len(t.Data)), Count: int64(len(t.Data)) / es, MedianUS: med}
		if med > 0 {
			r.AlgBW = float64(r.Bytes) / (med * 1e3)
			r.BusBW = r.AlgBW * busFactor(cfg.Op, n)
		}
		if cfg.Check {
			ok, err := check(ctx, cfg, t.Shape[0], rank, n)
			if err != nil {
				return nil, err
			}
			r.CheckedOK = &ok
		}
		results = append(results, r)
	}
	return results, nil
}

// fill writes small random bytes: the timing does not depend on values, only on the buffer being
// touched (warm) before the first timed op.
func fill(b []byte, rank int) {
	r := rand.New(rand.NewPCG(uint64(rank), 7))
	for i := range b {
		b[i] = byte(r.IntN(4))
	}
}

// check runs one allreduce/broadcast/allgather on known values and verifies the result.
func check(ctx context.Context, cfg Config, rows int64, rank, n int) (bool, error) {
	if cfg.DType != dtype.Float32 {
		return true, nil // exactness checks are table tests' job; bench checks the float32 path
	}
	vals := make([]float32, rows)
	for i := range vals {
		vals[i] = float32(rank + 1)
	}
	t := kolo.Of(vals)
	name := fmt.Sprintf("bench.check.%s.%d", cfg.Op, rows)
	switch cfg.Op {
	case "allreduce":
		if err := kolo.Allreduce(ctx, name, t, kolo.Sum); err != nil {
			return false, err
		}
		want := float32(n * (n + 1) / 2)
		for _, v := range vals {
			if v != want {
				return false, nil
			}
		}
	case "broadcast":
		if err := kolo.Broadcast(ctx, name, t, 0); err != nil {
			return false, err
		}
		for _, v := range vals {
			if v != 1 {
				return false, nil
			}
		}
	default:
		return true, nil
	}
	return true, nil
}

// Print renders results as the nccl-tests-style table.
func Print(w io.Writer, cfg Config, np int, results []Result) {
	fmt.Fprintf(w, "# kolo bench %s  np=%d  dtype=%v  iters=%d  (median per op, warm buffers)\n", cfg.Op, np, cfg.DType, cfg.Iters)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "size\tcount\tmedian us\talgbw GB/s\tbusbw GB/s\tcheck\t")
	for _, r := range results {
		chk := "-"
		if r.CheckedOK != nil {
			chk = map[bool]string{true: "ok", false: "FAIL"}[*r.CheckedOK]
		}
		fmt.Fprintf(tw, "%s\t%d\t%.1f\t%.2f\t%.2f\t%s\t\n", HumanBytes(r.Bytes), r.Count, r.MedianUS, r.AlgBW, r.BusBW, chk)
	}
	tw.Flush()
}

// WriteJSON writes the --json report; st may be nil.
func WriteJSON(path string, cfg Config, np int, results []Result, st *Startup) error {
	b, err := json.MarshalIndent(Report{Op: cfg.Op, NP: np, DType: cfg.DType.String(), Iters: cfg.Iters, Results: results, Startup: st}, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}

// HumanBytes prints 4096 as "4KiB".
func HumanBytes(n int64) string {
	switch {
	case n >= 1<<30 && n%(1<<30) == 0:
		return strconv.FormatInt(n>>30, 10) + "GiB"
	case n >= 1<<20 && n%(1<<20) == 0:
		return strconv.FormatInt(n>>20, 10) + "MiB"
	case n >= 1<<10 && n%(1<<10) == 0:
		return strconv.FormatInt(n>>10, 10) + "KiB"
	}
	return strconv.FormatInt(n, 10) + "B"
}
