// Package ncclstandin builds a stand-in libnccl.so.2 and libcudart.so.12 from the C sources in
// src/, with the machine's C compiler, so that internal/gpu/nccl's real dlopen path (and the engine's
// device path above it) runs in tests on machines without a GPU. Device memory is host memory,
// streams are threads, and ranks, in one process or many, meet through files in a directory; see
// src/nccl.c for the NCCL semantics it keeps and the misuse it reports.
//
// The libraries read their settings from the environment when they need them: STANDIN_NCCL_DIR,
// the directory where a communicator's ranks meet (every rank of a test the same; default
// /dev/shm/kolo-standin-nccl); STANDIN_REPORT, a file misuse is appended to (Reports reads it);
// STANDIN_DEADLINE_S, how long any wait lasts before it gives up and reports (120 s); and
// STANDIN_CUDA_DEVICES, the device count (8).
//
// It is test support: production code must not import it.
package ncclstandin

import (
	"embed"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

//go:embed src/*.c src/*.h
var sources embed.FS

// Variant says how to build the stand-in.
type Variant struct {
	// Version is what ncclGetVersion reports (NCCL's code, 22304 for 2.23.4); 0 for the default.
	Version int
	// NoSplit leaves ncclCommSplit out, as NCCL before 2.18.
	NoSplit bool
}

// Libs is a built stand-in.
type Libs struct {
	Dir  string // holds libnccl.so.2 and libcudart.so.12: an LD_LIBRARY_PATH for child processes
	NCCL string // Dir/libnccl.so.2
	CUDA string // Dir/libcudart.so.12
}

// Build compiles the stand-in into dir (a t.TempDir or a directory a TestMain removes).
func Build(dir string, v Variant) (Libs, error) {
	cc, err := exec.LookPath("cc")
	if err != nil {
		if cc, err = exec.LookPath("gcc"); err != nil {
			return Libs{}, fmt.Errorf("no C compiler to build the stand-in NCCL: %w", err)
		}
	}
	src := filepath.Join(dir, "src")
	if err := os.MkdirAll(src, 0o700); err != nil {
		return Libs{}, err
	}
	entries, err := sources.ReadDir("src")
	if err != nil {
		return Libs{}, err
	}
	for _, e := range entries {
		b, err := sources.ReadFile("src/" + e.Name())
		if err != nil {
			return Libs{}, err
		}
		if err := os.WriteFile(filepath.Join(src, e.Name()), b, 0o600); err != nil {
			return Libs{}, err
		}
	}
	l := Libs{Dir: dir, NCCL: filepath.Join(dir, "libnccl.so.2"), CUDA: filepath.Join(dir, "libcudart.so.12")}
	flags := []string{"-O2", "-g", "-Wall", "-Werror", "-shared", "-fPIC", "-pthread"}
	cuda := append(append([]string(nil), flags...), "-Wl,-soname,libcudart.so.12", "-o", l.CUDA, filepath.Join(src, "cudart.c"))
	nccl := append(append([]string(nil), flags...), "-Wl,-soname,libnccl.so.2", "-o", l.NCCL, filepath.Join(src, "nccl.c"),
		"-L"+dir, "-l:libcudart.so.12", "-Wl,-rpath,$ORIGIN")
	if v.Version != 0 {
		nccl = append(nccl, fmt.Sprintf("-DSTANDIN_NCCL_VERSION=%d", v.Version))
	}
	if v.NoSplit {
		nccl = append(nccl, "-DSTANDIN_NO_SPLIT")
	}
	for _, args := range [][]string{cuda, nccl} {
		if out, err := exec.Command(cc, args...).CombinedOutput(); err != nil {
			return Libs{}, fmt.Errorf("%s %s: %w\n%s", cc, strings.Join(args, " "), err, out)
		}
	}
	return l, nil
}

// Reports is what the stand-in reported in file path ("" when it reported nothing).
func Reports(path string) string {
	b, _ := os.ReadFile(path)
	return string(b)
}
