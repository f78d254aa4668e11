package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kolo-dl/kolo"
	"github.com/kolo-dl/kolo/internal/launch/flags"
)

func TestFormatCheckBuild(t *testing.T) {
	tests := []struct {
		name string
		info buildInfo
		want []string
		not  []string
	}{
		{"binding present", buildInfo{Version: "0.1.0", PyTorch: true, SharedMemory: true},
			[]string{"kolo v0.1.0:", "Available Frameworks:", "    [X] PyTorch", "    [ ] TensorFlow", "Available Controllers:",
				"    [X] kolo (TCP rendezvous", "    [ ] MPI", "    [ ] Gloo", "Available Tensor Operations:", "    [ ] NCCL",
				"    [X] shared memory", "    [X] TCP"},
			[]string{"[X] NCCL", "[X] MPI", "[X] Gloo", "[X] TensorFlow"}},
		{"shared memory sized", buildInfo{Version: "0.1.0", SharedMemory: true, ShmFree: 100 << 20, ShmSizes: []shmSize{
			{ranks: 2, reserved: 16 << 20, total: 18 << 20}, {ranks: 64, reserved: 90 << 20, total: 500 << 20},
			{ranks: 128, reserved: 260 << 20, total: 1403 << 20}}},
			[]string{"Shared memory per host (/dev/shm: 100.0 MiB free", "    2            16.0 MiB             18.0 MiB\n",
				"64           90.0 MiB             500.0 MiB  <- a job whose process sets within a host exchange much may fill it",
				"128          260.0 MiB            1403.0 MiB  <- does not fit: the job cannot start"},
			nil},
		{"NCCL in PyTorch", buildInfo{Version: "0.1.0", PyTorch: true, NCCL: 22809, NCCLSetting: "off (KOLO_NCCL=0)"},
			[]string{"    [X] NCCL (loaded at run time", "NCCL: 2.28.9; device path off (KOLO_NCCL=0)."}, nil},
		{"TensorFlow too", buildInfo{Version: "0.1.0", PyTorch: true, TensorFlow: true,
			TensorFlowDetail: "python3 imports kolo.tensorflow 0.1.0 with TensorFlow 2.21.0"},
			[]string{"    [X] TensorFlow", "    [X] PyTorch", "TensorFlow: python3 imports kolo.tensorflow 0.1.0 with TensorFlow 2.21.0"}, nil},
		{"no binding, no /dev/shm", buildInfo{Version: "0.1.0", PyTorchDetail: "python3 cannot import kolo.torch: ModuleNotFoundError"},
			[]string{"    [ ] PyTorch", "    [ ] shared memory", "PyTorch: python3 cannot import kolo.torch"},
			[]string{"[X] PyTorch", "[X] shared memory"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			out := formatCheckBuild(tc.info)
			for _, w := range tc.want {
				if !strings.Contains(out, w) {
					t.Errorf("output lacks %q:\n%s", w, out)
				}
			}
			for _, n := range tc.not {
				if strings.Contains(out, n) {
					t.Errorf("output has %q:\n%s", n, out)
				}
			}
		})
	}
}

// The probe tells the truth about a python that lacks the binding, one that has it without its
// library, and one that has both (fake interpreters standing in for python3).
func TestProbePyTorch(t *testing.T) {
	dir := t.TempDir()
	fake := func(name, script string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte("#!/bin/sh\n"+script), 0o755); err != nil {
			t.Fatal(err)
		}
		return p
	}
	lib := filepath.Join(dir, "libkolo.so")
	os.WriteFile(lib, nil, 0o644)
	tests := []struct {
		name, script string
		ok           bool
		detail       string
		nccl         int
	}{
		{"missing", "echo \"ModuleNotFoundError: No module named 'kolo'\" >&2; exit 1", false, "cannot import kolo.torch: ModuleNotFoundError", 0},
		{"no library", "echo 0.1.0 /nowhere/libkolo.so False 0", false, "engine library /nowhere/libkolo.so is missing", 0},
		{"present", "echo 0.1.0 " + lib + " True 0", true, "imports kolo.torch 0.1.0", 0},
		{"with NCCL", "echo 0.1.0 " + lib + " True 22809", true, "PyTorch's NCCL 2.28.9", 22809},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ok, detail, nccl := probePyTorch(context.Background(), fake(tc.name, tc.script))
			if ok != tc.ok || !strings.Contains(detail, tc.detail) || nccl != tc.nccl {
				t.Errorf("probe = %v %q %d, want %v %q %d", ok, detail, nccl, tc.ok, tc.detail, tc.nccl)
			}
		})
	}
}

// The TensorFlow probe, as TestProbePyTorch's: missing, without its library, present.
func TestProbeTensorFlow(t *testing.T) {
	dir := t.TempDir()
	lib := filepath.Join(dir, "libkolo.so")
	os.WriteFile(lib, nil, 0o644)
	for _, tc := range []struct {
		name, script string
		ok           bool
		detail       string
	}{
		{"missing", "echo \"ModuleNotFoundError: No module named 'tensorflow'\" >&2; exit 1", false,
			"cannot import kolo.tensorflow: ModuleNotFoundError: No module named 'tensorflow'"},
		{"no library", "echo 0.1.0 /nowhere/libkolo.so False 2.21.0", false, "engine library /nowhere/libkolo.so is missing"},
		{"present", "echo 0.1.0 " + lib + " True 2.21.0", true, "imports kolo.tensorflow 0.1.0 with TensorFlow 2.21.0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := filepath.Join(dir, tc.name)
			if err := os.WriteFile(p, []byte("#!/bin/sh\n"+tc.script), 0o755); err != nil {
				t.Fatal(err)
			}
			ok, detail := probeTensorFlow(context.Background(), p)
			if ok != tc.ok || !strings.Contains(detail, tc.detail) {
				t.Errorf("probe = %v %q, want %v %q", ok, detail, tc.ok, tc.detail)
			}
		})
	}
}

// The probe against the real python3 agrees with whether it can import kolo.torch: a check that
// the probe script itself works (it runs only where python3 exists).
func TestProbeRealPython(t *testing.T) {
	if _, err := os.Stat("/usr/bin/python3"); err != nil {
		t.Skip("no /usr/bin/python3")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	ok, detail, _ := probePyTorch(ctx, "/usr/bin/python3")
	if ok && !strings.Contains(detail, kolo.Version) {
		t.Errorf("probe says present but names no version: %q", detail)
	}
	if !ok && !strings.Contains(detail, "kolo") {
		t.Errorf("probe failed without saying why: %q", detail)
	}
	t.Logf("python3: ok=%v %s", ok, detail)
}

func TestBeforeLaunch(t *testing.T) {
	var b strings.Builder
	if code, done := beforeLaunch(&flags.Options{Version: true}, &b); !done || code != 0 || b.String() != "kolo "+kolo.Version+"\n" {
		t.Errorf("-v: %d %v %q", code, done, b.String())
	}
	if _, done := beforeLaunch(&flags.Options{Command: []string{"prog"}}, &b); done {
		t.Error("a launch ended before launching")
	}
}

func TestShmRanks(t *testing.T) {
	for _, tc := range []struct {
		local int
		want  string
	}{
		{0, "[2 8 32 64 128]"},
		{1, "[2 8 32 64 128]"},
		{8, "[2 8 32 64 128]"},
		{12, "[2 8 12 32 64 128]"},
		{256, "[2 8 32 64 128 256]"},
	} {
		if got := fmt.Sprint(shmRanks(tc.local)); got != tc.want {
			t.Errorf("shmRanks(%d) = %s, want %s", tc.local, got, tc.want)
		}
	}
}
