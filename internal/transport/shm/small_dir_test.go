//go:build linux

package shm

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// A container's /dev/shm is a 64 MiB tmpfs unless the user raises it. A segment that does not fit
// must fail at Open with a message that names the size needed (at start, and what the rings may add
// later) and the fix (--ipc=host or
// --shm-size), not with a SIGBUS on some later page fault.
func TestOpenTooSmallDirSaysHowToFix(t *testing.T) {
	dir := smallTmpfs(t, "1m")
	cfg := Config{Name: "kolo-small-shm", Size: 2, Dir: dir} // default sizes: 16 MiB, rings 2.2 MiB more
	need := "needs " + sizeText(ReservedBytes(cfg)) + " at start"
	rings := "up to " + sizeText(SegmentBytes(cfg)-ReservedBytes(cfg)) + " more"
	_, err := Open(context.Background(), cfg)
	t.Log(err)
	if err == nil {
		t.Fatal("Open succeeded on a 1 MiB tmpfs")
	}
	for _, want := range []string{need, rings, dir, "--ipc=host", "--shm-size"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error does not say %q: %v", want, err)
		}
	}
	if !errors.Is(err, syscall.ENOSPC) {
		t.Errorf("error does not wrap ENOSPC: %v", err)
	}
	if _, serr := os.Stat(filepath.Join(dir, cfg.Name)); !errors.Is(serr, os.ErrNotExist) {
		t.Error("failed Open left the segment file behind")
	}
}

// smallTmpfs mounts a tmpfs of the given size on a fresh directory (root only).
func smallTmpfs(t *testing.T, size string) string {
	t.Helper()
	dir := t.TempDir()
	if err := syscall.Mount("tmpfs", dir, "tmpfs", 0, "size="+size); err != nil {
		if os.Getenv("KOLO_REQUIRE_TESTBEDS") == "1" {
			t.Fatalf("mount a %s tmpfs on %s (needs root): %v", size, dir, err)
		}
		t.Skipf("mount a %s tmpfs on %s (needs root): %v", size, dir, err)
	}
	t.Cleanup(func() {
		if err := syscall.Unmount(dir, 0); err != nil {
			t.Errorf("unmount %s: %v", dir, err)
		}
	})
	return dir
}
