package engine

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kolo-dl/kolo/internal/dtype"
	"github.com/kolo-dl/kolo/internal/engine/negotiate"
	"github.com/kolo-dl/kolo/internal/gpu"
	"github.com/kolo-dl/kolo/internal/gpu/fake"
	"github.com/kolo-dl/kolo/internal/reduce"
	"github.com/kolo-dl/kolo/internal/transport/inmem"
)

// deviceCluster is a cluster whose ranks each have a device (a fake one unless said otherwise),
// on one library.
type deviceCluster struct {
	*cluster
	devs    []testDevice
	streams []gpu.Stream // each rank's "torch current stream"
	opens   atomic.Int32 // library loads, over every rank
}

// rankDevice says what rank r's backend reports.
type rankDevice struct {
	busID, hostID string
	openErr       error
	setting       gpu.Setting
}

func newDeviceCluster(t *testing.T, n int, cfg Config, each func(r int) rankDevice) *deviceCluster {
	t.Helper()
	return newDeviceClusterOn(t, n, cfg, fake.NewLibrary(), each)
}

// testDevice is a device whose memory a test reads and writes from the host.
type testDevice interface {
	gpu.Device
	Bytes(p gpu.Ptr, n int) ([]byte, error)
}

// newDeviceClusterOn is newDeviceCluster on lib.
func newDeviceClusterOn(t *testing.T, n int, cfg Config, lib gpu.Library, each func(r int) rankDevice) *deviceCluster {
	t.Helper()
	devs := make([]testDevice, n)
	for r := range devs {
		devs[r] = fake.NewDevice()
	}
	return newDeviceClusterWith(t, cfg, lib, gpu.Version{Major: 2, Minor: 28, Patch: 9}, devs, each)
}

// newDeviceClusterWith is a cluster of a rank per device of devs, on lib of version v.
func newDeviceClusterWith(t *testing.T, cfg Config, lib gpu.Library, v gpu.Version, devs []testDevice, each func(r int) rankDevice) *deviceCluster {
	t.Helper()
	n := len(devs)
	dc := &deviceCluster{}
	eps := inmem.New(n, inmem.WithProgressTimeout(testProgressTimeout))
	groups := make([]Group, n)
	cfgs := make([]Config, n)
	for r, ep := range eps {
		groups[r] = Group{Comm: ep.Comm(), Messenger: ep, Local: ep.Comm()}
		d := devs[r]
		s, err := d.NewStream()
		if err != nil {
			t.Fatal(err)
		}
		dc.devs, dc.streams = append(dc.devs, d), append(dc.streams, s)
		rd := rankDevice{busID: fmt.Sprintf("0000:%02x:00.0", r+1)}
		if each != nil {
			rd = each(r)
		}
		cfgs[r] = cfg
		cfgs[r].Device = &DeviceBackend{Setting: rd.setting, HostID: rd.hostID,
			Open: func() (gpu.Library, gpu.Version, error) {
				dc.opens.Add(1)
				if rd.openErr != nil {
					return nil, gpu.Version{}, rd.openErr
				}
				return lib, v, nil
			},
			Device: func(gpu.Library, int) (gpu.Device, string, error) {
				if u, ok := d.(interface{ Unwrap() gpu.Device }); ok {
					return u.Unwrap(), rd.busID, nil // the library's own type, which its communicators take
				}
				return d, rd.busID, nil
			},
		}
	}
	dc.cluster = startClusterEach(t, cfgs, "memhost", groups, func() {
		for _, ep := range eps {
			ep.Close()
		}
	})
	dc.eps = eps
	return dc
}

// setUp runs DevicePath on every rank and returns each rank's decision and error.
func (dc *deviceCluster) setUp(t *testing.T) ([]gpu.Decision, []error) {
	t.Helper()
	n := len(dc.engines)
	decs, errs := make([]gpu.Decision, n), make([]error, n)
	ctx := waitCtx(t)
	onEachRank(n, func(r int) { decs[r], errs[r] = dc.engines[r].DevicePath(ctx, 0) })
	return decs, errs
}

func (dc *deviceCluster) mustUse(t *testing.T) {
	t.Helper()
	decs, errs := dc.setUp(t)
	for r := range decs {
		if errs[r] != nil || !decs[r].Use {
			t.Fatalf("rank %d: device path %+v, %v; want it used", r, decs[r], errs[r])
		}
	}
}

func upload(t *testing.T, d testDevice, b []byte) gpu.Ptr {
	t.Helper()
	p, err := d.Alloc(len(b))
	if err != nil {
		t.Fatal(err)
	}
	m, err := d.Bytes(p, len(b))
	if err != nil {
		t.Fatal(err)
	}
	copy(m, b)
	return p
}

func download(t *testing.T, d testDevice, p gpu.Ptr, n int) []byte {
	t.Helper()
	m, err := d.Bytes(p, n)
	if err != nil {
		t.Fatal(err)
	}
	return bytes.Clone(m)
}

// devInput is rank r's input for a tensor of count elements of t: small whole numbers, so that
// sums and products are exact in every type and stay in range.
func devInput(t dtype.DType, r, count int, seed uint64) []byte {
	rng := rand.New(rand.NewPCG(seed, uint64(r)))
	b := make([]byte, count*t.Size())
	for i := range count {
		v := float64(rng.IntN(3) + 1)
		if t != dtype.Uint8 && rng.IntN(4) == 0 {
			v = -v
		}
		putNum(t, b[i*t.Size():], v)
	}
	return b
}

func putNum(t dtype.DType, b []byte, v float64) {
	switch t {
	case dtype.Int8, dtype.Uint8:
		b[0] = byte(int8(v))
	case dtype.Int32:
		le.PutUint32(b, uint32(int32(v)))
	case dtype.Int64:
		le.PutUint64(b, uint64(int64(v)))
	case dtype.Float16:
		le.PutUint16(b, reduce.Float32ToFloat16Bits(float32(v)))
	case dtype.BFloat16:
		le.PutUint16(b, reduce.Float32ToBFloat16Bits(float32(v)))
	case dtype.Float32:
		le.PutUint32(b, math.Float32bits(float32(v)))
	case dtype.Float64:
		le.PutUint64(b, math.Float64bits(v))
	}
}

func getNum(t dtype.DType, b []byte) float64 {
	switch t {
	case dtype.Int8:
		return float64(int8(b[0]))
	case dtype.Uint8:
		return float64(b[0])
	case dtype.Int32:
		return float64(int32(le.Uint32(b)))
	case dtype.Int64:
		return float64(int64(le.Uint64(b)))
	case dtype.Float16:
		return float64(reduce.Float16BitsToFloat32(le.Uint16(b)))
	case dtype.BFloat16:
		return float64(reduce.BFloat16BitsToFloat32(le.Uint16(b)))
	case dtype.Float32:
		return float64(math.Float32frombits(le.Uint32(b)))
	}
	return math.Float64frombits(le.Uint64(b))
}

// sameAs compares a device result with the host path's: exactly, except float averages, where
// NCCL multiplies each input by 1/n before summing and the host path divides the sum, so the two
// may differ in the last places.
func sameAs(t dtype.DType, approx bool, got, want []byte) error {
	if len(got) != len(want) {
		return fmt.Errorf("%d bytes, host path %d", len(got), len(want))
	}
	if !approx || !t.IsFloat() {
		if !bytes.Equal(got, want) {
			return fmt.Errorf("got %x, host path %x", got, want)
		}
		return nil
	}
	tol := 1e-6
	if t.Size() == 2 {
		tol = 1e-2
	}
	for i := 0; i < len(got); i += t.Size() {
		g, w := getNum(t, got[i:]), getNum(t, want[i:])
		if math.Abs(g-w) > tol*math.Max(1, math.Abs(w)) {
			return fmt.Errorf("element %d: %v, host path %v", i/t.Size(), g, w)
		}
	}
	return nil
}

var le = binary.LittleEndian

// devCase is one op run on both paths: reqs on rank r, with inputs from input.
type devCase struct {
	name   string
	approx bool
	reqs   func(r, n int) []negotiate.Request
}

// runBoth runs tc's ops on the host path (with GPU unset) and then on the device path, on every
// rank, and compares every rank's results.
func runBoth(t *testing.T, dc *deviceCluster, tc devCase, seed uint64) {
	t.Helper()
	n := len(dc.engines)
	ctx := waitCtx(t)
	errs := make([]error, n)
	onEachRank(n, func(r int) {
		e, dev, s := dc.engines[r], dc.devs[r], dc.streams[r]
		reqs := tc.reqs(r, n)
		hostOut := make([][]byte, len(reqs))
		hostRows := make([]int64, len(reqs))
		hs := make([]*Handle, len(reqs))
		ins := make([][]byte, len(reqs))
		for i, req := range reqs {
			n, _ := dtype.Bytes(req.DType, req.Shape)
			ins[i] = devInput(req.DType, r, int(n)/req.DType.Size(), seed+uint64(i))
			req.Name = "host." + req.Name
			var out []byte
			if req.Kind == negotiate.Allreduce || req.Kind == negotiate.Broadcast {
				out = make([]byte, len(ins[i]))
			}
			hostOut[i] = out
			hs[i] = e.Enqueue(req, ins[i], out)
		}
		for i, h := range hs {
			if err := h.Wait(ctx); err != nil {
				errs[r] = fmt.Errorf("host %s: %w", reqs[i].Name, err)
				return
			}
			if hostOut[i] == nil {
				hostOut[i], hostRows[i] = h.Output(), h.Rows()
			}
		}
		// The device path: every op submitted before any is waited on, so that they fuse.
		outs := make([]gpu.Ptr, len(reqs))
		for i, req := range reqs {
			in := upload(t, dev, ins[i])
			outs[i] = upload(t, dev, make([]byte, len(ins[i])))
			req.Name = "dev." + req.Name
			hs[i] = e.EnqueueDevice(req, DeviceOp{Stream: s, In: in, Out: outs[i], Bytes: len(ins[i])})
		}
		for i, h := range hs {
			if err := h.Wait(ctx); err != nil {
				errs[r] = fmt.Errorf("device %s: %w", reqs[i].Name, err)
				return
			}
			if err := h.WaitOnStream(s); err != nil {
				errs[r] = err
				return
			}
		}
		if err := s.Synchronize(ctx); err != nil {
			errs[r] = err
			return
		}
		for i, h := range hs {
			var got []byte
			if p, size := h.DeviceOutput(); p != 0 {
				got = download(t, dev, p, size)
				if err := h.ReleaseDeviceOutput(s); err != nil {
					errs[r] = err
					return
				}
				if h.Rows() != hostRows[i] {
					errs[r] = fmt.Errorf("%s: %d rows, host path %d", reqs[i].Name, h.Rows(), hostRows[i])
					return
				}
			} else {
				got = download(t, dev, outs[i], len(ins[i]))
			}
			if err := sameAs(reqs[i].DType, tc.approx, got, hostOut[i]); err != nil {
				errs[r] = fmt.Errorf("%s: %w", reqs[i].Name, err)
				return
			}
		}
	})
	for r, err := range errs {
		if err != nil {
			t.Errorf("rank %d: %v", r, err)
		}
	}
}

var deviceTypes = []dtype.DType{dtype.Int8, dtype.Uint8, dtype.Int32, dtype.Int64, dtype.Float16, dtype.BFloat16, dtype.Float32, dtype.Float64}

// Every op on the device path gives what the host path gives, for every element type NCCL takes,
// at 2 and 3 ranks, with host and device ops in one job.
func TestDeviceOpsMatchHostPath(t *testing.T) {
	for _, n := range []int{2, 3} {
		t.Run(fmt.Sprint(n), func(t *testing.T) { deviceConformance(t, newDeviceCluster(t, n, DefaultConfig(), nil)) })
	}
}

// deviceConformance runs every op on dc's device path and its host path and compares them.
func deviceConformance(t *testing.T, dc *deviceCluster) {
	t.Helper()
	dc.mustUse(t)
	seed := uint64(1)
	for _, dt := range deviceTypes {
		for _, op := range []struct {
			name string
			op   uint8
			avg  bool
		}{{"sum", negotiate.ReduceSum, false}, {"min", negotiate.ReduceMin, false}, {"max", negotiate.ReduceMax, false},
			{"prod", negotiate.ReduceProd, false}, {"average", negotiate.ReduceSum, true}} {
			seed++
			runBoth(t, dc, devCase{name: "allreduce", approx: op.avg, reqs: func(r, n int) []negotiate.Request {
				// One alone (in place, no fusion) and three fused, one of them odd-sized.
				var reqs []negotiate.Request
				for i, shape := range [][]int64{{7}, {3, 5}, {1}, {0}} {
					reqs = append(reqs, negotiate.Request{Name: fmt.Sprintf("ar.%s.%s.%d", dt, op.name, i), Kind: negotiate.Allreduce,
						DType: dt, Shape: shape, ReduceOp: op.op, Average: op.avg})
				}
				return reqs
			}}, seed)
		}
		seed++
		runBoth(t, dc, devCase{name: "gather, broadcast, alltoall, reducescatter", approx: true, reqs: func(r, n int) []negotiate.Request {
			splits := make([]int64, n) // uneven: rank r sends p+r rows to p
			var rows int64
			for p := range splits {
				splits[p] = int64((p + r) % 3)
				rows += splits[p]
			}
			return []negotiate.Request{
				{Name: "ag.ragged." + dt.String(), Kind: negotiate.Allgather, DType: dt, Shape: []int64{int64(r + 1), 3}},
				{Name: "ag.even." + dt.String(), Kind: negotiate.Allgather, DType: dt, Shape: []int64{2, 2}},
				{Name: "ag.empty." + dt.String(), Kind: negotiate.Allgather, DType: dt, Shape: []int64{0, 3}},
				{Name: "bc." + dt.String(), Kind: negotiate.Broadcast, DType: dt, Shape: []int64{5}, Root: n - 1},
				{Name: "bc2." + dt.String(), Kind: negotiate.Broadcast, DType: dt, Shape: []int64{2, 3}, Root: n - 1},
				{Name: "a2a." + dt.String(), Kind: negotiate.Alltoall, DType: dt, Shape: []int64{rows, 2}, Splits: splits},
				{Name: "rs.uneven." + dt.String(), Kind: negotiate.ReduceScatter, DType: dt, Shape: []int64{int64(2*n + 1), 2}, ReduceOp: negotiate.ReduceSum},
				{Name: "rs.even." + dt.String(), Kind: negotiate.ReduceScatter, DType: dt, Shape: []int64{int64(n), 3}, ReduceOp: negotiate.ReduceMax},
				{Name: "rs.avg." + dt.String(), Kind: negotiate.ReduceScatter, DType: dt, Shape: []int64{int64(n + 1)}, ReduceOp: negotiate.ReduceSum, Average: true},
			}
		}}, seed)
	}
	if dc.engines[0].dev.fusionCap == 0 {
		t.Error("no fusion buffer was ever allocated: the allreduces did not fuse")
	}
}

// gate is an event that completes only when open is called: recorded on a stream of its own
// behind a collective that waits for a second rank of a side communicator.
func gate(t *testing.T) (gpu.Event, func()) {
	t.Helper()
	lib := fake.NewLibrary()
	id, _ := lib.NewUniqueID()
	devs := []*fake.Device{fake.NewDevice(), fake.NewDevice()}
	comms := make([]gpu.Comm, 2)
	errs := make([]error, 2)
	ctx := waitCtx(t)
	onEachRank(2, func(r int) { comms[r], errs[r] = lib.NewComm(ctx, devs[r], id, 2, r) })
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	step := func(r int) gpu.Stream {
		s, err := devs[r].NewStream()
		if err != nil {
			t.Fatal(err)
		}
		buf := upload(t, devs[r], make([]byte, 4))
		if err := comms[r].AllReduce(buf, buf, 1, gpu.Int32, gpu.Sum, s); err != nil {
			t.Fatal(err)
		}
		return s
	}
	s := step(0)
	ev, _ := devs[0].NewEvent()
	if err := s.Record(ev); err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	return ev, func() { once.Do(func() { step(1) }) }
}

// The engine's work waits for what the producer's stream had pending when the op was submitted
// (a write still queued there must be seen), without blocking the host: the handle completes
// while the write is still held back; a consumer stream that waits on the handle runs its copy
// only after the collective.
func TestDeviceOrderingAndConsumerWait(t *testing.T) {
	const n = 2
	dc := newDeviceCluster(t, n, DefaultConfig(), nil)
	dc.mustUse(t)
	ctx := waitCtx(t)
	ev, open := gate(t)
	defer open()
	results := make([][]byte, n)
	errs := make([]error, n)
	var checked sync.WaitGroup
	checked.Add(n)
	onEachRank(n, func(r int) {
		did := false
		done := func() {
			if !did {
				did = true
				checked.Done()
			}
		}
		defer done() // a rank that fails early must not hold rank 0 back
		dev, s := dc.devs[r], dc.streams[r]
		in := upload(t, dev, f32(-1, -1, -1)) // stale: the producer's queued write replaces it
		fresh := upload(t, dev, f32(float32(r+1), 2, 3))
		out := upload(t, dev, make([]byte, 12))
		if r == 0 {
			if err := s.WaitEvent(ev); err != nil {
				errs[r] = err
				return
			}
		}
		if err := s.CopyAsync(in, fresh, 12); err != nil {
			errs[r] = err
			return
		}
		h := dc.engines[r].EnqueueDevice(allreduceReq("ordered", 3), DeviceOp{Stream: s, In: in, Out: out, Bytes: 12})
		if err := h.Wait(ctx); err != nil {
			errs[r] = err
			return
		}
		consumer, _ := dev.NewStream()
		dst := upload(t, dev, make([]byte, 12))
		if err := h.WaitOnStream(consumer); err != nil {
			errs[r] = err
			return
		}
		if err := consumer.CopyAsync(dst, out, 12); err != nil {
			errs[r] = err
			return
		}
		short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
		defer cancel()
		if err := consumer.Synchronize(short); !errors.Is(err, context.DeadlineExceeded) {
			errs[r] = fmt.Errorf("the consumer's copy ran while rank 0's producer still held its write back: %v", err)
			done()
			if r == 0 {
				open()
			}
			return
		}
		done()
		if r == 0 {
			checked.Wait() // every rank saw its consumer held back
			open()
		}
		if err := consumer.Synchronize(ctx); err != nil {
			errs[r] = err
			return
		}
		if err := h.Synchronize(ctx); err != nil {
			errs[r] = err
			return
		}
		results[r] = download(t, dev, dst, 12)
	})
	for r := range n {
		if errs[r] != nil {
			t.Fatalf("rank %d: %v", r, errs[r])
		}
		if got := getF32(results[r]); fmt.Sprint(got) != "[3 4 6]" {
			t.Errorf("rank %d: %v, want [3 4 6] (the producer's queued write, summed)", r, got)
		}
	}
}

// CPU and GPU tensors submitted together in one job are never fused together: each comes out
// right, through its own path.
func TestDeviceAndHostOpsInterleaved(t *testing.T) {
	const n = 3
	dc := newDeviceCluster(t, n, DefaultConfig(), nil)
	dc.mustUse(t)
	ctx := waitCtx(t)
	errs := make([]error, n)
	onEachRank(n, func(r int) {
		dev, s := dc.devs[r], dc.streams[r]
		var hs []*Handle
		var hostBufs [][]byte
		var devOuts []gpu.Ptr
		for i := range 6 {
			name := fmt.Sprintf("t%d", i)
			if i%2 == 0 {
				b := f32(float32(r), float32(i))
				hostBufs = append(hostBufs, b)
				hs = append(hs, dc.engines[r].Enqueue(allreduceReq(name, 2), b, b))
				continue
			}
			p := upload(t, dev, f32(float32(r), float32(i)))
			devOuts = append(devOuts, p)
			hs = append(hs, dc.engines[r].EnqueueDevice(allreduceReq(name, 2), DeviceOp{Stream: s, In: p, Out: p, Bytes: 8}))
		}
		for _, h := range hs {
			if err := h.Synchronize(ctx); err != nil {
				errs[r] = err
				return
			}
		}
		for k, b := range hostBufs {
			if got := fmt.Sprint(getF32(b)); got != fmt.Sprintf("[3 %d]", 3*2*k) {
				errs[r] = fmt.Errorf("host tensor %d: %s", 2*k, got)
			}
		}
		for k, p := range devOuts {
			if got := fmt.Sprint(getF32(download(t, dev, p, 8))); got != fmt.Sprintf("[3 %d]", 3*(2*k+1)) {
				errs[r] = fmt.Errorf("device tensor %d: %s", 2*k+1, got)
			}
		}
	})
	for r, err := range errs {
		if err != nil {
			t.Errorf("rank %d: %v", r, err)
		}
	}
}

// What the device path refuses, the caller stages: Adasum, types NCCL lacks, scale factors; and
// once the device path serves GPU tensors, a GPU tensor staged through host memory fails on every
// rank instead of leaving the others in a device collective.
func TestDeviceRefusals(t *testing.T) {
	const n = 2
	dc := newDeviceCluster(t, n, DefaultConfig(), nil)
	dc.mustUse(t)
	ctx := waitCtx(t)
	e, dev, s := dc.engines[0], dc.devs[0], dc.streams[0]
	p := upload(t, dev, make([]byte, 8))
	for _, tc := range []struct {
		req  negotiate.Request
		want string
	}{
		{negotiate.Request{Name: "a", Kind: negotiate.Allreduce, DType: dtype.Float32, Shape: []int64{2}, ReduceOp: negotiate.ReduceAdasum}, "Adasum"},
		{negotiate.Request{Name: "b", Kind: negotiate.Allreduce, DType: dtype.Int16, Shape: []int64{4}, ReduceOp: negotiate.ReduceSum}, "int16"},
		{negotiate.Request{Name: "c", Kind: negotiate.Allreduce, DType: dtype.Float32, Shape: []int64{2}, ReduceOp: negotiate.ReduceSum, PreScale: 2}, "prescale"},
		{negotiate.Request{Name: "kolo.device_setup", Kind: negotiate.Allreduce, DType: dtype.Float32, Shape: []int64{2}, ReduceOp: negotiate.ReduceSum}, "reserved"},
		{negotiate.Request{Name: "d", Kind: negotiate.Allreduce, DType: dtype.Float32, Shape: []int64{3}, ReduceOp: negotiate.ReduceSum}, "needs 12 bytes"},
	} {
		err := e.EnqueueDevice(tc.req, DeviceOp{Stream: s, In: p, Out: p, Bytes: 8}).Wait(ctx)
		var ae *ArgumentError
		if !errors.As(err, &ae) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an ArgumentError saying %q", tc.req.Name, err, tc.want)
		}
	}
	errs := make([]error, n)
	onEachRank(n, func(r int) {
		b := f32(1, 2)
		req := allreduceReq("staged", 2)
		req.GPU = true
		if r == 1 {
			p := upload(t, dc.devs[1], b)
			errs[r] = dc.engines[r].EnqueueDevice(req, DeviceOp{Stream: dc.streams[1], In: p, Out: p, Bytes: 8}).Synchronize(ctx)
			return
		}
		errs[r] = dc.engines[r].Enqueue(req, b, b).Wait(ctx)
	})
	for r, err := range errs {
		if err == nil || !strings.Contains(err.Error(), "staged through host memory") {
			t.Errorf("rank %d: %v, want the staged tensor refused", r, err)
		}
	}
	// The job goes on.
	runBoth(t, dc, devCase{name: "after", reqs: func(r, n int) []negotiate.Request {
		return []negotiate.Request{allreduceReq("after", 5)}
	}}, 9)
}

// A device op whose arguments are wrong on one rank (a tensor on another device, no producer
// stream) fails at once on every rank, with that rank's reason, as a refused host op does: the
// other ranks do not wait for it until the stall deadline. A grouped call with one such member
// fails every member on every rank. The job goes on.
func TestDeviceArgumentRefusalReachesEveryRank(t *testing.T) {
	const n = 3
	cfg := DefaultConfig()
	cfg.StallCrossed = time.Minute // the refusal, not a stall check, must end the others' wait
	dc := newDeviceCluster(t, n, cfg, nil)
	dc.mustUse(t)
	for _, tc := range []struct {
		name  string
		spoil func(*DeviceOp)
		want  string
	}{
		{"wrong device", func(op *DeviceOp) { op.Ordinal = 1 }, "tensor on device 1; the device path runs on device 0"},
		{"no stream", func(op *DeviceOp) { op.Stream = nil }, "no producer stream"},
	} {
		for _, grouped := range []bool{false, true} {
			ctx := waitCtx(t)
			errs := make([][]error, n)
			took := make([]time.Duration, n)
			onEachRank(n, func(r int) {
				var reqs []negotiate.Request
				var ops []DeviceOp
				for i := range 2 {
					p := upload(t, dc.devs[r], f32(1, 2))
					req := allreduceReq(fmt.Sprintf("%s.%v.%d", tc.name, grouped, i), 2)
					if grouped {
						req.Group, req.GroupSize = 77, 2
					}
					reqs = append(reqs, req)
					ops = append(ops, DeviceOp{Stream: dc.streams[r], In: p, Out: p, Bytes: 8})
				}
				if r == 1 {
					tc.spoil(&ops[1])
				}
				start := time.Now()
				var hs []*Handle
				if grouped {
					hs = dc.engines[r].EnqueueDeviceGroup(reqs, ops)
				} else {
					hs = []*Handle{dc.engines[r].EnqueueDevice(reqs[1], ops[1])}
				}
				for _, h := range hs {
					errs[r] = append(errs[r], h.Synchronize(ctx))
				}
				took[r] = time.Since(start)
			})
			for r := range n {
				if took[r] > 5*time.Second {
					t.Errorf("%s (grouped %v): rank %d took %v to fail", tc.name, grouped, r, took[r])
				}
				for i, err := range errs[r] {
					var ae *ArgumentError
					switch {
					case err == nil || !strings.Contains(err.Error(), tc.want):
						t.Errorf("%s (grouped %v): rank %d, op %d: %v, want it refused saying %q", tc.name, grouped, r, i, err, tc.want)
					case r == 1 && !errors.As(err, &ae):
						t.Errorf("%s (grouped %v): rank 1: %v, want an ArgumentError", tc.name, grouped, err)
					case r != 1 && !strings.Contains(err.Error(), "rank 1 refused it"):
						t.Errorf("%s (grouped %v): rank %d: %v, want rank 1 named", tc.name, grouped, r, err)
					}
				}
			}
		}
	}
	runBoth(t, dc, devCase{name: "after", reqs: func(r, n int) []negotiate.Request {
		return []negotiate.Request{allreduceReq("after", 5)}
	}}, 9)
}

// A rank lost inside a device allreduce (its process dies: its device work never reaches the
// collective and its connections close) fails the op on every other rank within the deadline,
// naming it, instead of leaving them in the collective for good; a fresh engine then works.
func TestDeviceLostRankFailsEveryRank(t *testing.T) {
	const n = 3
	cfg := DefaultConfig()
	cfg.ProgressTimeout = 3 * time.Second
	dc := newDeviceCluster(t, n, cfg, nil)
	dc.mustUse(t)
	ctx := waitCtx(t)
	dc.engines[2].dev.comm.(*fake.Comm).Lose()
	type result struct {
		r    int
		err  error
		took time.Duration
	}
	results := make(chan result, n)
	enqueue := func(r int) *Handle {
		p := upload(t, dc.devs[r], f32(1, 2, 3))
		return dc.engines[r].EnqueueDevice(allreduceReq("lost", 3), DeviceOp{Stream: dc.streams[r], In: p, Out: p, Bytes: 12})
	}
	for r := range 2 {
		go func() {
			h := enqueue(r)
			if err := h.Wait(ctx); err != nil {
				results <- result{r, fmt.Errorf("enqueue: %w", err), 0}
				return
			}
			start := time.Now()
			err := h.Synchronize(ctx)
			results <- result{r, err, time.Since(start)}
		}()
	}
	if err := enqueue(2).Wait(ctx); err != nil {
		t.Fatalf("rank 2: %v", err)
	}
	// The survivors are inside the collective, which rank 2 never reaches.
	time.Sleep(100 * time.Millisecond)
	select {
	case res := <-results:
		t.Fatalf("rank %d finished before rank 2 was lost: %v", res.r, res.err)
	default:
	}
	dc.eps[2].Kill(errors.New("rank 2 exited"))
	for range 2 {
		select {
		case res := <-results:
			if res.err == nil || !strings.Contains(res.err.Error(), "rank 2") {
				t.Errorf("rank %d: %v, want a failure naming rank 2", res.r, res.err)
			}
			if res.took > cfg.ProgressTimeout+2*time.Second {
				t.Errorf("rank %d failed after %v, beyond the %v deadline", res.r, res.took, cfg.ProgressTimeout)
			}
		case <-time.After(cfg.ProgressTimeout + 3*time.Second):
			t.Fatal("a surviving rank still waits in the device collective")
		}
	}
	// A new engine, on a new communicator, works.
	fresh := newDeviceCluster(t, 2, DefaultConfig(), nil)
	fresh.mustUse(t)
	runBoth(t, fresh, devCase{name: "fresh", reqs: func(r, n int) []negotiate.Request {
		return []negotiate.Request{allreduceReq("fresh", 4)}
	}}, 3)
}

// A device collective that a connected peer never reaches (its device work is stuck) fails on
// every rank once the progress deadline passes, rather than waiting for ever.
func TestDeviceProgressDeadline(t *testing.T) {
	const n = 2
	cfg := DefaultConfig()
	cfg.ProgressTimeout = time.Second
	dc := newDeviceCluster(t, n, cfg, nil)
	dc.mustUse(t)
	ctx := waitCtx(t)
	dc.engines[1].dev.comm.(*fake.Comm).Lose()
	errs := make([]error, n)
	took := make([]time.Duration, n)
	onEachRank(n, func(r int) {
		p := upload(t, dc.devs[r], f32(1))
		start := time.Now()
		errs[r] = dc.engines[r].EnqueueDevice(allreduceReq("stuck", 1), DeviceOp{Stream: dc.streams[r], In: p, Out: p, Bytes: 4}).Synchronize(ctx)
		took[r] = time.Since(start)
	})
	for r := range n {
		if errs[r] == nil || !strings.Contains(errs[r].Error(), "made no progress") {
			t.Errorf("rank %d: %v, want the device allreduce's deadline", r, errs[r])
		}
		if took[r] > 3*cfg.ProgressTimeout {
			t.Errorf("rank %d failed after %v (deadline %v)", r, took[r], cfg.ProgressTimeout)
		}
	}
}

// Ranks that share a GPU under one NCCL_HOSTID stage (NCCL would refuse them), every rank with the
// same decision and the reason; distinct NCCL_HOSTIDs make them separate hosts to NCCL.
func TestDeviceDecideFallback(t *testing.T) {
	for _, tc := range []struct {
		name    string
		hostIDs []string
		use     bool
	}{
		{"same hostid", []string{"", ""}, false},
		{"distinct hostids", []string{"a", "b"}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dc := newDeviceCluster(t, 2, DefaultConfig(), func(r int) rankDevice {
				return rankDevice{busID: "0000:01:00.0", hostID: tc.hostIDs[r]}
			})
			decs, errs := dc.setUp(t)
			for r := range decs {
				if errs[r] != nil || decs[r].Use != tc.use {
					t.Fatalf("rank %d: %+v, %v; want use=%v", r, decs[r], errs[r], tc.use)
				}
				if !tc.use {
					if !errors.Is(decs[r].Why, gpu.ErrUnavailable) || decs[r].Why.Error() != decs[0].Why.Error() ||
						!strings.Contains(decs[r].Why.Error(), "share GPU 0000:01:00.0") {
						t.Errorf("rank %d: why = %v (rank 0: %v)", r, decs[r].Why, decs[0].Why)
					}
					p := upload(t, dc.devs[r], f32(1))
					err := dc.engines[r].EnqueueDevice(allreduceReq("x", 1), DeviceOp{Stream: dc.streams[r], In: p, Out: p, Bytes: 4}).Wait(waitCtx(t))
					if !errors.Is(err, gpu.ErrUnavailable) {
						t.Errorf("rank %d: a device op when staging: %v, want ErrUnavailable (the caller stages)", r, err)
					}
				}
			}
		})
	}
}

// KOLO_NCCL=1 with a library that cannot load is an error on every rank, naming the rank and why;
// KOLO_NCCL=0 stages without one.
func TestDeviceForcedOnWithoutLibrary(t *testing.T) {
	on, err := gpu.ParseMode(func(k string) string { return map[string]string{"KOLO_NCCL": "1"}[k] })
	if err != nil {
		t.Fatal(err)
	}
	missing := fmt.Errorf("%w: libnccl.so.2: cannot open shared object file", gpu.ErrUnavailable)
	dc := newDeviceCluster(t, 2, DefaultConfig(), func(r int) rankDevice {
		rd := rankDevice{busID: fmt.Sprint(r), setting: on}
		if r == 1 {
			rd.openErr = missing
		}
		return rd
	})
	decs, errs := dc.setUp(t)
	for r := range decs {
		if decs[r].Use || !errors.Is(errs[r], gpu.ErrForcedOn) || !strings.Contains(errs[r].Error(), "KOLO_NCCL=1") ||
			!strings.Contains(errs[r].Error(), "rank 1 on memhost") || !strings.Contains(errs[r].Error(), "libnccl.so.2") {
			t.Errorf("rank %d: %+v, %v; want KOLO_NCCL=1's error naming rank 1 and its library", r, decs[r], errs[r])
		}
	}
	off, _ := gpu.ParseMode(func(k string) string { return map[string]string{"KOLO_NCCL": "0"}[k] })
	dc = newDeviceCluster(t, 2, DefaultConfig(), func(r int) rankDevice { return rankDevice{busID: fmt.Sprint(r), setting: off} })
	decs, errs = dc.setUp(t)
	for r := range decs {
		if decs[r].Use || errs[r] != nil || !strings.Contains(decs[r].Why.Error(), "KOLO_NCCL=0") {
			t.Errorf("rank %d: %+v, %v; want staged by KOLO_NCCL=0", r, decs[r], errs[r])
		}
	}
	if n := dc.opens.Load(); n != 0 {
		t.Errorf("KOLO_NCCL=0 loaded the library %d times", n)
	}
}

// Process sets run device ops on sub-communicators: one that existed when the device path was set
// up and one added after. A grouped allreduce runs as one.
func TestDeviceProcessSetsAndGroups(t *testing.T) {
	t.Run("split", func(t *testing.T) {
		testDeviceProcessSets(t, newDeviceClusterOn(t, 3, DefaultConfig(), fake.NewLibrary(), nil))
	})
	t.Run("new ids", func(t *testing.T) {
		testDeviceProcessSets(t, newDeviceClusterOn(t, 3, DefaultConfig(), noSplitLibrary{fake.NewLibrary()}, nil))
	})
}

// noSplitLibrary forms communicators that cannot split (NCCL before 2.18).
type noSplitLibrary struct{ gpu.Library }

func (l noSplitLibrary) NewComm(ctx context.Context, dev gpu.Device, id gpu.UniqueID, size, rank int) (gpu.Comm, error) {
	c, err := l.Library.NewComm(ctx, dev, id, size, rank)
	if err != nil {
		return nil, err
	}
	return struct{ gpu.Comm }{c}, nil
}

// testDeviceProcessSets runs grouped allreduces on two process sets of dc's 3 ranks, one added
// before the device path started and one after.
func testDeviceProcessSets(t *testing.T, dc *deviceCluster) {
	const n = 3
	ctx := waitCtx(t)
	ids := make([]int, n)
	errs := make([]error, n)
	onEachRank(n, func(r int) { ids[r], errs[r] = dc.engines[r].AddProcessSet(ctx, []int{0, 2}) })
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	dc.mustUse(t)
	onEachRank(n, func(r int) { _, errs[r] = dc.engines[r].AddProcessSet(ctx, []int{1, 2}) })
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	for _, set := range []struct {
		id    int
		ranks []int
	}{{1, []int{0, 2}}, {2, []int{1, 2}}} {
		onEachRank(n, func(r int) {
			errs[r] = nil
			if !slices.Contains(set.ranks, r) {
				return
			}
			p := upload(t, dc.devs[r], f32(float32(r), 1))
			q := upload(t, dc.devs[r], f32(1, float32(r)))
			var hs []*Handle
			for i, ptr := range []gpu.Ptr{p, q} {
				req := allreduceReq(fmt.Sprintf("g%d", i), 2)
				req.Set, req.Group, req.GroupSize = set.id, 7, 2
				hs = append(hs, dc.engines[r].EnqueueDevice(req, DeviceOp{Stream: dc.streams[r], In: ptr, Out: ptr, Bytes: 8}))
			}
			for _, h := range hs {
				if err := h.Synchronize(ctx); err != nil {
					errs[r] = err
					return
				}
			}
			sum := float32(set.ranks[0] + set.ranks[1])
			got := fmt.Sprint(getF32(download(t, dc.devs[r], p, 8)), getF32(download(t, dc.devs[r], q, 8)))
			if want := fmt.Sprint([]float32{sum, 2}, []float32{2, sum}); got != want {
				errs[r] = fmt.Errorf("process set %d: %s, want %s", set.id, got, want)
			}
		})
		if err := errors.Join(errs...); err != nil {
			t.Error(err)
		}
	}
}

// Shutdown with device work that cannot finish (a peer's part never runs) returns within its
// wait, aborting the communicator, and the op reports the failure.
func TestDeviceShutdownWithWorkInFlight(t *testing.T) {
	const n = 2
	cfg := DefaultConfig()
	cfg.ShutdownWait = time.Second
	dc := newDeviceCluster(t, n, cfg, nil)
	dc.mustUse(t)
	ctx := waitCtx(t)
	dc.engines[1].dev.comm.(*fake.Comm).Lose()
	hs := make([]*Handle, n)
	onEachRank(n, func(r int) {
		p := upload(t, dc.devs[r], f32(1))
		hs[r] = dc.engines[r].EnqueueDevice(allreduceReq("late", 1), DeviceOp{Stream: dc.streams[r], In: p, Out: p, Bytes: 4})
		if err := hs[r].Wait(ctx); err != nil {
			t.Errorf("rank %d: %v", r, err)
		}
	})
	start := time.Now()
	onEachRank(n, func(r int) { _ = dc.engines[r].Shutdown(ctx) })
	if took := time.Since(start); took > cfg.ShutdownWait+2*time.Second {
		t.Errorf("shutdown took %v with a %v wait", took, cfg.ShutdownWait)
	}
	for r, h := range hs {
		if err := h.Synchronize(ctx); err == nil || !strings.Contains(err.Error(), "in flight at shutdown") {
			t.Errorf("rank %d: %v, want the op failed by the shutdown", r, err)
		}
	}
}

// An engine-allocated result is freed only once the caller's copy of it, queued on its stream
// before the release, has run.
func TestDeviceReleaseWaitsForTheCopy(t *testing.T) {
	const n = 2
	dc := newDeviceCluster(t, n, DefaultConfig(), nil)
	dc.mustUse(t)
	ctx := waitCtx(t)
	ev, open := gate(t)
	defer open()
	errs := make([]error, n)
	onEachRank(n, func(r int) {
		dev, s := dc.devs[r], dc.streams[r]
		in := upload(t, dev, f32(float32(r)))
		req := negotiate.Request{Name: "gathered", Kind: negotiate.Allgather, DType: dtype.Float32, Shape: []int64{1}}
		h := dc.engines[r].EnqueueDevice(req, DeviceOp{Stream: s, In: in, Bytes: 4})
		if err := h.Synchronize(ctx); err != nil {
			errs[r] = err
			return
		}
		p, size := h.DeviceOutput()
		consumer, _ := dev.NewStream()
		dst := upload(t, dev, make([]byte, size))
		for _, err := range []error{h.WaitOnStream(consumer), consumer.WaitEvent(ev), consumer.CopyAsync(dst, p, size), h.ReleaseDeviceOutput(consumer)} {
			if err != nil {
				errs[r] = err
				return
			}
		}
		if err := h.ReleaseDeviceOutput(consumer); err == nil {
			errs[r] = errors.New("a second release succeeded")
			return
		}
		time.Sleep(3 * checkEvery) // the reaper looks every checkEvery
		if _, err := dev.Bytes(p, size); err != nil {
			errs[r] = fmt.Errorf("freed while the caller's copy still waits: %w", err)
			return
		}
	})
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	open()
	for r := range n {
		if err := dc.streams[r].Synchronize(ctx); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(5 * time.Second)
	for r := range n {
		d := dc.engines[r].dev
		for {
			d.wmu.Lock()
			left := len(d.frees)
			d.wmu.Unlock()
			if left == 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("rank %d: the result is not freed 5 s after the copy ran", r)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
}

// idOnceLibrary cannot split and makes one communicator id: the job's. A process set's
// communicator then cannot form.
type idOnceLibrary struct {
	noSplitLibrary
	made *atomic.Int32
}

func (l idOnceLibrary) NewUniqueID() (gpu.UniqueID, error) {
	if l.made.Add(1) > 1 {
		return gpu.UniqueID{}, errors.New("out of ids")
	}
	return l.noSplitLibrary.NewUniqueID()
}

// A process set whose device communicator could not form stages its GPU ops on every rank:
// EnqueueDevice refuses them (gpu.ErrUnavailable, with why) and the staged op then runs, where the
// global set's GPU ops must come through the device path.
func TestDeviceSetWithoutCommunicatorStages(t *testing.T) {
	const n = 3
	dc := newDeviceClusterOn(t, n, DefaultConfig(), idOnceLibrary{noSplitLibrary{fake.NewLibrary()}, new(atomic.Int32)}, nil)
	dc.mustUse(t)
	ctx := waitCtx(t)
	ids := make([]int, n)
	errs := make([]error, n)
	onEachRank(n, func(r int) { ids[r], errs[r] = dc.engines[r].AddProcessSet(ctx, []int{0, 1}) })
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	onEachRank(n, func(r int) {
		buf := f32(float32(r+1), 1)
		defer func() {
			if errs[r] != nil {
				return
			}
			// The global set still has its communicator: a staged GPU op there is refused.
			g := allreduceReq("g", 2)
			g.GPU = true
			if err := dc.engines[r].Enqueue(g, buf, buf).Wait(ctx); err == nil || !strings.Contains(err.Error(), "EnqueueDevice") {
				errs[r] = fmt.Errorf("staged op on the global set: %v, want a refusal", err)
			}
		}()
		if r == 2 {
			return // not in the set
		}
		req := allreduceReq("s", 2)
		req.Set, req.GPU = ids[r], true
		p := upload(t, dc.devs[r], f32(1, 2))
		err := dc.engines[r].EnqueueDevice(req, DeviceOp{Stream: dc.streams[r], In: p, Out: p, Bytes: 8}).Wait(ctx)
		if !errors.Is(err, gpu.ErrUnavailable) || !strings.Contains(err.Error(), "process set 1: forming its communicator") {
			errs[r] = fmt.Errorf("device op on the set: %v, want a refusal saying why", err)
			return
		}
		if err := dc.engines[r].Enqueue(req, buf, buf).Wait(ctx); err != nil {
			errs[r] = fmt.Errorf("staged op on the set: %w", err)
			return
		}
		if got := getF32(buf); got[0] != 3 || got[1] != 2 {
			errs[r] = fmt.Errorf("staged op on the set: %v, want [3 2]", got)
		}
	})
	if err := errors.Join(errs...); err != nil {
		t.Error(err)
	}
}
