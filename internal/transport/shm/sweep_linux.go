//go:build linux

package shm

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
)

// A segment has a name in its directory only from the moment its header is complete (create
// links it there) until every local rank has attached (rank 0 then unlinks it): a few
// milliseconds of start-up. A job that dies in that window leaves the file behind, holding its
// memory. Whoever comes next removes it: a local rank that sees rank 0 gone while it waits for the
// others, the launcher once its local ranks have ended, and rank 0 of any later job on the host
// before it creates its own. The header names the creator, so a segment is stale exactly when its
// creator is gone, and a job still starting is never touched.

// SegmentPrefix begins the name of every segment kolo creates.
const SegmentPrefix = "kolo-"

// Sweep removes the stale segments in dir (default /dev/shm): files named SegmentPrefix... that
// this user owns, whose header says they are kolo segments, and whose creator ran in this pid
// namespace and is gone. It returns the paths removed, and the first error that kept it from
// looking at a file (a file it could not judge is left alone).
func Sweep(dir string) ([]string, error) {
	if dir == "" {
		dir = defaultDir
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("shm: sweep %s: %w", dir, err)
	}
	var removed []string
	var first error
	for _, e := range entries {
		if !strings.HasPrefix(e.Name(), SegmentPrefix) || !e.Type().IsRegular() {
			continue
		}
		path := filepath.Join(dir, e.Name())
		stale, err := isStale(path)
		if err != nil {
			if first == nil {
				first = err
			}
			continue
		}
		if stale {
			removed = append(removed, path)
		}
	}
	return removed, first
}

// isStale removes path if it is a stale segment (see Sweep), and says whether it did.
func isStale(path string) (bool, error) {
	fd, err := syscall.Open(path, syscall.O_RDONLY|syscall.O_CLOEXEC|syscall.O_NOFOLLOW, 0)
	if errors.Is(err, syscall.ENOENT) {
		return false, nil // unlinked meanwhile: its job started
	}
	if err != nil {
		return false, fmt.Errorf("shm: sweep: open %s: %w", path, err)
	}
	defer syscall.Close(fd)
	var st syscall.Stat_t
	if err := syscall.Fstat(fd, &st); err != nil {
		return false, fmt.Errorf("shm: sweep: stat %s: %w", path, err)
	}
	if int(st.Uid) != os.Geteuid() {
		return false, nil
	}
	hdr := make([]byte, offCreatorPidNS+8)
	if n, err := syscall.Pread(fd, hdr, 0); err != nil || n < len(hdr) {
		return false, nil // not a segment of ours: too short, or unreadable
	}
	le := binary.LittleEndian
	if le.Uint64(hdr[offMagic:]) != segmentMagic || le.Uint32(hdr[offReady:]) != headerReadyMarker ||
		!samePidNS(le.Uint64(hdr[offCreatorPidNS:])) {
		return false, nil
	}
	if processGone(int(le.Uint64(hdr[offCreatorPid:])), le.Uint64(hdr[offCreatorStart:])) == nil {
		return false, nil
	}
	return unlinkIfSame(path, &st) == nil, nil
}

// unlinkIfSame removes path if it still names the file st describes: a later job may have created
// a segment of the same name since.
func unlinkIfSame(path string, st *syscall.Stat_t) error {
	var now syscall.Stat_t
	if err := syscall.Stat(path, &now); err != nil {
		return err
	}
	if now.Ino != st.Ino || now.Dev != st.Dev {
		return errors.New("replaced")
	}
	return syscall.Unlink(path)
}
