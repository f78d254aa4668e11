// Package kolo is the public Go API of kolo, a distributed data-parallel training system: Init joins
// the job the launcher (kolo run, mpirun or Slurm) started this process in, and the collectives
// (Allreduce, Allgather, Broadcast, Alltoall, ReduceScatter, Barrier, Join) run across every rank,
// matched by name, fused and executed by the background engine.
//
// Each collective has a blocking form taking a context and an Async form returning a *Handle. A
// process without a launcher environment is a world of size 1. This package is a thin layer over
// the engine and the worker (package worker joins the job and owns each world): it must not
// contain negotiation, transport or job-joining logic.
package kolo

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"math"
	"os"
	"slices"
	"sync"

	"github.com/kolo-dl/kolo/internal/dtype"
	"github.com/kolo-dl/kolo/internal/engine"
	"github.com/kolo-dl/kolo/internal/engine/negotiate"
	"github.com/kolo-dl/kolo/internal/jobenv"
	"github.com/kolo-dl/kolo/internal/settings"
	"github.com/kolo-dl/kolo/internal/version"
	"github.com/kolo-dl/kolo/internal/worker"
	"github.com/kolo-dl/kolo/internal/world"
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
	Adasum  Op = 2 // Horovod's adaptive summation: allreduce of floating-point tensors only
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
	case Adasum:
		return "adasum"
	case Min:
		return "min"
	case Max:
		return "max"
	case Product:
		return "product"
	}
	return fmt.Sprintf("op(%d)", int(o))
}

// ArgumentError is the error of an op this rank refused before it ran: its arguments are wrong on
// this rank (a tensor that does not match its shape, splits that do not add up, a name still in
// flight, ...). The other ranks' submissions of the same op fail too, with its text, rather than
// wait for this rank (except for a duplicate name: the op holding the name goes on).
type ArgumentError = engine.ArgumentError

// ErrDuplicateName is matched (errors.Is) by the ArgumentError of an op submitted under a name that
// an op of the same kind and process set submitted on this rank still holds.
var ErrDuplicateName = engine.ErrDuplicateName

// ErrMismatch is matched (errors.Is) by the error of an op the ranks disagreed on (its dtype,
// shape, reduce op, root, ...) or could not run as they submitted it (a rank refused its
// arguments, a rank had joined): every rank needed was there, and the job goes on. Other errors of
// an op mean that a rank will never submit it (it ended, stalled, failed or was lost).
var ErrMismatch = engine.ErrMismatch

// OpKind is a collective, as RefuseAsync names it (its numbers are the C ABI's).
type OpKind = negotiate.OpKind

// The collectives RefuseAsync can refuse.
const (
	KindAllreduce     = negotiate.Allreduce
	KindAllgather     = negotiate.Allgather
	KindBroadcast     = negotiate.Broadcast
	KindAlltoall      = negotiate.Alltoall
	KindReduceScatter = negotiate.ReduceScatter
)

// RefuseAsync takes this rank's turn in the op of kind and name (empty for an unnamed op, which
// uses up its number as a submission would) that the other ranks submit, refusing it for reason:
// their submissions fail with reason instead of waiting for this rank. It is for bindings whose
// own checks reject a call before it can be described as a Tensor (an unsupported tensor type in a
// framework); the returned handle has failed with an ArgumentError.
func RefuseAsync(kind OpKind, name string, reason error, opts ...OpOption) *Handle {
	s, err := get()
	if err != nil {
		return failed(err)
	}
	if err := refusable(kind); err != nil {
		return failed(err)
	}
	req, _ := newRequest(kind, Tensor{}, 0, nil, opts)
	req.Name = s.names.name(req.Set, kind, name)
	return s.refuse(prepared{req: req}, reason)
}

func refusable(kind OpKind) error {
	if !hasTensor(kind) {
		return &ArgumentError{Err: fmt.Errorf("%v is not a collective with arguments to refuse", kind)}
	}
	return nil
}

// hasTensor reports whether kind is a collective on a tensor (not a barrier or a join).
func hasTensor(kind OpKind) bool {
	switch kind {
	case KindAllreduce, KindAllgather, KindBroadcast, KindAlltoall, KindReduceScatter:
		return true
	}
	return false
}

// ErrNotInitialized is returned by every call before Init or after Shutdown.
var ErrNotInitialized = errors.New("kolo is not initialized: call kolo.Init first")

// state is the world this process is in: its worker's, with the names of its ops.
type state struct {
	job    jobenv.Job
	world  *world.World
	engine *engine.Engine
	names  *namer
	worker *worker.Worker
}

// session is this process's one handle on kolo, the package's only mutable state.
var session struct {
	mu  sync.Mutex
	cur *state // nil before Init and after Shutdown
	// past is what the worlds this process joined leave to the next (worker.Memory): the
	// worker's, kept here because a worker lasts one world.
	past worker.Memory
}

// Option adjusts Init.
type Option func(*initOptions)

type initOptions struct {
	env      func(string) string
	cpuShare bool
	ranks    []int // nil: every rank of the launcher's job
}

// WithRanks makes Init join a world of only these ranks of the launcher's job (Horovod's
// init(comm=[...])): this process's rank is its index in ranks, and every process in ranks must
// pass the same list. A process not in ranks gets an error. Under mpirun and srun, where rank 0
// hosts the rendezvous, rank 0 must be one of them.
func WithRanks(ranks []int) Option {
	return func(o *initOptions) { o.ranks = slices.Clone(ranks) }
}

// WithCPUShare is for a process whose Go runtime runs nothing but kolo, as in a Python rank (the
// binding asks for it): unless GOMAXPROCS is set, Init limits the runtime to this rank's share of
// the host's CPUs (CPUs / local ranks, at least 1), as binding the rank to its own cores would.
// With every CPU, the runtime's threads of each rank (the engine's driver, the scheduler's
// monitor) run wherever a CPU is free, beside every local rank's training threads, and preempt
// them: 2 ranks on 2 CPUs trained 3-4% slower (docs/benchmarks.md). A Go
// program that uses kolo keeps its GOMAXPROCS for its own goroutines.
func WithCPUShare() Option { return func(o *initOptions) { o.cpuShare = true } }

// Init joins the job described by the environment. Calling it twice is an error, unless the
// engine stopped on an error since (Failed): Init then leaves that world and joins a new one, with
// the ranks that call Init again.
func Init(opts ...Option) error {
	session.mu.Lock()
	defer session.mu.Unlock()
	if session.cur != nil {
		if session.cur.engine.Err() == nil {
			return errors.New("kolo.Init called twice")
		}
		// The engine stopped on an error (a lost or failed rank, an abort): leave that world
		// and join a new one, as the other ranks do when they call Init again.
		s := session.cur
		session.cur = nil
		if err := s.close(); err != nil {
			slog.Debug("kolo: leaving the failed world before joining a new one", "err", err)
		}
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
	// Every setting comes from the environment (internal/settings declares them): a Go program sets
	// them as a launcher would, so the same job runs the same way whatever started it.
	cfg, err := engine.ConfigFromEnv(o.env)
	if err != nil {
		return fmt.Errorf("kolo.Init: %w", err)
	}
	if cfg.Device, err = deviceBackend(o.env); err != nil {
		return fmt.Errorf("kolo.Init: %w", err)
	}
	wo := world.Options{Timeout: cfg.SetupTimeout, ProgressTimeout: cfg.ProgressTimeout}
	wo.Interface, _ = jobenv.Interface(map[string]string{
		jobenv.NetworkInterface:        o.env(jobenv.NetworkInterface),
		jobenv.HorovodNetworkInterface: o.env(jobenv.HorovodNetworkInterface),
	})
	wopt := worker.Options{Env: env, Engine: cfg, World: wo, Ranks: o.ranks,
		ShareCPUs: o.cpuShare && o.env("GOMAXPROCS") == ""}
	if full, err := settings.TCPFullMesh.Switch(o.env); err != nil && !errors.Is(err, settings.ErrUnset) {
		return fmt.Errorf("kolo.Init: %w", err)
	} else if full {
		wopt.World.FullMesh = true
	}
	w, err := worker.Join(&session.past, wopt)
	if err != nil {
		var ae *ArgumentError
		if errors.As(err, &ae) {
			return &ArgumentError{Err: fmt.Errorf("kolo.Init: %w", ae.Err)}
		}
		return fmt.Errorf("kolo.Init: %w", err)
	}
	e := w.Engine()
	session.cur = &state{job: w.Job(), world: w.World(), engine: e, names: newNamer(e.Joins, e.Resynced), worker: w}
	return nil
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
	session.mu.Lock()
	s := session.cur
	session.cur = nil
	session.mu.Unlock()
	if s == nil {
		return nil
	}
	return s.close()
}

// close leaves the world (worker.Worker.Leave).
func (s *state) close() error { return s.worker.Leave() }

// MarkStep tells kolo that the program finished one training step: the autotuner (kolo run
// --autotune) times the job by these marks, and every rank switches its settings at the same
// mark. The Python DistributedOptimizer marks each of its steps; a Go program that wants its
// job tuned calls MarkStep once per step, on every rank. Without Init it does nothing.
func MarkStep() {
	if s, err := get(); err == nil {
		s.engine.MarkStep()
	}
}

// Failed reports whether the engine stopped on an error (a lost or failed rank, an abort, a
// deadline in a collective): every op fails from then on. Init then joins a new world.
func Failed() bool {
	s, err := get()
	return err == nil && s.engine.Err() != nil
}

// Abort tells every rank that this one has failed outside kolo, and why: this rank's pending and
// later ops fail with "rank N failed: <err>", and so do the other ranks', instead of waiting for
// this process to vanish and reporting "rank N lost". Under kolo run it first sends the launcher
// this rank's failure record (see ReportFailure), so that kolo run names this rank as the one
// that failed whichever rank exits first. Call it before exiting on an error the program cannot
// recover from (the Python binding calls it for an uncaught exception). The job stays
// initialized; Shutdown still releases it. Without Init it does nothing.
func Abort(err error) {
	s, gerr := get()
	if gerr != nil || err == nil {
		return
	}
	s.worker.ReportFailure(err, true)
	s.engine.Abort(fmt.Errorf("rank %d failed: %w", s.job.Rank, err))
}

// ReportFailure tells kolo run that this process is leaving on err, one of kolo's own errors (a
// failed op), before it exits: a failure record saying how this rank failed and which rank that
// traces back to (the peer lost, stuck or failed first), which kolo run reads to name the rank
// behind the job's failure. It returns once the record is sent (within 2 s). kolo sends the
// record itself before an op fails on a lost, stuck, failed or ended rank, and Shutdown sends it
// too; call ReportFailure when the program exits on an op error that names no rank (ranks
// disagreed on an op) without Shutdown. A rank's first record is the one kept. The Python binding
// calls it for an uncaught exception.
// Without Init, or not under kolo run, it does nothing.
func ReportFailure(err error) {
	if s, gerr := get(); gerr == nil {
		s.worker.ReportFailure(err, false)
	}
}

// IsInitialized reports whether Init has run (and Shutdown has not).
func IsInitialized() bool {
	session.mu.Lock()
	defer session.mu.Unlock()
	return session.cur != nil
}

func get() (*state, error) {
	session.mu.Lock()
	defer session.mu.Unlock()
	if session.cur == nil {
		return nil, ErrNotInitialized
	}
	return session.cur, nil
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
	DType DType
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
	want, err := t.bytes()
	if err != nil {
		return err
	}
	if int64(len(t.Data)) != want {
		return fmt.Errorf("shape %v of %v needs %d bytes, data has %d", t.Shape, t.DType, want, len(t.Data))
	}
	return nil
}

// bytes is the size of a tensor of t's dtype and shape, whatever Data holds: an invalid dtype, a
// negative dimension, or more bytes than any memory holds is an error (never a size wrapped to fit).
func (t Tensor) bytes() (int64, error) {
	if !t.DType.Valid() {
		return 0, fmt.Errorf("invalid dtype %v", t.DType)
	}
	return dtype.Bytes(t.DType, t.Shape)
}

// OpOption adjusts one collective.
type OpOption func(*opSettings)

// opSettings is what OpOptions adjust: the op's request, and how it is submitted.
type opSettings struct {
	req    *negotiate.Request
	waited bool
}

// Prescale multiplies the input by f before reducing.
func Prescale(f float64) OpOption { return func(s *opSettings) { s.req.PreScale *= f } }

// Postscale multiplies the result by f after reducing.
func Postscale(f float64) OpOption { return func(s *opSettings) { s.req.PostScale *= f } }

// FromGPU says that the tensor lives in GPU memory and the caller staged it through the host
// memory it passes (as the Python binding does for a CUDA tensor). Every rank must say the same
// (an op whose ranks mix CPU and GPU tensors fails on every rank, as under Horovod), and a float16
// tensor's scale factors are rounded to float16 before they multiply, as Horovod's CUDA kernels
// do, so that a script's results do not change with the library.
func FromGPU() OpOption { return func(s *opSettings) { s.req.GPU = true } }

// WaitsAtOnce says that the caller waits on the op's handle right after submitting it, as the
// blocking calls do (and the Python binding's, which are its async calls and a wait): the engine
// then arms no timer to have the op driven in the background (engine.EnqueueWaited).
func WaitsAtOnce() OpOption { return func(s *opSettings) { s.waited = true } }

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
		t := Tensor{Data: h.h.Output(), DType: h.out.DType, Shape: append([]int64(nil), h.out.Shape...)}
		if len(t.Shape) > 0 {
			t.Shape[0] = h.h.Rows() // the bytes cannot say it when a row holds no elements
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

// operands are the memory an op reads and writes: tensors in host memory (in, out), or device
// memory (dev), where in gives only the input's dtype and shape. Host and device ops take one
// path: submit (or submitGroup) names the op, prepare checks it, and what prepare refuses reaches
// the other ranks (refuse).
type operands struct {
	in, out Tensor
	dev     *deviceOperands // nil: host memory
}

// submit submits one op; waited says that the caller waits on it at once (the blocking calls), so
// that the engine need not arm its kick for an op nobody drives (engine.EnqueueWaited).
func submit(kind negotiate.OpKind, name string, x operands, op Op, root int, splits []int64, opts []OpOption, waited bool) *Handle {
	s, err := get()
	if err != nil {
		return failed(err)
	}
	req, waitsAtOnce := newRequest(kind, x.in, root, splits, opts)
	// Named before anything is checked: a call refused on this rank still uses up the name its
	// peers give the same call, and its refusal reaches them under it (refuse).
	req.Name = s.names.name(req.Set, kind, name)
	p, err := s.prepare(req, x, op)
	if err != nil {
		return s.reject(p, err)
	}
	return s.enqueue(p, waited || waitsAtOnce)
}

// reject fails p's op for prepare's error err: on this rank alone where the device path cannot
// take the op (unserved), else as refused, which the other ranks hear of (refuse).
func (s *state) reject(p prepared, err error) *Handle {
	var u *unserved
	if errors.As(err, &u) {
		return &Handle{kind: p.req.Kind, size: s.job.Size, early: &ArgumentError{Err: fmt.Errorf("%s %q: %w", p.req.Kind, p.req.Name, err)}}
	}
	return s.refuse(p, err)
}

// refuse submits p's op as refused by this rank for err (see engine.ArgumentError): the handle
// fails at once, and the other ranks' submissions of the op fail with err rather than wait.
func (s *state) refuse(p prepared, err error) *Handle {
	p.req.Error = err.Error()
	return s.handle(s.engine.Enqueue(p.req, nil, nil), p)
}

// unserved is prepare's error for a device op that the device path cannot take on this rank: it
// is not in use (the caller stages the op through host memory instead: gpu.ErrUnavailable, the
// same decision on every rank) or could not be set up. Unlike a refused argument, it fails the op
// on this rank alone: a staged op's turn is its host submission's.
type unserved struct{ err error }

func (u *unserved) Error() string { return u.err.Error() }
func (u *unserved) Unwrap() error { return u.err }

// prepared is an op checked and named on this rank, ready for the engine.
type prepared struct {
	req      negotiate.Request
	in       []byte
	outBytes []byte           // nil when the engine allocates the result
	dev      *engine.DeviceOp // a device op's side; nil for host memory
	out      Tensor
}

// newRequest is the op's request, unnamed, with the options applied, and whether they say the
// caller waits at once.
func newRequest(kind negotiate.OpKind, in Tensor, root int, splits []int64, opts []OpOption) (negotiate.Request, bool) {
	req := negotiate.Request{
		Kind: kind, DType: in.DType, Shape: append([]int64(nil), in.Shape...),
		Root: root, PreScale: 1, PostScale: 1, Splits: splits,
	}
	s := opSettings{req: &req}
	for _, f := range opts {
		f(&s)
	}
	return req, s.waited
}

// prepare checks the named request req of an op on x with reduction op, and completes it: this
// package's one check of an op's arguments, for host and device memory alike (the engine checks
// what needs the process set, and what the device path can run). On error the returned prepared
// still holds req, for refuse; an *unserved error is a device op the device path cannot take here.
func (s *state) prepare(req negotiate.Request, x operands, op Op) (prepared, error) {
	p := prepared{req: req}
	kind := req.Kind
	in, out := x.in, x.out
	if x.dev != nil {
		if x.dev.ordinal < 0 {
			return p, fmt.Errorf("device %d is not a device ordinal", x.dev.ordinal)
		}
		// Before the arguments: where the device path is not in use, every rank stages the op,
		// and its host submission refuses what is wrong with it under the same name everywhere.
		st, err := s.engine.DeviceStream(x.dev.ordinal, x.dev.stream)
		if err != nil {
			return p, &unserved{err}
		}
		p.dev = &engine.DeviceOp{Ordinal: x.dev.ordinal, Stream: st, In: x.dev.in, Out: x.dev.out}
	}
	var err error
	if p.dev != nil {
		_, err = in.bytes() // device memory: never read here
	} else {
		err = in.check()
	}
	if err != nil {
		return p, fmt.Errorf("input: %w", err)
	}
	if len(in.Shape) == 0 && (kind == negotiate.Allgather || kind == negotiate.Alltoall || kind == negotiate.ReduceScatter) {
		return p, fmt.Errorf("needs a tensor with at least one dimension")
	}
	if kind == negotiate.Alltoall {
		in = sentRows(in, req.Splits)
		p.req.Shape = in.Shape
	}
	if kind == negotiate.Allreduce || kind == negotiate.ReduceScatter {
		if p.req.ReduceOp, p.req.Average, err = reduction(op); err != nil {
			return p, err
		}
	}
	if math.IsNaN(p.req.PreScale) || math.IsNaN(p.req.PostScale) {
		return p, fmt.Errorf("NaN scale factor")
	}
	if p.dev != nil {
		n, _ := in.bytes()
		p.dev.Bytes = int(n)
		if p.req.PreScale == 1 {
			p.req.PreScale = 0 // 1 and 0 both mean none; the device path takes no factor
		}
		if p.req.PostScale == 1 {
			p.req.PostScale = 0
		}
		p.out = Tensor{DType: in.DType, Shape: p.req.Shape}
		return p, nil
	}
	if kind == negotiate.Allreduce || kind == negotiate.Broadcast {
		if err := out.check(); err != nil {
			return p, fmt.Errorf("output: %w", err)
		}
		if len(out.Data) != len(in.Data) || out.DType != in.DType {
			return p, fmt.Errorf("output (%d bytes of %v) does not match input (%d bytes of %v)", len(out.Data), out.DType, len(in.Data), in.DType)
		}
		p.outBytes = out.Data
	} else {
		out = Tensor{DType: in.DType, Shape: p.req.Shape}
	}
	p.in, p.out = in.Data, out
	return p, nil
}

// reduction is op as the engine's request says it.
func reduction(op Op) (code uint8, average bool, err error) {
	switch op {
	case Sum, Average:
		return negotiate.ReduceSum, op == Average, nil
	case Min:
		return negotiate.ReduceMin, false, nil
	case Max:
		return negotiate.ReduceMax, false, nil
	case Product:
		return negotiate.ReduceProd, false, nil
	case Adasum:
		return negotiate.ReduceAdasum, false, nil
	}
	return 0, false, fmt.Errorf("unsupported reduction %v", op)
}

func (s *state) enqueue(p prepared, waited bool) *Handle {
	var h *engine.Handle
	switch {
	case p.dev != nil:
		h = s.engine.EnqueueDevice(p.req, *p.dev)
	case waited:
		h = s.engine.EnqueueWaited(p.req, p.in, p.outBytes)
	default:
		h = s.engine.Enqueue(p.req, p.in, p.outBytes)
	}
	return s.handle(h, p)
}

// handle is the Handle of prepared op p, submitted as h.
func (s *state) handle(h *engine.Handle, p prepared) *Handle {
	return &Handle{h: h, out: p.out, kind: p.req.Kind, size: s.job.Size}
}

// submitGroup submits ops that every rank releases together, once all of them are ready
// everywhere, and fuses only with each other (horovod's grouped ops): the members xs, in host
// memory or all in device memory. If one member is malformed, or the call as a whole is
// (malformed: its outputs do not match its inputs), every member is refused (see refuse): the
// others would wait for it forever.
func submitGroup(kind negotiate.OpKind, name string, xs []operands, op Op, opts []OpOption, malformed error) []*Handle {
	hs := make([]*Handle, len(xs))
	s, err := get()
	if err != nil {
		for i := range hs {
			hs[i] = failed(err)
		}
		return hs
	}
	ins := make([]Tensor, len(xs))
	for i, x := range xs {
		ins[i] = x.in
	}
	reqs := s.groupRequests(kind, name, ins, opts)
	ps := make([]prepared, len(xs))
	var first error
	for i, x := range xs {
		p, err := s.prepare(reqs[i], x, op)
		if err != nil && first == nil {
			first = fmt.Errorf("grouped %s, tensor %d: %w", kind, i, err)
		}
		ps[i] = p
	}
	if first == nil {
		first = malformed // after the members': a device path not in use stages the group
	}
	if first != nil {
		for i := range hs {
			hs[i] = s.reject(ps[i], first)
		}
		return hs
	}
	var ehs []*engine.Handle
	if len(xs) > 0 && xs[0].dev != nil {
		dops := make([]engine.DeviceOp, len(ps))
		for i, p := range ps {
			reqs[i], dops[i] = p.req, *p.dev
		}
		ehs = s.engine.EnqueueDeviceGroup(reqs, dops)
	} else {
		in, out := make([][]byte, len(ps)), make([][]byte, len(ps))
		for i, p := range ps {
			reqs[i], in[i], out[i] = p.req, p.in, p.outBytes
		}
		ehs = s.engine.EnqueueGroup(reqs, in, out)
	}
	for i, h := range ehs {
		hs[i] = s.handle(h, ps[i])
	}
	return hs
}

// outputCount is the error of a grouped call that passes outputs, but not one per input.
func outputCount[T any](kind negotiate.OpKind, ins int, outs []T) error {
	if outs != nil && len(outs) != ins {
		return fmt.Errorf("grouped %s: %d outputs for %d inputs", kind, len(outs), ins)
	}
	return nil
}

// hostGroup is a grouped call's members in host memory: ins[i] into outs[i] (none when outs is
// nil: the engine allocates the results).
func hostGroup(kind negotiate.OpKind, ins, outs []Tensor) ([]operands, error) {
	xs := make([]operands, len(ins))
	for i, in := range ins {
		xs[i].in = in
		if i < len(outs) {
			xs[i].out = outs[i]
		}
	}
	return xs, outputCount(kind, len(ins), outs)
}

// groupRequests are the requests of a grouped op's members (ins, or len(ins) members refused
// before they are tensors), named by namer.group, with the group's id derived from their names, so
// that ranks agree on it without a counter of its own that could drift.
func (s *state) groupRequests(kind negotiate.OpKind, name string, ins []Tensor, opts []OpOption) []negotiate.Request {
	reqs := make([]negotiate.Request, len(ins))
	for i, in := range ins {
		reqs[i], _ = newRequest(kind, in, 0, nil, opts)
	}
	var set int
	if len(reqs) > 0 {
		set = reqs[0].Set
	}
	names := s.names.group(set, kind, name, len(ins))
	id := fnv.New64a()
	for i := range reqs {
		reqs[i].Name = names[i]
		id.Write([]byte(names[i]))
		id.Write([]byte{0})
	}
	group := int64(id.Sum64()>>1) | 1 // non-zero: zero means "no group"
	for i := range reqs {
		reqs[i].Group, reqs[i].GroupSize = group, len(reqs)
	}
	return reqs
}

// RefuseGroupAsync is RefuseAsync for a grouped op of n members (AllreduceGroupAsync and the
// like): every member of the other ranks' group fails with reason.
func RefuseGroupAsync(kind OpKind, name string, n int, reason error, opts ...OpOption) []*Handle {
	if n < 1 {
		return []*Handle{failed(&ArgumentError{Err: fmt.Errorf("RefuseGroupAsync: a group of %d members", n)})}
	}
	hs := make([]*Handle, n)
	s, err := get()
	if err == nil {
		err = refusable(kind)
	}
	if err != nil {
		for i := range hs {
			hs[i] = failed(err)
		}
		return hs
	}
	for i, req := range s.groupRequests(kind, name, make([]Tensor, n), opts) {
		hs[i] = s.refuse(prepared{req: req}, reason)
	}
	return hs
}

// sentRows is the part of an alltoall's input that splits sends: as in Horovod, rows past the sum
// of the splits stay behind. Splits that do not add up (negative, too many rows) are left for the
// engine to refuse.
func sentRows(in Tensor, splits []int64) Tensor {
	if splits == nil || in.Shape[0] == 0 {
		return in
	}
	var sum int64
	for _, v := range splits {
		if v < 0 {
			return in
		}
		sum += v
	}
	if sum >= in.Shape[0] {
		return in
	}
	row := int64(len(in.Data)) / in.Shape[0]
	shape := slices.Clone(in.Shape)
	shape[0] = sum
	return Tensor{Data: in.Data[:sum*row], DType: in.DType, Shape: shape}
}

// AllreduceGroupAsync reduces ins[i] into outs[i] (which may be ins[i]) for every i, as one group
// released together (horovod's grouped_allreduce).
func AllreduceGroupAsync(name string, ins, outs []Tensor, op Op, opts ...OpOption) []*Handle {
	if outs == nil {
		outs = ins
	}
	xs, err := hostGroup(negotiate.Allreduce, ins, outs)
	return submitGroup(negotiate.Allreduce, name, xs, op, opts, err)
}

// AllgatherGroupAsync gathers every tensor of ts as one group (horovod's grouped_allgather).
func AllgatherGroupAsync(name string, ts []Tensor, opts ...OpOption) []*Handle {
	xs, _ := hostGroup(negotiate.Allgather, ts, nil)
	return submitGroup(negotiate.Allgather, name, xs, Sum, opts, nil)
}

// ReduceScatterGroupAsync reduce-scatters every tensor of ts as one group (horovod's
// grouped_reducescatter).
func ReduceScatterGroupAsync(name string, ts []Tensor, op Op, opts ...OpOption) []*Handle {
	xs, _ := hostGroup(negotiate.ReduceScatter, ts, nil)
	return submitGroup(negotiate.ReduceScatter, name, xs, op, opts, nil)
}

// AllreduceAsync reduces in across ranks into out (which may be in itself).
func AllreduceAsync(name string, in, out Tensor, op Op, opts ...OpOption) *Handle {
	return submit(negotiate.Allreduce, name, operands{in: in, out: out}, op, 0, nil, opts, false)
}

// Allreduce reduces t in place across ranks.
func Allreduce(ctx context.Context, name string, t Tensor, op Op, opts ...OpOption) error {
	return submit(negotiate.Allreduce, name, operands{in: t, out: t}, op, 0, nil, opts, true).Wait(ctx)
}

// AllgatherAsync concatenates every rank's t along dim 0 (dim 0 may differ per rank).
func AllgatherAsync(name string, t Tensor, opts ...OpOption) *Handle {
	return submit(negotiate.Allgather, name, operands{in: t}, Sum, 0, nil, opts, false)
}

// Allgather is the blocking AllgatherAsync.
func Allgather(ctx context.Context, name string, t Tensor, opts ...OpOption) (Tensor, error) {
	h := submit(negotiate.Allgather, name, operands{in: t}, Sum, 0, nil, opts, true)
	if err := h.Wait(ctx); err != nil {
		return Tensor{}, err
	}
	return h.Tensor(), nil
}

// BroadcastAsync copies root's t into t on every rank (root is a job rank, also in a process set).
func BroadcastAsync(name string, t Tensor, root int, opts ...OpOption) *Handle {
	return submit(negotiate.Broadcast, name, operands{in: t, out: t}, Sum, root, nil, opts, false)
}

// Broadcast is the blocking BroadcastAsync.
func Broadcast(ctx context.Context, name string, t Tensor, root int, opts ...OpOption) error {
	return submit(negotiate.Broadcast, name, operands{in: t, out: t}, Sum, root, nil, opts, true).Wait(ctx)
}

// AlltoallAsync sends splits[r] rows (dim 0) of t to rank r, in rank order, and receives the rows
// every rank sends here. nil splits means an equal split (dim 0 must divide by Size). Splits may sum
// to less than dim 0 (the rows past their sum are not sent), as in Horovod, never to more. In a
// process set, splits and the rows received are per member, in rank order.
func AlltoallAsync(name string, t Tensor, splits []int64, opts ...OpOption) *Handle {
	return submit(negotiate.Alltoall, name, operands{in: t}, Sum, 0, splits, opts, false)
}

// Alltoall is the blocking AlltoallAsync; it returns the received tensor and rows per source rank.
func Alltoall(ctx context.Context, name string, t Tensor, splits []int64, opts ...OpOption) (Tensor, []int64, error) {
	h := submit(negotiate.Alltoall, name, operands{in: t}, Sum, 0, splits, opts, true)
	if err := h.Wait(ctx); err != nil {
		return Tensor{}, nil, err
	}
	return h.Tensor(), h.RecvSplits(), nil
}

// ReduceScatterAsync reduces t across ranks and leaves rank r with its share of dim 0 (ranks
// below dim0 % Size get one extra row, as Horovod splits).
func ReduceScatterAsync(name string, t Tensor, op Op, opts ...OpOption) *Handle {
	return submit(negotiate.ReduceScatter, name, operands{in: t}, op, 0, nil, opts, false)
}

// ReduceScatter is the blocking ReduceScatterAsync.
func ReduceScatter(ctx context.Context, name string, t Tensor, op Op, opts ...OpOption) (Tensor, error) {
	h := submit(negotiate.ReduceScatter, name, operands{in: t}, op, 0, nil, opts, true)
	if err := h.Wait(ctx); err != nil {
		return Tensor{}, err
	}
	return h.Tensor(), nil
}

// BarrierAsync completes when every rank (of the process set, with InProcessSet) has called Barrier.
func BarrierAsync(opts ...OpOption) *Handle { return barrier(opts, false) }

func barrier(opts []OpOption, waited bool) *Handle {
	return submit(negotiate.Barrier, "", operands{in: Tensor{DType: dtype.Uint8, Shape: []int64{0}}}, Sum, 0, nil, opts, waited)
}

// Barrier blocks until every rank (of the process set, with InProcessSet) has called Barrier.
func Barrier(ctx context.Context, opts ...OpOption) error { return barrier(opts, true).Wait(ctx) }

// JoinAsync says this rank has no more data: other ranks' allreduces go on with this rank
// contributing zeros, until every rank has joined. JoinLast then gives the last rank to join.
func JoinAsync() *Handle {
	return submit(negotiate.Join, "", operands{in: Tensor{DType: dtype.Uint8, Shape: []int64{0}}}, Sum, 0, nil, nil, false)
}

// Join is the blocking JoinAsync; it returns the last rank to join.
func Join(ctx context.Context) (int, error) {
	h := JoinAsync()
	if err := h.Wait(ctx); err != nil {
		return -1, err
	}
	return h.JoinLast(), nil
}

// namer gives ops the names the coordinator matches them by across ranks.
//
// A named op is matched as "<kind>.<name>": as in Horovod, names are scoped by the op's kind, so an
// allreduce and a broadcast may both be called "w". An unnamed op is named by call order,
// "noname.<N>", N counting this rank's unnamed ops of its process set, as Horovod counts its
// handles: ranks that make the same calls name them alike whatever shapes and dtypes they pass, so
// that a mismatch is an error every rank gets, not two ops that never meet. The count is shared by
// every kind, so that one rank's allreduce meeting another's allgather is a mismatch too. A call
// that is refused on this rank (see refuse) still uses up its number. The count of the global set
// restarts at every completed join (Engine.Joins), where ranks that joined early and ranks that
// went on alone agree again, and moves up to the coordinator's number after calls that went
// different ways failed (Engine.Resynced), where ranks whose counts drifted apart agree again.
type namer struct {
	joins  func() uint64                       // Engine.Joins; nil: never
	resync func(set int) (count, joins uint64) // Engine.Resynced; nil: never
	mu     sync.Mutex
	count  map[int]uint64 // per process set
	seen   uint64         // the joins the global count started at
}

func newNamer(joins func() uint64, resync func(int) (uint64, uint64)) *namer {
	return &namer{joins: joins, resync: resync, count: map[int]uint64{}}
}

// name names an op of process set set.
func (n *namer) name(set int, kind negotiate.OpKind, user string) string {
	if kind == negotiate.Join {
		return "join" // not negotiated by name; one join in flight at a time
	}
	if user != "" {
		return kind.String() + "." + user
	}
	return fmt.Sprintf("noname.%d", n.next(set))
}

// group names the n members of a grouped op: "<kind>.<name>.<i>", or "noname.<N>.<i>" with one
// number for the whole group.
func (n *namer) group(set int, kind negotiate.OpKind, user string, size int) []string {
	base := kind.String() + "." + user
	if user == "" {
		base = fmt.Sprintf("noname.%d", n.next(set))
	}
	names := make([]string, size)
	for i := range names {
		names[i] = fmt.Sprintf("%s.%d", base, i)
	}
	return names
}

func (n *namer) next(set int) uint64 {
	var joins, floor, floorJoins uint64
	if n.joins != nil {
		joins = n.joins()
	}
	if n.resync != nil {
		floor, floorJoins = n.resync(set)
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if set == 0 && joins != n.seen {
		n.count[0], n.seen = 0, joins
	}
	// After calls that went different ways failed, every rank counts on from the number the
	// coordinator gave (one that skipped an unnamed call is behind); a join since restarted it.
	if floor > n.count[set] && (set != 0 || floorJoins == joins) {
		n.count[set] = floor
	}
	i := n.count[set]
	n.count[set] = i + 1
	return i
}
