package proc

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"syscall"
)

// OrphanGuard kills the process groups of local ranks if the launcher dies without stopping them
// (SIGKILL, OOM killer). A rank's own process gets SIGKILL from the kernel when the launcher dies
// (Pdeathsig), but whatever the rank started would live on; the guard is a small sh process,
// outside the launcher's process group, that is told each rank's group and, when its input ends
// without a goodbye, kills every group it still knows.
type OrphanGuard struct {
	mu     sync.Mutex
	w      io.WriteCloser
	cmd    *exec.Cmd
	closed bool
}

// guardScript keeps the set of live groups in $g; "+ N" adds, "- N" removes, "rm PATH" names a
// directory to remove, "exit" leaves without killing, and end of input kills every group left,
// then, once no process of those groups runs (zombies aside; at most 5 s: a killed rank can take a
// while to exit, and the sweep leaves a segment whose creator still runs), removes the directory
// and runs its arguments (kolo run's sweep of the shared memory a dead launcher's ranks left).
const guardScript = `g= d=
live() {
  for f in /proc/[0-9]*/stat; do
    IFS= read -r l 2>/dev/null <"$f" || continue
    l=${l##*) }
    case $l in Z*|X*) continue ;; esac
    l=${l#* }; l=${l#* }
    [ "${l%% *}" = "$1" ] && return 0
  done
  return 1
}
while IFS= read -r l; do
  case $l in
  "+ "*) g="$g ${l#+ }" ;;
  "- "*) n=; for p in $g; do [ "$p" = "${l#- }" ] || n="$n $p"; done; g=$n ;;
  "rm "*) d=${l#rm } ;;
  exit) exit 0 ;;
  esac
done
for p in $g; do kill -KILL -"$p" 2>/dev/null; done
i=0
while [ $i -lt 50 ]; do
  a=; for p in $g; do live "$p" && a=1 && break; done
  [ -z "$a" ] && break
  sleep 0.1; i=$((i+1))
done
[ -n "$d" ] && rm -rf -- "$d"
[ $# -gt 0 ] && exec "$@"
exit 0`

// StartOrphanGuard starts the guard process; then, if given, is the command it runs after killing
// the groups of a launcher that died.
func StartOrphanGuard(then ...string) (*OrphanGuard, error) {
	r, w, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command("/bin/sh", append([]string{"-c", guardScript, "kolo-orphan-guard"}, then...)...)
	cmd.Stdin = r
	// Its own group: the terminal's Ctrl-C must not take it down before the launcher's own cleanup.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		r.Close()
		w.Close()
		return nil, fmt.Errorf("start the orphan guard: %w", err)
	}
	r.Close()
	return &OrphanGuard{w: w, cmd: cmd}, nil
}

func (g *OrphanGuard) send(line string) {
	if g == nil {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.closed {
		io.WriteString(g.w, line+"\n")
	}
}

// Add registers the process group pgid.
func (g *OrphanGuard) Add(pgid int) { g.send("+ " + strconv.Itoa(pgid)) }

// Remove forgets pgid (its leader has been reaped and the group killed), so that a later group
// reusing the number is never touched.
func (g *OrphanGuard) Remove(pgid int) { g.send("- " + strconv.Itoa(pgid)) }

// RemoveAfterOrphans has the guard remove dir (a directory the launcher made for its ranks: one
// line, so no newline in it) once it has killed the ranks of a launcher that died.
func (g *OrphanGuard) RemoveAfterOrphans(dir string) { g.send("rm " + dir) }

// Close lets the guard exit without killing anything and waits for it.
func (g *OrphanGuard) Close() error {
	if g == nil {
		return nil
	}
	g.mu.Lock()
	if g.closed {
		g.mu.Unlock()
		return nil
	}
	io.WriteString(g.w, "exit\n")
	g.closed = true
	g.w.Close()
	g.mu.Unlock()
	return g.cmd.Wait()
}
