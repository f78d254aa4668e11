//go:build cgo && linux

package nccl

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kolo-dl/kolo/internal/gpu"
)

func TestConfigLayoutMatchesCompiler(t *testing.T) {
	if cConfigSize != configSize {
		t.Errorf("C sizeof %d, want %d", cConfigSize, configSize)
	}
	for i, want := range []uintptr{configOffMagic, configOffVersion, configOffBlocking, configOffCGACluster,
		configOffMinCTAs, configOffMaxCTAs, configOffNetName, configOffSplitShare} {
		if got := configOffset(i); got != want {
			t.Errorf("field %d at %d, want %d", i, got, want)
		}
	}
}

// A name that is no library on this machine (there is no GPU here).
func TestOpenMissingLibrary(t *testing.T) {
	_, err := open(Options{NCCLPaths: []string{"/nonexistent/libnccl.so.2"}})
	if err != nil && !errors.Is(err, gpu.ErrUnavailable) {
		t.Fatalf("error %v does not match ErrUnavailable", err)
	}
	if _, statErr := exec.LookPath("nvidia-smi"); statErr == nil {
		t.Skip("a GPU machine: libnccl may be present")
	}
	if standinLoaded() {
		t.Skip("the stand-in's NCCL is loaded in this process already, and dlopen finds it by its soname")
	}
	if !errors.Is(err, ErrNotFound) || !strings.Contains(err.Error(), "libnccl.so.2 not found") ||
		!strings.Contains(err.Error(), "/nonexistent/libnccl.so.2") {
		t.Fatalf("open = %v, want libnccl.so.2 not found naming the paths tried", err)
	}
}

// standinLoaded reports whether the stand-in's libraries are in this process (loaded by an earlier
// test, or an earlier -count round): dlopen finds them by their sonames, and kolo prefers a
// library already loaded.
func standinLoaded() bool {
	maps, _ := os.ReadFile("/proc/self/maps")
	return strings.Contains(string(maps), "kolo-standin-")
}

// fakeLib compiles a shared library exporting the given C source, standing for a libnccl or
// libcudart of a given version, to drive Open's loading and version rules without a GPU.
func fakeLib(t *testing.T, name, src string) string {
	t.Helper()
	cc, err := exec.LookPath("cc")
	if err != nil {
		t.Skip("no C compiler")
	}
	dir := t.TempDir()
	c := filepath.Join(dir, name+".c")
	if err := os.WriteFile(c, []byte(src), 0o600); err != nil {
		t.Fatal(err)
	}
	so := filepath.Join(dir, name)
	if out, err := exec.Command(cc, "-shared", "-fPIC", "-o", so, c).CombinedOutput(); err != nil {
		t.Fatalf("cc: %v\n%s", err, out)
	}
	return so
}

var ncclSymbols = []string{"ncclGetUniqueId", "ncclCommInitRankConfig", "ncclCommGetAsyncError", "ncclCommAbort",
	"ncclCommDestroy", "ncclCommFinalize", "ncclCommCount", "ncclCommUserRank", "ncclAllReduce", "ncclBroadcast",
	"ncclAllGather", "ncclReduceScatter", "ncclSend", "ncclRecv", "ncclGroupStart", "ncclGroupEnd"}

func ncclSource(code int, symbols []string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "int ncclGetVersion(int* v) { *v = %d; return 0; }\n", code)
	for _, s := range symbols {
		fmt.Fprintf(&b, "int %s(void) { return 3; }\n", s)
	}
	return b.String()
}

func TestOpenRules(t *testing.T) {
	for _, tc := range []struct {
		name    string
		code    int
		symbols []string
		is      error
		says    string
	}{
		{"too old", 21212, ncclSymbols, ErrTooOld, "NCCL 2.12.12, older than 2.14"},
		{"lacks a function", 22809, ncclSymbols[1:], ErrTooOld, "missing symbol ncclGetUniqueId"},
		{"no CUDA runtime", 22809, ncclSymbols, ErrNotFound, "CUDA runtime (libcudart) not found"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lib := fakeLib(t, "libnccl.so.2", ncclSource(tc.code, tc.symbols))
			_, err := open(Options{NCCLPaths: []string{lib}, CUDAPaths: []string{"/nonexistent/libcudart.so"}})
			if _, e := exec.LookPath("nvidia-smi"); e == nil && tc.is == ErrNotFound {
				t.Skip("a GPU machine: a CUDA runtime is on the search path")
			}
			if standinLoaded() {
				t.Skip("the stand-in's libraries are loaded in this process already (an earlier test's), and kolo prefers them")
			}
			if !errors.Is(err, tc.is) || !errors.Is(err, gpu.ErrUnavailable) || !strings.Contains(err.Error(), tc.says) {
				t.Fatalf("open = %v, want %v saying %q", err, tc.is, tc.says)
			}
		})
	}
}
