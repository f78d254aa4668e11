// Command kolo launches and measures distributed training jobs: `kolo run` starts the ranks of a job
// (horovodrun's flags), `kolo bench` measures the collectives, `kolo secret` makes a job secret for
// jobs whose nodes share one (--secret-file, KOLO_SECRET), `kolo version` prints the version.
package main

import (
	"fmt"
	"os"

	"github.com/kolo-dl/kolo"
	"github.com/kolo-dl/kolo/internal/auth"
)

const usage = `kolo: distributed data-parallel training

Usage:
  kolo run -np N [-H host:slots,...] [flags] COMMAND [ARGS...]   start a job (horovodrun's flags)
  kolo bench OP [-np N] [--sizes 4,4KiB,4MiB] [--dtype float32] [--iters K] [--check] [--json FILE]
  kolo secret                                                    print a new job secret (256 random bits, hex)
  kolo shm-sweep [DIR]                                           remove shared memory that dead jobs left in DIR (/dev/shm)
  kolo version

Run "kolo run -h" or "kolo bench -h" for their flags.
`

func main() {
	if len(os.Args) < 2 {
		fmt.Fprint(os.Stderr, usage)
		os.Exit(2)
	}
	switch os.Args[1] {
	case "run":
		os.Exit(runCmd(os.Args[2:]))
	case "bench":
		os.Exit(benchCmd(os.Args[2:]))
	case "shm-sweep":
		os.Exit(shmSweepCmd(os.Args[2:]))
	case "secret":
		s, err := auth.NewSecret()
		if err != nil {
			fmt.Fprintln(os.Stderr, "kolo secret:", err)
			os.Exit(1)
		}
		fmt.Println(s)
	case "version", "-v", "--version":
		fmt.Println("kolo", kolo.Version)
	case "-h", "--help", "help":
		fmt.Print(usage)
	default:
		fmt.Fprintf(os.Stderr, "kolo: unknown command %q\n\n%s", os.Args[1], usage)
		os.Exit(2)
	}
}
