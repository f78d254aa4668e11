package launch

// The launcher's side of the ranks' report channel (package observe), for every kind of job: it
// collects the ranks' reports from the job's rendezvous a few times a second, draws status lines
// under the ranks' output on a terminal (or with --status on: a pipe's output stays unchanged),
// serves --metrics-addr, reads the failure records and, at the end, prints the end table or what
// each rank was in, with the flight recorders in a file. An elastic job moves it to each new world.

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/kolo-dl/kolo/internal/launch/flags"
	"github.com/kolo-dl/kolo/internal/observe/console"
	"github.com/kolo-dl/kolo/internal/observe/flight"
	"github.com/kolo-dl/kolo/internal/observe/metrics"
	"github.com/kolo-dl/kolo/internal/observe/relay"
	"github.com/kolo-dl/kolo/internal/observe/report"
	"github.com/kolo-dl/kolo/internal/observe/view"
)

// collectEvery is how often the launcher reads the ranks' reports and redraws the status lines.
const collectEvery = 250 * time.Millisecond

// stallLines bounds the lines of each kind the failure text lists.
const stallLines = 8

// live is one job's view, from start to end.
type live struct {
	store relay.Store
	job   string // the launcher's job id: failure records are under it

	// mu holds world and size, which change when an elastic job re-forms, for the whole of a
	// collect: a report of the old world must not be folded into the new one.
	mu         sync.Mutex
	world      string // whose reports are collected: the job id, or an elastic round's
	size       int
	shared     *view.Shared
	con        *console.Console // nil: no status lines
	silent     time.Duration    // a rank not heard from for this long is silent
	flightHost string           // named where the file is written: the end is printed on other nodes too
	stderr     io.Writer        // the launcher's own (not the console's writer): for the end texts

	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// startLive starts the view of job (its id) of size ranks whose reports arrive in store (size 0:
// an elastic job, whose worlds setWorld gives), and returns the writers the ranks' stdout and
// stderr must go through. Only the launcher that hosts the rendezvous watches a job: a no-ssh node
// that joined one does not (N nodes reading every report over the network would load it N
// times). It fails only when --metrics-addr cannot be served.
func startLive(ctx context.Context, opts *flags.Options, store relay.Store, job string, size int,
	stdout, stderr io.Writer) (l *live, outW, errW io.Writer, err error) {
	l = &live{
		store: store, job: job, world: job, size: size,
		shared: view.NewShared(view.New(size)),
		silent: max(5*time.Second, 8*report.Interval(size)),
		stderr: stderr,
	}
	ctx, l.cancel = context.WithCancel(ctx)
	if t := statusTerminal(opts.Status, stdout); t != nil {
		l.con = console.New(t)
		outW, errW = l.con.Writer(stdout), l.con.Writer(stderr)
	} else {
		outW, errW = stdout, stderr
	}
	if opts.MetricsAddr != "" {
		served := make(chan error, 1)
		l.wg.Go(func() {
			err := metrics.Serve(ctx, opts.MetricsAddr, metrics.New(l.shared, l.silent, time.Now), func(a net.Addr) {
				fmt.Fprintf(stderr, "kolo run: metrics at http://%s/metrics\n", a)
				served <- nil
			})
			served <- err
		})
		if err := <-served; err != nil {
			l.cancel()
			l.wg.Wait()
			return nil, nil, nil, fmt.Errorf("--metrics-addr: %w", err)
		}
	}
	l.wg.Go(func() { l.run(ctx) })
	return l, outW, errW, nil
}

// statusTerminal is where the status lines are drawn, or nil for none: stdout when it is a
// terminal (auto, on), or any stdout with on, drawn as on a terminal 100 columns wide.
func statusTerminal(mode string, stdout io.Writer) console.Terminal {
	if mode != flags.StatusAuto && mode != flags.StatusOn {
		return nil // off, or Options not parsed from flags (kolo bench prints a table of its own)
	}
	if f, ok := stdout.(*os.File); ok {
		if _, ok := (console.File{File: f}).Width(); ok {
			return console.File{File: f}
		}
	}
	if mode == flags.StatusOn {
		return forcedTerminal{stdout}
	}
	return nil
}

// forcedTerminal draws the status lines on a writer that is no terminal (--status on).
type forcedTerminal struct{ io.Writer }

func (forcedTerminal) Width() (int, bool) { return 100, true }

func (l *live) run(ctx context.Context) {
	t := time.NewTicker(collectEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			l.collect(ctx, now)
		}
	}
}

// setWorld moves the view to world, of size ranks: an elastic job's new round. The first is the
// job's first world; each later one is a re-form, which the view counts.
func (l *live) setWorld(world string, size int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	first := l.world == l.job && l.size == 0
	l.world, l.size = world, size
	l.shared.Do(func(s *view.State) {
		if first {
			s.Begin(size)
		} else {
			s.Reset(size)
		}
	})
}

// collect folds the ranks' latest reports and redraws the status lines.
func (l *live) collect(ctx context.Context, now time.Time) {
	l.mu.Lock()
	err := relay.Collect(ctx, l.store, l.world, l.size, now, l.shared)
	l.mu.Unlock()
	if err != nil {
		slog.Debug("kolo run: rank reports", "err", err)
	}
	if l.con != nil {
		var lines []string
		l.shared.Do(func(s *view.State) { lines = s.Status(now, l.silent) })
		l.con.SetStatus(lines)
	}
}

// stop stops the view once every rank has exited: it folds the ranks' last reports, sent as they
// left, and erases the status lines.
func (l *live) stop() {
	l.cancel()
	l.wg.Wait()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	l.collect(ctx, time.Now())
	if l.con != nil {
		l.con.Close()
	}
}

// end writes to stderr the end table of a job that ran a step or, when failure (why the job failed)
// is not empty and some rank reported, what each rank was in, with every rank's flight recorder
// in dir/kolo-flight-<job id>.json.
func (l *live) end(failure, dir string) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	now := time.Now()
	var flights map[int]*flight.Snapshot
	if failure != "" {
		var err error
		// Ranks whose engine failed sent their whole recorder as they left; the others' report
		// tails stand in for theirs.
		l.mu.Lock()
		world, size := l.world, l.size
		l.mu.Unlock()
		if flights, err = relay.Flights(ctx, l.store, world, size); err != nil {
			slog.Debug("kolo run: flight recorders", "err", err)
		}
	}
	l.shared.Do(func(s *view.State) {
		if failure == "" {
			if s.Steps() > 0 {
				fmt.Fprint(l.stderr, s.EndTable())
				if line := slowestLine(s); line != "" {
					fmt.Fprintln(l.stderr, line)
				}
			}
			return
		}
		if !slices.ContainsFunc(s.Reports(), func(r *report.Report) bool { return r != nil }) {
			return // no rank reported (not a kolo program, or it failed before its first report)
		}
		if text := s.StallText(now, 0, stallLines); text != "" {
			fmt.Fprint(l.stderr, text)
		}
		name := filepath.Join(dir, "kolo-flight-"+l.job+".json")
		if err := writeFlightFile(name, s.FlightFile(now, failure, flights)); err != nil {
			fmt.Fprintf(l.stderr, "kolo run: flight recorder not written: %v\n", err)
			return
		}
		if l.flightHost != "" {
			name += " on " + l.flightHost
		}
		fmt.Fprintf(l.stderr, "kolo run: every rank's last ops (flight recorder) written to %s\n", name)
	})
}

// failures reads the failure records of the size ranks of a static job, by rank (within a second:
// the store may be going away with the job).
func (l *live) failures(size int) map[int]report.Failure {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	recs, err := relay.Failures(ctx, l.store, l.job, size)
	if err != nil {
		slog.Debug("kolo run: failure records", "err", err)
	}
	return recs
}

// slowestLine names the rank rank 0 last named as the one the others wait for, if any.
func slowestLine(s *view.State) string {
	st := s.Straggle()
	if st == nil || st.Slowest < 0 || st.Slowest >= s.Size() {
		return ""
	}
	late, _ := s.Lateness(st.Slowest)
	host := "an unknown host"
	if r, _ := s.Report(st.Slowest); r != nil {
		host = r.Host
	}
	return fmt.Sprintf("slowest: rank %d on %s, %v after the median of the others", st.Slowest, host, late.Round(10*time.Microsecond))
}

func writeFlightFile(name string, f view.FlightFile) error {
	if err := os.MkdirAll(filepath.Dir(name), 0o755); err != nil {
		return err
	}
	out, err := os.Create(name)
	if err != nil {
		return err
	}
	if err := f.Write(out); err != nil {
		out.Close()
		return fmt.Errorf("write %s: %w", name, err)
	}
	return out.Close()
}
