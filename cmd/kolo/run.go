package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/kolo-dl/kolo/launch"
	"github.com/kolo-dl/kolo/launch/flags"
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
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	code, err := runJob(ctx, opts)
	if err != nil {
		fmt.Fprintf(os.Stderr, "kolo run: %v\n", err)
	}
	return code
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
