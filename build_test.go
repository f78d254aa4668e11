package kolo_test

import (
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"runtime"
	"sync"
	"testing"
)

// binDir holds the commands the end-to-end tests build; TestMain makes and removes it.
var binDir string

// builds is one build per package path: about twenty tests run kolo and the examples, and a link
// each cost seconds on a small machine. Tests only execute the binaries, never change them.
var builds sync.Map // package path -> *build

type build struct {
	once sync.Once
	bin  string
	err  error
	out  []byte
}

// buildOnce builds the main package pkg (a path relative to the module root) on first use and
// returns its binary.
func buildOnce(t testing.TB, pkg string) string {
	t.Helper()
	v, _ := builds.LoadOrStore(pkg, &build{})
	b := v.(*build)
	b.once.Do(func() {
		gobin, err := exec.LookPath("go")
		if err != nil {
			gobin = filepath.Join(runtime.GOROOT(), "bin", "go")
		}
		dir := binDir
		if dir == "" {
			if dir, b.err = os.MkdirTemp("", "kolo-test-bin-"); b.err != nil {
				return
			}
		}
		b.bin = filepath.Join(dir, path.Base(pkg))
		b.out, b.err = exec.Command(gobin, "build", "-o", b.bin, pkg).CombinedOutput()
	})
	if b.err != nil {
		t.Fatalf("go build %s: %v\n%s", pkg, b.err, b.out)
	}
	return b.bin
}
