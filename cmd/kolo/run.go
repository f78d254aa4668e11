package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/kolo-dl/kolo/internal/launch"
	"github.com/kolo-dl/kolo/internal/launch/flags"
	"github.com/kolo-dl/kolo/internal/transport/shm"
)

// runCmd implements `kolo run`; it returns the process exit code.
func runCmd(args []string) int {
	opts, err := flags.Parse(args, os.Stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "kolo run: %v\n", err)
		return 2
	}
	if code, done := beforeLaunch(opts, os.Stdout); done { // -v, -cb (checkbuild.go)
		return code
	}
	if err := checkSettings(opts); err != nil {
		fmt.Fprintf(os.Stderr, "kolo run: %v\n", err)
		return 2
	}
	if exe, err := os.Executable(); err == nil {
		opts.AfterOrphans = []string{exe, "shm-sweep"}
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	code, err := runJob(ctx, opts)
	if err != nil {
		fmt.Fprintf(os.Stderr, "kolo run: %v\n", err)
	}
	// Every local rank has ended, however: a rank killed while its host's ranks attached their
	// shared memory may have left the segment behind, and nobody else on this host will come
	// after it soon.
	sweepShm()
	return code
}

// sweepShm removes the shared-memory segments whose creator is gone (internal/transport/shm.Sweep).
func sweepShm() {
	if removed, err := shm.Sweep(""); len(removed) > 0 || err != nil {
		slog.Debug("kolo run: shared memory that ranks left behind", "removed", removed, "err", err)
	}
}

// shmSweepCmd is kolo shm-sweep [DIR]: what the orphan guard runs after it killed the ranks of a
// launcher that died, and what a user may run by hand. It removes only segments whose creator is
// gone.
func shmSweepCmd(args []string) int {
	dir := ""
	if len(args) > 0 {
		dir = args[0]
	}
	removed, err := shm.Sweep(dir)
	for _, p := range removed {
		fmt.Println("removed", p)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "kolo shm-sweep:", err)
		return 1
	}
	return 0
}

// runJob picks the launch mode: with --rendezvous this node is one of several that each run kolo
// run (no ssh), elastic or not; otherwise elastic mode (--min-np, --max-np,
// --host-discovery-script), where workers come and go, or a job whose every rank this launcher
// starts, locally or over ssh.
func runJob(ctx context.Context, opts *flags.Options) (int, error) {
	switch {
	case opts.Rendezvous != "":
		return launch.RunNode(ctx, opts, os.Stdout, os.Stderr)
	case opts.Elastic():
		return launch.RunElastic(ctx, opts, os.Stdout, os.Stderr)
	}
	return launch.RunHosts(ctx, opts, os.Stdout, os.Stderr)
}
