// Package kolo is the public Go API of kolo, a distributed data-parallel training system: Init joins
// the job the launcher (kolo run, mpirun or Slurm) started this process in, and the collectives
// (Allreduce, Allgather, Broadcast, Alltoall, ReduceScatter, Barrier, Join) run across every rank,
// matched by name, fused and executed by the background engine.
//
// Each collective has a blocking form taking a context and an Async form returning a *Handle. A
// process without a launcher environment is a world of size 1. This package is a thin layer over
// the engine: it must not contain negotiation or transport logic.
package kolo

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"math"
	"os"
	"runtime"
	"sync"

	"github.com/kolo-dl/kolo/bootstrap"
	"github.com/kolo-dl/kolo/dtype"
	"github.com/kolo-dl/kolo/engine"
	"github.com/kolo-dl/kolo/engine/negotiate"
	"github.com/kolo-dl/kolo/internal/spin"
	"github.com/kolo-dl/kolo/jobenv"
	"github.com/kolo-dl/kolo/reduce"
	"github.com/kolo-dl/kolo/version"
	"github.com/kolo-dl/kolo/world"
)

// Version is kolo's version; the launcher and the library check they match.
const Version = version.Version

// Op is a reduction.
type Op int

// The reductions, numbered as horovod.torch numbers them (Average=0, Sum=1, Adasum=2, Min=3,
// Max=4, Product=5) so the C ABI can pass them through.
const (
	Average Op = 0
	Sum     Op = 1
	Min     Op = 3
	Max     Op = 4
	Product Op = 5
)

func (o Op) String() string {
	switch o {
	case Average:
		return "average"
	case Sum:
		return "sum"
	case Min:
		return "min"
	case Max:
		return "max"
	case Product:
		return "product"
	}
	return fmt.Sprintf("op(%d)", int(o))
}

// ErrNotInitialized is returned by every call before Init or after Shutdown.
var ErrNotInitialized = errors.New("kolo is not initialized: call kolo.Init first")

type state struct {
	job    jobenv.Job
	boot   *bootstrap.Session // rank 0 under mpirun/srun hosts the rendezvous here
	world  *world.World
	engine *engine.Engine
	names  *namer
}

var (
	mu  sync.Mutex
	cur *state
)

// Option adjusts Init.
type Option func(*initOptions)

type initOptions struct {
	env      func(string) string
	world    world.Options
	engine   *engine.Config
	cpuShare bool
}

// WithEngineConfig overrides the engine settings read from the environment.
func WithEngineConfig(c engine.Config) Option { return func(o *initOptions) { o.engine = &c } }

// WithWorldOptions sets connection options (timeouts, streams, shared memory).
func WithWorldOptions(w world.Options) Option { return func(o *initOptions) { o.world = w } }

// WithCPUShare is for a process whose Go runtime runs nothing but kolo, as in a Python rank (the
// binding asks for it): unless GOMAXPROCS is set, Init limits the runtime to this rank's share of
// the host's CPUs (CPUs / local ranks, at least 1), as binding the rank to its own cores would.
// With every CPU, the runtime's threads of each rank (the engine's driver, the scheduler's
// monitor) run wherever a CPU is free, beside every local rank's training threads, and preempt
// them: 2 ranks on 2 CPUs trained 3-4% slower (docs/benchmarks.md). A Go
// program that uses kolo keeps its GOMAXPROCS for its own goroutines.
func WithCPUShare() Option { return func(o *initOptions) { o.cpuShare = true } }

// Init joins the job described by the environment. Calling it twice is an error.
func Init(opts ...Option) error {
	mu.Lock()
	defer mu.Unlock()
	if cur != nil {
		return errors.New("kolo.Init called twice")
	}
	o := initOptions{env: os.Getenv}
	for _, f := range opts {
		f(&o)
	}
	if v := o.env(jobenv.LauncherVersion); v != "" && v != Version {
		return fmt.Errorf("kolo.Init: this process uses kolo %s but was started by kolo run %s; install one version of both (the kolo wheel carries a matching kolo command)", Version, v)
	}
	env := jobenv.FromEnviron(os.Environ())
	if err := applyLogLevel(env[jobenv.LogLevel]); err != nil {
		return fmt.Errorf("kolo.Init: %w", err)
	}
	cfg := engine.DefaultConfig()
	if o.engine != nil {
		cfg = *o.engine
	} else {
		var err error
		if cfg, err = engine.ConfigFromEnv(o.env); err != nil {
			return fmt.Errorf("kolo.Init: %w", err)
		}
	}
	if o.world.Timeout == 0 {
		o.world.Timeout = cfg.SetupTimeout
	}
	if o.world.Interface == "" {
		o.world.Interface, _ = jobenv.Interface(map[string]string{
			jobenv.NetworkInterface:        o.env(jobenv.NetworkInterface),
			jobenv.HorovodNetworkInterface: o.env(jobenv.HorovodNetworkInterface),
		})
	}
	// kolo run, mpirun or srun: who started this process decides where the ranks meet.
	hn, _ := os.Hostname()
	boot, err := bootstrap.Join(context.Background(), env, hn, bootstrap.Options{Timeout: o.world.Timeout})
	if err != nil {
		return fmt.Errorf("kolo.Init: %w", err)
	}
	cfg, o.world = spinSettings(cfg, o.world, boot.Job.LocalSize)
	if o.cpuShare && o.env("GOMAXPROCS") == "" {
		shareCPUs(boot.Job.LocalSize)
	}
	w, err := world.Connect(context.Background(), boot.Job, boot.Secret, o.world)
	if err != nil {
		boot.Close()
		return fmt.Errorf("kolo.Init: %w", err)
	}
	job := w.Job // with the cross rank derived where the launcher could not say it
	e, err := engine.New(cfg, engine.Group{
		Rank: job.Rank, Size: job.Size, Hosts: w.Hosts, Comm: w.Comm, Messenger: w.Messenger,
		Local: w.Local, LocalRanks: w.LocalRanks, Cross: w.Cross, Abort: w.Abort,
	})
	if err != nil {
		w.Close()
		boot.Close()
		return fmt.Errorf("kolo.Init: %w", err)
	}
	cur = &state{job: job, boot: boot, world: w, engine: e, names: newNamer()}
	return nil
}

// shareCPUs lowers GOMAXPROCS to this rank's share of the host's CPUs (see WithCPUShare); it never
// raises it above what the runtime chose (the CPUs this process may run on).
func shareCPUs(localSize int) {
	n := max(1, spin.HostCPUs()/max(1, localSize))
	if cur := runtime.GOMAXPROCS(0); n < cur {
		runtime.GOMAXPROCS(n)
		slog.Debug("kolo: GOMAXPROCS set to this rank's share of the host's CPUs", "from", cur, "to", n,
			"host_cpus", spin.HostCPUs(), "local_ranks", localSize)
	}
}

// spinSettings settles how long this rank's waits poll. A Spin left unset (negative, as in
// engine.DefaultConfig and in ConfigFromEnv without KOLO_SPIN_TIME) becomes the host's default,
// and the shared-memory waits keep theirs. A Spin given (KOLO_SPIN_TIME, or a Config that sets it)
// governs the shared-memory waits too, unless the world options set ShmSpin themselves: 0 means
// never to spin there as here (for shm.Config.Spin 0 would mean its default).
func spinSettings(cfg engine.Config, w world.Options, localSize int) (engine.Config, world.Options) {
	if cfg.Spin < 0 {
		cfg.Spin = engine.DefaultSpin(localSize)
		cfg.Yields = engine.DefaultYields(localSize)
		return cfg, w
	}
	if w.ShmSpin == 0 {
		w.ShmSpin = cfg.Spin
		if cfg.Spin == 0 {
			w.ShmSpin = -1
		}
	}
	return cfg, w
}

// applyLogLevel sets the level of slog's default logger from KOLO_LOG_LEVEL (kolo run
// --log-level), unless the program installed its own default logger, whose level is its own.
func applyLogLevel(level string) error {
	if level == "" {
		return nil
	}
	l, err := jobenv.ParseLogLevel(level)
	if err != nil {
		return fmt.Errorf("%s: %w", jobenv.LogLevel, err)
	}
	if slog.Default().Handler() == builtinLogHandler {
		slog.SetLogLoggerLevel(l)
	}
	return nil
}

// builtinLogHandler is slog's default handler before any program changes it.
var builtinLogHandler = slog.Default().Handler()

// Shutdown waits until every rank reaches Shutdown (so no rank leaves while others still need it),
// then stops the engine and closes connections.
func Shutdown() error {
	mu.Lock()
	s := cur
	cur = nil
	mu.Unlock()
	if s == nil {
		return nil
	}
	err := s.engine.Shutdown(context.Background())
	if cerr := s.world.Close(); err == nil {
		err = cerr
	}
	if cerr := s.boot.Close(); err == nil {
		err = cerr
	}
	return err
}

// Abort tells every rank that this one has failed outside kolo, and why: this rank's pending and
// later ops fail with "rank N failed: <err>", and so do the other ranks', instead of waiting for
// this process to vanish and reporting "rank N lost" (kolo run follows that naming to this rank's
// own error when it reports the job's failure). Call it before exiting on an error the
// program cannot recover from (the Python binding calls it for an uncaught exception). The job
// stays initialized; Shutdown still releases it. Without Init it does nothing.
func Abort(err error) {
	s, gerr := get()
	if gerr != nil || err == nil {
		return
	}
	s.engine.Abort(fmt.Errorf("rank %d failed: %w", s.job.Rank, err))
}

// IsInitialized reports whether Init has run (and Shutdown has not).
func IsInitialized() bool {
	mu.Lock()
	defer mu.Unlock()
	return cur != nil
}

func get() (*state, error) {
	mu.Lock()
	defer mu.Unlock()
	if cur == nil {
		return nil, ErrNotInitialized
	}
	return cur, nil
}

func jobOr(f func(jobenv.Job) int) int {
	s, err := get()
	if err != nil {
		return -1
	}
	return f(s.job)
}

// Rank is this process's index in the job, or -1 before Init.
func Rank() int { return jobOr(func(j jobenv.Job) int { return j.Rank }) }

// Size is the number of ranks, or -1 before Init.
func Size() int { return jobOr(func(j jobenv.Job) int { return j.Size }) }

// LocalRank is the index among the ranks of this host.
func LocalRank() int { return jobOr(func(j jobenv.Job) int { return j.LocalRank }) }

// LocalSize is the number of ranks on this host.
func LocalSize() int { return jobOr(func(j jobenv.Job) int { return j.LocalSize }) }

// CrossRank is this host's index among the hosts that run a rank with this LocalRank.
func CrossRank() int { return jobOr(func(j jobenv.Job) int { return j.CrossRank }) }

// CrossSize is the number of hosts that run a rank with this LocalRank.
func CrossSize() int { return jobOr(func(j jobenv.Job) int { return j.CrossSize }) }

// IsHomogeneous reports whether every host runs the same number of ranks (false before Init).
func IsHomogeneous() bool {
	s, err := get()
	if err != nil {
		return false
	}
	perHost := map[string]int{}
	for _, h := range s.world.Hosts {
		perHost[h]++
	}
	for _, n := range perHost {
		if n != s.job.LocalSize {
			return false
		}
	}
	return true
}

// Tensor is a dense, contiguous, row-major array of Shape (in elements) and DType held in Data.
type Tensor struct {
	Data  []byte
	DType dtype.DType
	Shape []int64
}

// NumElements is the product of Shape (1 for a scalar).
func (t Tensor) NumElements() int64 {
	n := int64(1)
	for _, d := range t.Shape {
		n *= d
	}
	return n
}

// check reports what is inconsistent in t; callers say which tensor it is (no formatting on the
// fast path).
func (t Tensor) check() error {
	if !t.DType.Valid() {
		return fmt.Errorf("invalid dtype %v", t.DType)
	}
	want, err := dtype.Bytes(t.DType, t.Shape)
	if err != nil {
		return err // a negative dimension, or more bytes than any memory holds: never wrapped to fit
	}
	if int64(len(t.Data)) != want {
		return fmt.Errorf("shape %v of %v needs %d bytes, data has %d", t.Shape, t.DType, want, len(t.Data))
	}
	return nil
}

// OpOption adjusts one collective.
type OpOption func(*negotiate.Request)

// Prescale multiplies the input by f before reducing.
func Prescale(f float64) OpOption { return func(r *negotiate.Request) { r.PreScale *= f } }

// Postscale multiplies the result by f after reducing.
func Postscale(f float64) OpOption { return func(r *negotiate.Request) { r.PostScale *= f } }

// Handle is the future of an async collective.
type Handle struct {
	h     *engine.Handle
	out   Tensor // where the result lands (allreduce, broadcast) or its dtype/shape template
	kind  negotiate.OpKind
	size  int
	early error
}

// Wait blocks until the op completes or ctx ends.
func (h *Handle) Wait(ctx context.Context) error {
	if h.early != nil {
		return h.early
	}
	return h.h.Wait(ctx)
}

// Poll reports whether the op completed.
func (h *Handle) Poll() bool { return h.early != nil || h.h.Poll() }

// Err is the op's error once complete.
func (h *Handle) Err() error {
	if h.early != nil {
		return h.early
	}
	return h.h.Err()
}

// Tensor is the op's result: for allreduce and broadcast the output tensor given at submission;
// for allgather, alltoall and reducescatter a new tensor. Valid after a successful Wait.
func (h *Handle) Tensor() Tensor {
	switch h.kind {
	case negotiate.Allgather, negotiate.Alltoall, negotiate.ReduceScatter:
		data := h.h.Output()
		t := Tensor{Data: data, DType: h.out.DType, Shape: append([]int64(nil), h.out.Shape...)}
		row := int64(t.DType.Size())
		for _, d := range t.Shape[1:] {
			row *= d
		}
		if len(t.Shape) > 0 && row > 0 {
			t.Shape[0] = int64(len(data)) / row
		}
		return t
	}
	return h.out
}

// RecvSplits is, for alltoall, the number of rows received from each rank.
func (h *Handle) RecvSplits() []int64 { return h.h.RecvSplits() }

// JoinLast is, for Join, the last rank to join.
func (h *Handle) JoinLast() int { return h.h.JoinLast() }

func failed(err error) *Handle { return &Handle{early: err} }

func submit(kind negotiate.OpKind, name string, in, out Tensor, op Op, root int, splits []int64, opts []OpOption) *Handle {
	s, err := get()
	if err != nil {
		return failed(err)
	}
	p, err := s.prepare(kind, name, in, out, op, root, splits, opts)
	if err != nil {
		return failed(err)
	}
	return s.enqueue(p)
}

// prepared is an op checked and named on this rank, ready for the engine.
type prepared struct {
	req      negotiate.Request
	in       []byte
	outBytes []byte // nil when the engine allocates the result
	out      Tensor
}

func (s *state) prepare(kind negotiate.OpKind, name string, in, out Tensor, op Op, root int, splits []int64, opts []OpOption) (prepared, error) {
	if err := in.check(); err != nil {
		return prepared{}, fmt.Errorf("%s %q input: %w", kind, name, err)
	}
	if len(in.Shape) == 0 && (kind == negotiate.Allgather || kind == negotiate.Alltoall || kind == negotiate.ReduceScatter) {
		return prepared{}, fmt.Errorf("%s %q: needs a tensor with at least one dimension", kind, name)
	}
	req := negotiate.Request{
		Name: name, Kind: kind, DType: in.DType, Shape: append([]int64(nil), in.Shape...),
		Root: root, PreScale: 1, PostScale: 1, Splits: splits,
	}
	if kind == negotiate.Allreduce || kind == negotiate.ReduceScatter {
		switch op {
		case Sum, Average:
			req.ReduceOp = uint8(reduce.Sum)
		case Min:
			req.ReduceOp = uint8(reduce.Min)
		case Max:
			req.ReduceOp = uint8(reduce.Max)
		case Product:
			req.ReduceOp = uint8(reduce.Prod)
		default:
			return prepared{}, fmt.Errorf("%s %q: unsupported reduction %v", kind, name, op)
		}
		if op == Average {
			req.Average = true
		}
	}
	for _, f := range opts {
		f(&req)
	}
	if name == "" { // after the options: names count per process set
		name = s.names.nextIn(req.Set, kind, in.DType, in.Shape)
		req.Name = name
	}
	if math.IsNaN(req.PreScale) || math.IsNaN(req.PostScale) {
		return prepared{}, fmt.Errorf("%s %q: NaN scale factor", kind, name)
	}
	var outBytes []byte
	if kind == negotiate.Allreduce || kind == negotiate.Broadcast {
		if err := out.check(); err != nil {
			return prepared{}, fmt.Errorf("%s %q output: %w", kind, name, err)
		}
		if len(out.Data) != len(in.Data) || out.DType != in.DType {
			return prepared{}, fmt.Errorf("%s %q: output (%d bytes of %v) does not match input (%d bytes of %v)", kind, name, len(out.Data), out.DType, len(in.Data), in.DType)
		}
		outBytes = out.Data
	} else {
		out = Tensor{DType: in.DType, Shape: req.Shape}
	}
	return prepared{req: req, in: in.Data, outBytes: outBytes, out: out}, nil
}

func (s *state) enqueue(p prepared) *Handle {
	return &Handle{h: s.engine.Enqueue(p.req, p.in, p.outBytes), out: p.out, kind: p.req.Kind, size: s.job.Size}
}

// submitGroup submits ops that every rank releases together, once all of them are ready
// everywhere, and fuses only with each other (horovod's grouped ops). If one member is malformed
// none is submitted: the others would wait for it forever.
func submitGroup(kind negotiate.OpKind, name string, ins, outs []Tensor, op Op, opts []OpOption) []*Handle {
	hs := make([]*Handle, len(ins))
	s, err := get()
	var ps []prepared
	if err == nil {
		ps, err = s.prepareGroup(kind, name, ins, outs, op, opts)
	}
	for i := range hs {
		if err != nil {
			hs[i] = failed(err)
		} else {
			hs[i] = s.enqueue(ps[i])
		}
	}
	return hs
}

// prepareGroup names member i name.i, or as an unnamed op when name is empty, and derives the
// group's id from the members' names, so that ranks agree on it without a counter that could drift.
func (s *state) prepareGroup(kind negotiate.OpKind, name string, ins, outs []Tensor, op Op, opts []OpOption) ([]prepared, error) {
	if outs != nil && len(outs) != len(ins) {
		return nil, fmt.Errorf("grouped %s %q: %d outputs for %d inputs", kind, name, len(outs), len(ins))
	}
	ps := make([]prepared, len(ins))
	id := fnv.New64a()
	for i, in := range ins {
		member := ""
		if name != "" {
			member = fmt.Sprintf("%s.%d", name, i)
		}
		var out Tensor
		if outs != nil {
			out = outs[i]
		}
		p, err := s.prepare(kind, member, in, out, op, 0, nil, opts)
		if err != nil {
			return nil, fmt.Errorf("grouped %s %q, tensor %d: %w", kind, name, i, err)
		}
		ps[i] = p
		id.Write([]byte(p.req.Name))
		id.Write([]byte{0})
	}
	group := int64(id.Sum64()>>1) | 1 // non-zero: zero means "no group"
	for i := range ps {
		ps[i].req.Group, ps[i].req.GroupSize = group, len(ps)
	}
	return ps, nil
}

// AllreduceGroupAsync reduces ins[i] into outs[i] (which may be ins[i]) for every i, as one group
// released together (horovod's grouped_allreduce).
func AllreduceGroupAsync(name string, ins, outs []Tensor, op Op, opts ...OpOption) []*Handle {
	if outs == nil {
		outs = ins
	}
	return submitGroup(negotiate.Allreduce, name, ins, outs, op, opts)
}

// AllgatherGroupAsync gathers every tensor of ts as one group (horovod's grouped_allgather).
func AllgatherGroupAsync(name string, ts []Tensor, opts ...OpOption) []*Handle {
	return submitGroup(negotiate.Allgather, name, ts, nil, Sum, opts)
}

// ReduceScatterGroupAsync reduce-scatters every tensor of ts as one group (horovod's
// grouped_reducescatter).
func ReduceScatterGroupAsync(name string, ts []Tensor, op Op, opts ...OpOption) []*Handle {
	return submitGroup(negotiate.ReduceScatter, name, ts, nil, op, opts)
}

// AllreduceAsync reduces in across ranks into out (which may be in itself).
func AllreduceAsync(name string, in, out Tensor, op Op, opts ...OpOption) *Handle {
	return submit(negotiate.Allreduce, name, in, out, op, 0, nil, opts)
}

// Allreduce reduces t in place across ranks.
func Allreduce(ctx context.Context, name string, t Tensor, op Op, opts ...OpOption) error {
	return AllreduceAsync(name, t, t, op, opts...).Wait(ctx)
}

// AllgatherAsync concatenates every rank's t along dim 0 (dim 0 may differ per rank).
func AllgatherAsync(name string, t Tensor, opts ...OpOption) *Handle {
	return submit(negotiate.Allgather, name, t, Tensor{}, Sum, 0, nil, opts)
}

// Allgather is the blocking AllgatherAsync.
func Allgather(ctx context.Context, name string, t Tensor, opts ...OpOption) (Tensor, error) {
	h := AllgatherAsync(name, t, opts...)
	if err := h.Wait(ctx); err != nil {
		return Tensor{}, err
	}
	return h.Tensor(), nil
}

// BroadcastAsync copies root's t into t on every rank (root is a job rank, also in a process set).
func BroadcastAsync(name string, t Tensor, root int, opts ...OpOption) *Handle {
	return submit(negotiate.Broadcast, name, t, t, Sum, root, nil, opts)
}

// Broadcast is the blocking BroadcastAsync.
func Broadcast(ctx context.Context, name string, t Tensor, root int, opts ...OpOption) error {
	return BroadcastAsync(name, t, root, opts...).Wait(ctx)
}

// AlltoallAsync sends splits[r] rows (dim 0) of t to rank r, in rank order, and receives the rows
// every rank sends here. nil splits means an equal split (dim 0 must divide by Size). In a process
// set, splits and the rows received are per member, in rank order.
func AlltoallAsync(name string, t Tensor, splits []int64, opts ...OpOption) *Handle {
	return submit(negotiate.Alltoall, name, t, Tensor{}, Sum, 0, splits, opts)
}

// Alltoall is the blocking AlltoallAsync; it returns the received tensor and rows per source rank.
func Alltoall(ctx context.Context, name string, t Tensor, splits []int64, opts ...OpOption) (Tensor, []int64, error) {
	h := AlltoallAsync(name, t, splits, opts...)
	if err := h.Wait(ctx); err != nil {
		return Tensor{}, nil, err
	}
	return h.Tensor(), h.RecvSplits(), nil
}

// ReduceScatterAsync reduces t across ranks and leaves rank r with its share of dim 0 (ranks
// below dim0 % Size get one extra row, as Horovod splits).
func ReduceScatterAsync(name string, t Tensor, op Op, opts ...OpOption) *Handle {
	return submit(negotiate.ReduceScatter, name, t, Tensor{}, op, 0, nil, opts)
}

// ReduceScatter is the blocking ReduceScatterAsync.
func ReduceScatter(ctx context.Context, name string, t Tensor, op Op, opts ...OpOption) (Tensor, error) {
	h := ReduceScatterAsync(name, t, op, opts...)
	if err := h.Wait(ctx); err != nil {
		return Tensor{}, err
	}
	return h.Tensor(), nil
}

// BarrierAsync completes when every rank (of the process set, with InProcessSet) has called Barrier.
func BarrierAsync(opts ...OpOption) *Handle {
	return submit(negotiate.Barrier, "", Tensor{DType: dtype.Uint8, Shape: []int64{0}}, Tensor{}, Sum, 0, nil, opts)
}

// Barrier blocks until every rank (of the process set, with InProcessSet) has called Barrier.
func Barrier(ctx context.Context, opts ...OpOption) error { return BarrierAsync(opts...).Wait(ctx) }

// JoinAsync says this rank has no more data: other ranks' allreduces go on with this rank
// contributing zeros, until every rank has joined. JoinLast then gives the last rank to join.
func JoinAsync() *Handle {
	return submit(negotiate.Join, "", Tensor{DType: dtype.Uint8, Shape: []int64{0}}, Tensor{}, Sum, 0, nil, nil)
}

// Join is the blocking JoinAsync; it returns the last rank to join.
func Join(ctx context.Context) (int, error) {
	h := JoinAsync()
	if err := h.Wait(ctx); err != nil {
		return -1, err
	}
	return h.JoinLast(), nil
}

// namer gives unnamed ops names that agree across ranks: a name is derived from what the op is
// (kind, dtype, shape) and how many such ops this rank submitted before, never from a global
// counter that drifts when ranks submit other ops in different orders (horovod#2640).
type namer struct {
	mu sync.Mutex
	n  map[string]int
}

func newNamer() *namer { return &namer{n: map[string]int{}} }

func (n *namer) next(kind negotiate.OpKind, t dtype.DType, shape []int64) string {
	return n.nextIn(0, kind, t, shape)
}

// nextIn names an unnamed op of process set `set`.
func (n *namer) nextIn(set int, kind negotiate.OpKind, t dtype.DType, shape []int64) string {
	if (kind == negotiate.Allgather || kind == negotiate.Alltoall) && len(shape) > 0 {
		shape = shape[1:] // ranks may differ in dim 0: it must not change the name
	}
	sig := fmt.Sprintf("%s.%v.%v", kind, t, shape)
	if kind == negotiate.Barrier || kind == negotiate.Join {
		sig = kind.String()
	}
	if set != 0 { // names are matched within a set, and its members are not all the job's ranks
		sig = fmt.Sprintf("set%d.%s", set, sig)
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	i := n.n[sig]
	n.n[sig] = i + 1
	return fmt.Sprintf("%s#%d", sig, i)
}
