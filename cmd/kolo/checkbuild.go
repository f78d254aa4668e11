package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/kolo-dl/kolo"
	"github.com/kolo-dl/kolo/internal/gpu"
	"github.com/kolo-dl/kolo/internal/jobenv"
	"github.com/kolo-dl/kolo/internal/launch/flags"
	"github.com/kolo-dl/kolo/internal/transport/shm"
)

// beforeLaunch handles what kolo run does before (or instead of) launching: -v, -cb, and the
// launcher's own log level. done means kolo run ends with code.
func beforeLaunch(opts *flags.Options, stdout io.Writer) (code int, done bool) {
	if opts.LogLevel != "" {
		if l, err := jobenv.ParseLogLevel(opts.LogLevel); err == nil {
			slog.SetLogLoggerLevel(l)
		}
	}
	switch {
	case opts.Version:
		fmt.Fprintln(stdout, "kolo", kolo.Version)
		return 0, true
	case opts.CheckBuild:
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		local := opts.NprocPerNode
		if local == 0 && opts.Hosts == "" && opts.Hostfile == "" {
			local = opts.NP // -np N alone runs N ranks here
		}
		fmt.Fprint(stdout, formatCheckBuild(probeBuild(ctx, local)))
		return 0, true
	}
	return 0, false
}

// buildInfo is what this installation of kolo can do, found out by probing, not assumed.
type buildInfo struct {
	Version       string
	PyTorch       bool   // a python3 imports kolo.torch and the engine library is there
	PyTorchDetail string // per interpreter probed: which one, and why not or which library
	// TensorFlow: a python3 imports kolo.tensorflow (and so TensorFlow) and the engine library is
	// there; TensorFlowDetail as PyTorchDetail.
	TensorFlow       bool
	TensorFlowDetail string
	// NCCL is the version code of the NCCL a probed PyTorch has (hvd.nccl_built(): the library
	// ranks load at run time for CUDA tensors), 0 for none; NCCLSetting what KOLO_NCCL or
	// HOROVOD_GPU_* say.
	NCCL         int
	NCCLSetting  string
	SharedMemory bool  // Linux with a /dev/shm directory
	ShmFree      int64 // free bytes in /dev/shm; -1 unknown
	// ShmSizes is the host's segment by local ranks: what Open reserves, and the most once every
	// ring is used (the pair rings carry what process sets within a host exchange), with the
	// default sizes.
	ShmSizes []shmSize
}

type shmSize struct {
	ranks           int
	reserved, total int64
}

// shmRanks are the local rank counts --check-build sizes the segment for: the common ones, and
// the job's own when -np or --nproc-per-node says it.
func shmRanks(local int) []int {
	out := []int{2, 8, 32, 64, 128}
	if local > 1 && !slices.Contains(out, local) {
		out = append(out, local)
		slices.Sort(out)
	}
	return out
}

func mib(n int64) string { return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20)) }

// checkbox lines in horovodrun --check-build's layout.
func formatCheckBuild(b buildInfo) string {
	box := func(ok bool) string {
		if ok {
			return "[X]"
		}
		return "[ ]"
	}
	var s strings.Builder
	fmt.Fprintf(&s, "kolo v%s:\n\n", b.Version)
	fmt.Fprintf(&s, "Available Frameworks:\n")
	fmt.Fprintf(&s, "    %s TensorFlow\n    %s PyTorch\n    [ ] MXNet\n    [X] Go (github.com/kolo-dl/kolo)\n\n", box(b.TensorFlow), box(b.PyTorch))
	fmt.Fprintf(&s, "Available Controllers:\n")
	fmt.Fprintf(&s, "    [ ] MPI\n    [ ] Gloo\n    [X] kolo (TCP rendezvous; runs under kolo run, mpirun and srun)\n\n")
	fmt.Fprintf(&s, "Available Tensor Operations:\n")
	fmt.Fprintf(&s, "    %s NCCL (loaded at run time for CUDA tensors)\n    [ ] DDL\n    [ ] CCL\n    [ ] MPI\n    [ ] Gloo\n", box(b.NCCL > 0))
	fmt.Fprintf(&s, "    %s shared memory (ranks of one host)\n    [X] TCP (ranks of different hosts)\n", box(b.SharedMemory))
	if b.TensorFlowDetail != "" {
		fmt.Fprintf(&s, "\nTensorFlow: %s\n", b.TensorFlowDetail)
	}
	if b.PyTorchDetail != "" {
		fmt.Fprintf(&s, "\nPyTorch: %s\n", b.PyTorchDetail)
	}
	if b.NCCL > 0 || b.NCCLSetting != "" {
		setting := b.NCCLSetting
		if setting == "" {
			setting = "auto"
		}
		fmt.Fprintf(&s, "\nNCCL: %s; device path %s. A job decides at its first op on a CUDA tensor, the same on every\n"+
			"rank, and each rank logs it (\"GPU tensors use the device path\", or \"are staged through host memory\" and why).\n",
			ncclVersion(b.NCCL), setting)
	}
	if b.SharedMemory && len(b.ShmSizes) > 0 {
		free := "unknown"
		if b.ShmFree >= 0 {
			free = mib(b.ShmFree)
		}
		fmt.Fprintf(&s, "\nShared memory per host (/dev/shm: %s free; a container's is 64 MiB unless raised):\n", free)
		fmt.Fprintf(&s, "    %-12s %-20s %s\n", "local ranks", "reserved at start", "at most (every ring used)")
		for _, z := range b.ShmSizes {
			warn := ""
			switch {
			case b.ShmFree >= 0 && z.reserved > b.ShmFree:
				warn = "  <- does not fit: the job cannot start"
			case b.ShmFree >= 0 && z.total > b.ShmFree:
				warn = "  <- a job whose process sets within a host exchange much may fill it"
			}
			fmt.Fprintf(&s, "    %-12d %-20s %s%s\n", z.ranks, mib(z.reserved), mib(z.total), warn)
		}
	}
	return s.String()
}

func probeBuild(ctx context.Context, localRanks int) buildInfo {
	b := buildInfo{Version: kolo.Version, ShmFree: -1}
	if fi, err := os.Stat("/dev/shm"); err == nil && fi.IsDir() && runtime.GOOS == "linux" {
		b.SharedMemory = true
		var st syscall.Statfs_t
		if syscall.Statfs("/dev/shm", &st) == nil && st.Blocks > 0 {
			b.ShmFree = int64(st.Bavail) * int64(st.Bsize)
		}
		for _, n := range shmRanks(localRanks) {
			cfg := shm.Config{Name: "check-build", Size: n}
			b.ShmSizes = append(b.ShmSizes, shmSize{ranks: n, reserved: shm.ReservedBytes(cfg), total: shm.SegmentBytes(cfg)})
		}
	}
	var details, tfDetails []string
	for _, py := range pythons() {
		ok, detail, nccl := probePyTorch(ctx, py)
		b.PyTorch = b.PyTorch || ok
		b.NCCL = max(b.NCCL, nccl)
		details = append(details, detail)
		ok, detail = probeTensorFlow(ctx, py)
		b.TensorFlow = b.TensorFlow || ok
		tfDetails = append(tfDetails, detail)
	}
	b.TensorFlowDetail = strings.Join(tfDetails, "\n            ")
	if set, err := gpu.ParseMode(os.Getenv); err != nil {
		b.NCCLSetting = err.Error()
	} else if set.From != "" {
		b.NCCLSetting = fmt.Sprintf("%s (%s)", set.Mode, set.From)
	}
	b.PyTorchDetail = strings.Join(details, "\n         ")
	return b
}

// pythons are the interpreters a training script would most likely run under: python3 on PATH
// and the system's.
func pythons() []string {
	var out []string
	if p, err := exec.LookPath("python3"); err == nil {
		out = append(out, p)
	}
	if _, err := os.Stat("/usr/bin/python3"); err == nil && (len(out) == 0 || out[0] != "/usr/bin/python3") {
		out = append(out, "/usr/bin/python3")
	}
	return out
}

// probePython imports the binding the way a training script does and checks that the engine
// library it would load exists.
const probePython = `import os, kolo, kolo.torch, kolo._lib as l
p = l.library_path()
print(kolo.__version__, p, os.path.exists(p), kolo.torch.nccl_built())`

// probePyTorch also returns the version code of the NCCL that python's PyTorch has (0: none).
func probePyTorch(ctx context.Context, python string) (ok bool, detail string, nccl int) {
	out, err := exec.CommandContext(ctx, python, "-c", probePython).CombinedOutput()
	text := strings.TrimSpace(string(out))
	if err != nil {
		lines := strings.Split(text, "\n")
		return false, fmt.Sprintf("%s cannot import kolo.torch: %s", python, lines[len(lines)-1]), 0
	}
	var version, lib, exists string
	fmt.Sscan(lastLine(text), &version, &lib, &exists, &nccl)
	if exists != "True" {
		return false, fmt.Sprintf("%s imports kolo.torch %s, but its engine library %s is missing", python, version, lib), 0
	}
	withNCCL := ""
	if nccl > 0 {
		withNCCL = ", PyTorch's NCCL " + ncclVersion(nccl)
	}
	return true, fmt.Sprintf("%s imports kolo.torch %s (engine library %s%s)", python, version, lib, withNCCL), nccl
}

// probeTensorFlowPython imports kolo.tensorflow (which imports TensorFlow) the way a training
// script does and checks that the engine library it would load exists.
const probeTensorFlowPython = `import os, kolo, kolo.tensorflow, kolo._lib as l, tensorflow as tf
p = l.library_path()
print(kolo.__version__, p, os.path.exists(p), tf.__version__)`

// probeTensorFlow says whether python serves kolo.tensorflow, and which TensorFlow it has.
func probeTensorFlow(ctx context.Context, python string) (ok bool, detail string) {
	out, err := exec.CommandContext(ctx, python, "-c", probeTensorFlowPython).CombinedOutput()
	text := strings.TrimSpace(string(out))
	if err != nil {
		return false, fmt.Sprintf("%s cannot import kolo.tensorflow: %s", python, lastLine(text))
	}
	var version, lib, exists, tfVersion string
	fmt.Sscan(lastLine(text), &version, &lib, &exists, &tfVersion)
	if exists != "True" {
		return false, fmt.Sprintf("%s imports kolo.tensorflow %s, but its engine library %s is missing", python, version, lib)
	}
	return true, fmt.Sprintf("%s imports kolo.tensorflow %s with TensorFlow %s (engine library %s)", python, version, tfVersion, lib)
}

// ncclVersion reads nccl.h's version code (2.21.5: 22105; before 2.9: 2805 for 2.8.5).
func ncclVersion(code int) string {
	switch {
	case code <= 0:
		return "none in PyTorch"
	case code >= 20900:
		return fmt.Sprintf("%d.%d.%d", code/10000, code/100%100, code%100)
	default:
		return fmt.Sprintf("%d.%d.%d", code/1000, code/100%10, code%100)
	}
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}
