//go:build cgo && linux

package nccl

// dl.go writes NCCL's and the CUDA runtime's declarations by hand, so that kolo builds without
// them. These tests hold them to the real headers and libraries, from PyPI's nvidia wheels that
// scripts/deps.sh installs into .venv/nvidia (no GPU needed): a compiled check of every
// declaration, constant and ncclConfig_t offset, and a load of the real libraries on a machine
// without a GPU. Without the wheels they skip, and fail under KOLO_REQUIRE_TESTBEDS=1 (CI).

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"

	"github.com/kolo-dl/kolo/internal/gpu"
)

// realLibsChild marks the process that loads the real libraries.
const realLibsChild = "KOLO_NCCL_TEST_REAL_LIBRARIES"

// nvidiaWheels is the nvidia/ directory of PyPI's wheels that scripts/deps.sh installs, or the
// test is skipped (failed under KOLO_REQUIRE_TESTBEDS=1) saying how to install them.
func nvidiaWheels(t *testing.T, need ...string) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			break
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("no go.mod above the test's directory")
		}
		dir = parent
	}
	root := filepath.Join(dir, ".venv", "nvidia", "nvidia")
	for _, n := range need {
		if _, err := os.Stat(filepath.Join(root, n)); err != nil {
			why := fmt.Sprintf("%s missing: PyPI's nvidia wheels are not installed (scripts/deps.sh installs them)", filepath.Join(root, n))
			if os.Getenv("KOLO_REQUIRE_TESTBEDS") == "1" {
				t.Fatal(why)
			}
			t.Skip(why)
		}
	}
	return root
}

// preamble is dl.go's C preamble.
func preamble(t *testing.T) string {
	t.Helper()
	src, err := os.ReadFile("dl.go")
	if err != nil {
		t.Fatal(err)
	}
	s := string(src)
	start, end := strings.Index(s, "/*\n"), strings.Index(s, "*/\nimport \"C\"")
	if start < 0 || end < start {
		t.Fatal("dl.go: no C preamble before import \"C\"")
	}
	return cgoLine.ReplaceAllString(s[start+3:end], "")
}

var cgoLine = regexp.MustCompile(`(?m)^#cgo .*$`)

// ownTypedefs are dl.go's stand-ins for the headers' types, with what the check asserts of each
// instead: the same size and passing (an int for an enum, void* for a handle).
var ownTypedefs = map[string]string{
	"ncclResult_t": "sizeof(ncclResult_t) == sizeof(int)",
	"ncclComm_t":   "sizeof(ncclComm_t) == sizeof(void*)",
	"ncclUniqueId": "sizeof(ncclUniqueId) == 128 && offsetof(ncclUniqueId, internal) == 0",
	"cudaError_t":  "sizeof(cudaError_t) == sizeof(int)",
	"cudaStream_t": "sizeof(cudaStream_t) == sizeof(void*)",
	"cudaEvent_t":  "sizeof(cudaEvent_t) == sizeof(void*)",
}

// enumParams are the parameters dl.go declares as int where the headers have an enum (the same
// size, passed alike): K's field, the parameter's index, the header's type.
var enumParams = map[string]map[int]string{
	"allReduce":     {3: "ncclDataType_t", 4: "ncclRedOp_t"},
	"broadcast":     {3: "ncclDataType_t"},
	"allGather":     {3: "ncclDataType_t"},
	"reduceScatter": {3: "ncclDataType_t", 4: "ncclRedOp_t"},
	"send":          {2: "ncclDataType_t"},
	"recv":          {2: "ncclDataType_t"},
	"memcpyAsync":   {3: "enum cudaMemcpyKind"},
}

var (
	typedefLine = regexp.MustCompile(`(?m)^typedef (?:[^;{]|\{[^}]*\})* (\w+);\s*$`)
	fieldLine   = regexp.MustCompile(`(?m)^\t(.+?) \(\*(\w+)\)\((.*)\);`)
	bindLine    = regexp.MustCompile(`(?m)^\t(?:SYM|OPT)\(h, (\w+), "(\w+)"\)`)
	macroLine   = regexp.MustCompile(`(?m)^#define (kolo\w+) (\S+)\s+// (\w+)`)
)

// headerCheck is a C program that includes the real headers and dl.go's preamble (less its own
// typedefs of the headers' names) and fails to compile, or exits non-zero, where they disagree.
func headerCheck(t *testing.T) string {
	t.Helper()
	pre := preamble(t)
	var b strings.Builder
	b.WriteString("#include <nccl.h>\n#include <cuda_runtime_api.h>\n#include <stddef.h>\n#include <stdio.h>\n")
	// dl.go's own typedefs of the headers' names give way to the headers'; what they assumed is
	// asserted below.
	stripped := map[string]bool{}
	pre = typedefLine.ReplaceAllStringFunc(pre, func(line string) string {
		name := typedefLine.FindStringSubmatch(line)[1]
		if _, ok := ownTypedefs[name]; ok {
			stripped[name] = true
			return "/* dl.go's typedef of " + name + " */"
		}
		return line
	})
	for name, assertion := range ownTypedefs {
		if !stripped[name] {
			t.Errorf("dl.go no longer typedefs %s: update ownTypedefs", name)
		}
		fmt.Fprintf(&b, "_Static_assert(%s, %q);\n", assertion, "dl.go's "+name)
	}
	b.WriteString(pre)
	b.WriteString("\n// The checks.\n")

	// Every function kolo binds has the headers' type, once the enums dl.go writes as int are
	// given their names.
	symbols := map[string]string{}
	for _, m := range bindLine.FindAllStringSubmatch(pre, -1) {
		symbols[m[1]] = m[2]
	}
	fields := fieldLine.FindAllStringSubmatch(pre, -1)
	if len(fields) < 30 || len(fields) != len(symbols) {
		t.Fatalf("dl.go: %d function pointers in K, %d bound by name", len(fields), len(symbols))
	}
	for _, f := range fields {
		ret, field, params := f[1], f[2], strings.Split(f[3], ", ")
		sym, ok := symbols[field]
		if !ok {
			t.Errorf("K.%s is bound to no symbol", field)
			continue
		}
		for i, enum := range enumParams[field] {
			if i >= len(params) || params[i] != "int" {
				t.Errorf("K.%s: parameter %d is not an int (enumParams is out of date)", field, i)
				continue
			}
			fmt.Fprintf(&b, "_Static_assert(sizeof(%s) == sizeof(int), %q);\n", enum, sym+"'s "+enum)
			params[i] = enum
		}
		for i, p := range params {
			params[i] = strings.ReplaceAll(p, "koloNcclConfig", "ncclConfig_t")
		}
		fmt.Fprintf(&b, "_Static_assert(__builtin_types_compatible_p(%s (*)(%s), __typeof__(&%s)), %q);\n",
			ret, strings.Join(params, ", "), sym, "K."+field+" is "+sym+" as the headers declare it")
	}

	// Constants: the Go side's and the preamble's.
	codes := make([]int, 0, len(resultNames))
	for c := range resultNames {
		codes = append(codes, c)
	}
	sort.Ints(codes)
	for _, c := range codes {
		fmt.Fprintf(&b, "_Static_assert(%s == %d, %q);\n", resultNames[c], c, resultNames[c])
	}
	ncclTypes := map[string]string{"int8": "ncclInt8", "uint8": "ncclUint8", "int32": "ncclInt32", "uint32": "ncclUint32",
		"int64": "ncclInt64", "uint64": "ncclUint64", "float16": "ncclFloat16", "float32": "ncclFloat32",
		"float64": "ncclFloat64", "bfloat16": "ncclBfloat16"}
	for _, dt := range gpu.DataTypes {
		fmt.Fprintf(&b, "_Static_assert(%s == %d, %q);\n", ncclTypes[dt.String()], int(dt), "gpu."+dt.String())
	}
	for _, op := range []struct {
		name string
		v    gpu.RedOp
	}{{"ncclSum", gpu.Sum}, {"ncclProd", gpu.Prod}, {"ncclMax", gpu.Max}, {"ncclMin", gpu.Min}, {"ncclAvg", gpu.Avg}} {
		fmt.Fprintf(&b, "_Static_assert(%s == %d, %q);\n", op.name, int(op.v), op.name)
	}
	if len(gpu.RedOps) != 5 {
		t.Errorf("gpu.RedOps has %d values; the check knows 5", len(gpu.RedOps))
	}
	for _, c := range []struct {
		header string
		v      int64
	}{
		{"NCCL_SPLIT_NOCOLOR", gpu.NoColor}, {"NCCL_UNIQUE_ID_BYTES", gpu.UniqueIDBytes},
		{"NCCL_CONFIG_UNDEF_INT", configUndefInt}, {"cudaErrorNotReady", cudaErrorNotReady},
		{"sizeof(koloNcclConfig)", configSize}, {"NCCL_VERSION(2,17,0)", configVersion},
		{"offsetof(ncclConfig_t, magic)", configOffMagic}, {"offsetof(ncclConfig_t, version)", configOffVersion},
		{"offsetof(ncclConfig_t, blocking)", configOffBlocking}, {"offsetof(ncclConfig_t, cgaClusterSize)", configOffCGACluster},
		{"offsetof(ncclConfig_t, minCTAs)", configOffMinCTAs}, {"offsetof(ncclConfig_t, maxCTAs)", configOffMaxCTAs},
		{"offsetof(ncclConfig_t, netName)", configOffNetName}, {"offsetof(ncclConfig_t, splitShare)", configOffSplitShare},
		{"offsetof(koloNcclConfig, magic)", configOffMagic}, {"offsetof(koloNcclConfig, version)", configOffVersion},
		{"offsetof(koloNcclConfig, blocking)", configOffBlocking}, {"offsetof(koloNcclConfig, cgaClusterSize)", configOffCGACluster},
		{"offsetof(koloNcclConfig, minCTAs)", configOffMinCTAs}, {"offsetof(koloNcclConfig, maxCTAs)", configOffMaxCTAs},
		{"offsetof(koloNcclConfig, netName)", configOffNetName}, {"offsetof(koloNcclConfig, splitShare)", configOffSplitShare},
		{"koloConfigMagic", configMagic}, {"koloConfigVersion", configVersion}, {"koloConfigUndef", configUndefInt},
	} {
		fmt.Fprintf(&b, "_Static_assert((long long)(%s) == %dLL, %q);\n", c.header, c.v, c.header)
	}
	b.WriteString("_Static_assert(sizeof(koloNcclConfig) <= sizeof(ncclConfig_t), \"koloNcclConfig is a prefix\");\n")
	b.WriteString("_Static_assert(NCCL_VERSION_CODE >= koloConfigVersion, \"the headers' NCCL knows the layout\");\n")
	macros := macroLine.FindAllStringSubmatch(pre, -1)
	for _, m := range macros {
		if strings.HasPrefix(m[3], "NCCL_") || !strings.HasPrefix(m[3], "cuda") {
			continue // checked above, or a description
		}
		fmt.Fprintf(&b, "_Static_assert(%s == %s, %q);\n", m[1], m[3], m[1])
	}
	// What NCCL_CONFIG_INITIALIZER puts where kolo_config writes (a run-time check: it is an
	// initializer, not a constant).
	b.WriteString(`
int main(void) {
	ncclConfig_t real = NCCL_CONFIG_INITIALIZER;
	koloNcclConfig mine;
	kolo_config(&mine);
	int bad = 0;
	if (real.magic != mine.magic) { printf("magic %#x, kolo writes %#x\n", real.magic, mine.magic); bad = 1; }
	if (real.cgaClusterSize != mine.cgaClusterSize || real.minCTAs != mine.minCTAs || real.maxCTAs != mine.maxCTAs ||
	    real.splitShare != mine.splitShare || real.netName != mine.netName) {
		printf("NCCL_CONFIG_INITIALIZER's defaults differ from kolo_config's\n");
		bad = 1;
	}
	return bad;
}
`)
	return b.String()
}

func TestDeclarationsMatchTheHeaders(t *testing.T) {
	root := nvidiaWheels(t, "nccl/include/nccl.h", "cuda_runtime/include/cuda_runtime_api.h",
		"cuda_nvcc/include/crt/host_defines.h", "cuda_cccl/include/nv/target")
	cc, err := exec.LookPath("cc")
	if err != nil {
		t.Skip("no C compiler")
	}
	dir := t.TempDir()
	src := filepath.Join(dir, "check.c")
	if err := os.WriteFile(src, []byte(headerCheck(t)), 0o600); err != nil {
		t.Fatal(err)
	}
	exe := filepath.Join(dir, "check")
	args := []string{"-std=gnu11", "-Werror=incompatible-pointer-types", "-Werror=implicit-function-declaration",
		"-I", filepath.Join(root, "nccl/include"), "-I", filepath.Join(root, "cuda_runtime/include"),
		"-I", filepath.Join(root, "cuda_nvcc/include"), "-I", filepath.Join(root, "cuda_cccl/include"),
		"-o", exe, src, "-ldl"}
	if out, err := exec.Command(cc, args...).CombinedOutput(); err != nil {
		t.Fatalf("dl.go's declarations disagree with the headers:\n%s", out)
	}
	if out, err := exec.Command(exe).CombinedOutput(); err != nil {
		t.Fatalf("%v:\n%s", err, out)
	}
}

// The real libraries load and bind on a machine without a GPU; kolo then stages, saying why. It
// runs in a process of its own: a library loaded stays in the process, and the stand-in's
// libnccl.so.2 would find the real libcudart.so.12 by its soname (and the other way round).
func TestRealLibrariesWithoutAGPU(t *testing.T) {
	root := nvidiaWheels(t, "nccl/lib/libnccl.so.2", "cuda_runtime/lib/libcudart.so.12")
	if _, err := exec.LookPath("nvidia-smi"); err == nil {
		t.Skip("a GPU machine: the libraries would find a device")
	}
	if os.Getenv(realLibsChild) != "1" {
		cmd := exec.Command(os.Args[0], "-test.run=^TestRealLibrariesWithoutAGPU$", "-test.v")
		cmd.Env = append(os.Environ(), realLibsChild+"=1")
		out, err := cmd.CombinedOutput()
		if err != nil || !strings.Contains(string(out), "--- PASS: TestRealLibrariesWithoutAGPU") {
			t.Fatalf("%v:\n%s", err, out)
		}
		t.Logf("%s", out)
		return
	}
	b, err := open(Options{NCCLPaths: []string{filepath.Join(root, "nccl/lib/libnccl.so.2")},
		CUDAPaths: []string{filepath.Join(root, "cuda_runtime/lib/libcudart.so.12")}})
	if err != nil {
		t.Fatalf("the real libraries do not load or bind: %v", err)
	}
	if b.Version().Less(gpu.MinNCCL) {
		t.Fatalf("NCCL %s", b.Version())
	}
	if !b.split {
		t.Errorf("NCCL %s has no ncclCommSplit", b.Version())
	}
	_, err = b.PCIBusID(0)
	var ce *CUDAError
	if !errors.As(err, &ce) {
		t.Fatalf("device 0 without a GPU: %v, want a CUDA error", err)
	}
	slog.Info("no device: the staged path", "why", err)
	_, err = b.Device(0)
	if !errors.As(err, &ce) || !strings.Contains(err.Error(), "cudaDeviceGetPCIBusId") {
		t.Fatalf("Device(0) without a GPU: %v", err)
	}
	t.Logf("NCCL %s loaded; device 0: %v", b.Version(), err)
}
