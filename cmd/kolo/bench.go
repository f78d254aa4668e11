package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/kolo-dl/kolo"
	"github.com/kolo-dl/kolo/internal/bench"
	"github.com/kolo-dl/kolo/internal/dtype"
	"github.com/kolo-dl/kolo/internal/jobenv"
	"github.com/kolo-dl/kolo/internal/launch/flags"
)

// benchCmd implements `kolo bench OP`. With -np N it launches N local ranks of itself (through the
// same code path as kolo run); inside a job (kolo run or mpirun) each process is one rank.
func benchCmd(args []string) int {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" {
		fmt.Fprintf(os.Stderr, "usage: kolo bench OP [flags]; OP is one of %v\n", bench.Ops)
		if len(args) == 0 {
			return 2
		}
		args = []string{"allreduce", "-h"}
	}
	op := args[0]
	fs := flag.NewFlagSet("kolo bench "+op, flag.ContinueOnError)
	np := fs.Int("np", 0, "start this many local ranks (omit inside kolo run / mpirun)")
	sizes := fs.String("sizes", "4,4KiB,256KiB,4MiB,64MiB", "message sizes per rank")
	dt := fs.String("dtype", "float32", "element type")
	iters := fs.Int("iters", 20, "timed iterations per size")
	warmup := fs.Int("warmup", 3, "untimed iterations per size")
	check := fs.Bool("check", false, "verify results")
	jsonPath := fs.String("json", "", "also write results as JSON to FILE")
	over := fs.Bool("oversubscribe", false, "with -np: start more ranks than this machine has CPUs (also KOLO_OVERSUBSCRIBE=1)")
	if err := fs.Parse(args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	known := false
	for _, o := range bench.Ops {
		known = known || o == op
	}
	if !known {
		fmt.Fprintf(os.Stderr, "kolo bench: unknown op %q (want one of %v)\n", op, bench.Ops)
		return 2
	}
	d, err := dtype.Parse(*dt)
	if err != nil {
		fmt.Fprintf(os.Stderr, "kolo bench: %v\n", err)
		return 2
	}
	sz, err := bench.ParseSizes(*sizes)
	if err != nil {
		fmt.Fprintf(os.Stderr, "kolo bench: %v\n", err)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	if *np > 0 && !jobenv.Present(jobenv.FromEnviron(os.Environ())) {
		// Relaunch this binary as N ranks, passing the same arguments minus -np.
		self, err := os.Executable()
		if err != nil {
			fmt.Fprintf(os.Stderr, "kolo bench: %v\n", err)
			return 1
		}
		if *over, err = flags.Oversubscribing(*over); err != nil {
			fmt.Fprintf(os.Stderr, "kolo bench: %v\n", err)
			return 2
		}
		argv := append([]string{self, "bench"}, args...)
		code, err := runJob(ctx, &flags.Options{NP: *np, Command: argv, EngineEnv: map[string]string{}, PlainOutput: true, Oversubscribe: *over})
		if err != nil {
			fmt.Fprintf(os.Stderr, "kolo bench: %v\n", err)
		}
		return code
	}

	initStart := time.Now()
	if err := kolo.Init(); err != nil {
		fmt.Fprintf(os.Stderr, "kolo bench: %v\n", err)
		return 1
	}
	startup, err := bench.MeasureStartup(ctx, time.Since(initStart))
	if err != nil {
		fmt.Fprintf(os.Stderr, "kolo bench: rank %d: %v\n", kolo.Rank(), err)
		return 1
	}
	cfg := bench.Config{Op: op, Sizes: sz, DType: d, Iters: *iters, Warmup: *warmup, Check: *check}
	results, err := bench.Run(ctx, cfg)
	if err == nil {
		err = bench.MeasureSocketsEnd(ctx, startup)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "kolo bench: rank %d: %v\n", kolo.Rank(), err)
		return 1
	}
	if kolo.Rank() == 0 {
		bench.Print(os.Stdout, cfg, kolo.Size(), results)
		if *jsonPath != "" {
			if err := bench.WriteJSON(*jsonPath, cfg, kolo.Size(), results, startup); err != nil {
				fmt.Fprintf(os.Stderr, "kolo bench: %v\n", err)
				return 1
			}
		}
	}
	if err := kolo.Shutdown(); err != nil {
		fmt.Fprintf(os.Stderr, "kolo bench: rank %d: %v\n", kolo.Rank(), err)
		return 1
	}
	return 0
}
