package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"syscall"

	"github.com/kolo-dl/kolo/auth"
	"github.com/kolo-dl/kolo/launch"
	"github.com/kolo-dl/kolo/rendezvous"
)

// runCmd implements `kolo run`; it returns the process exit code.
func runCmd(args []string) int {
	opts, err := launch.ParseRunFlags(args, os.Stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "kolo run: %v\n", err)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	code, err := runJob(ctx, opts)
	if err != nil {
		fmt.Fprintf(os.Stderr, "kolo run: %v\n", err)
	}
	return code
}

// runJob plans the job, hosts the rendezvous, starts the ranks and waits for them.
func runJob(ctx context.Context, opts *launch.Options) (int, error) {
	hosts, err := opts.ResolveHosts()
	if err != nil {
		return 2, err
	}
	np := opts.NP
	if np == 0 {
		for _, h := range hosts {
			np += h.Slots
		}
	}
	slots, err := launch.Plan(hosts, np)
	if err != nil {
		return 2, err
	}
	secret, err := auth.NewSecret()
	if err != nil {
		return 1, err
	}
	srv := rendezvous.NewServer([]byte(secret))
	bindHost := launch.RendezvousHost(slots)
	listen := "127.0.0.1:0"
	if bindHost != "127.0.0.1" {
		listen = "0.0.0.0:0"
	}
	addr, err := srv.Listen(listen)
	if err != nil {
		return 1, fmt.Errorf("start rendezvous: %w", err)
	}
	defer srv.Close()
	_, port, _ := net.SplitHostPort(addr.String())
	rvAddr := net.JoinHostPort(bindHost, port)
	if opts.Verbose {
		slog.Info("rendezvous listening", "addr", rvAddr, "ranks", np)
	}
	workers, err := launch.LocalWorkers(slots, opts.Command, rvAddr, launch.NewJobID(), secret, opts.EngineEnv, opts.Env)
	if err != nil {
		return 2, err
	}
	runner := &launch.Runner{
		Starter:    launch.LocalStarter{},
		Stdout:     os.Stdout,
		Stderr:     os.Stderr,
		OutputDir:  opts.OutputDir,
		Timestamps: opts.Timestamps,
		Plain:      opts.PlainOutput,
	}
	results, first := runner.Run(ctx, workers)
	if first != nil {
		fmt.Fprint(os.Stderr, launch.Summary(results, first))
		return first.Exit.ShellCode(), nil
	}
	if ctx.Err() != nil {
		return 130, errors.New("interrupted: stopped every rank")
	}
	return 0, nil
}
