package launch

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"syscall"
	"time"

	"github.com/kolo-dl/kolo/launch/elastic"
	"github.com/kolo-dl/kolo/launch/proc"
)

// discover runs the --host-discovery-script, then again discoverEvery after each run ends, and
// sends every result to out until ctx ends.
func (j *elasticJob) discover(ctx context.Context, out chan<- discovery) {
	pause := time.NewTimer(0)
	defer pause.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-pause.C:
		}
		hosts, err := RunDiscoveryScript(ctx, j.opts.DiscoveryScript, j.set.discoverTimeout, j.opts.SlotsPerHost)
		if ctx.Err() != nil {
			return
		}
		select {
		case out <- discovery{at: time.Now(), hosts: hosts, err: err}:
		case <-ctx.Done():
			return
		}
		pause.Reset(j.set.discoverEvery)
	}
}

// maxDiscoveryOutput bounds what a discovery script may print: a host list, not a log.
const maxDiscoveryOutput = 1 << 20

// RunDiscoveryScript runs script with sh -c (Horovod runs it through a shell too, so it may carry
// arguments) and parses what it prints with elastic.ParseDiscovery; a line without ":slots" gets
// slotsPerHost. The script fails when it exits non-zero, prints more than 1 MiB, or runs longer
// than timeout; then it is killed with everything it started in its process group.
func RunDiscoveryScript(ctx context.Context, script string, timeout time.Duration, slotsPerHost int) ([]elastic.Host, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "/bin/sh", "-c", script)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = time.Second // a child that escaped the group may hold the pipes open
	stdout := &cappedBuffer{max: maxDiscoveryOutput}
	stderr := proc.NewTail(3)
	cmd.Stdout = stdout
	cmd.Stderr = lineSink{stderr}
	err := cmd.Run()
	switch {
	case errors.Is(ctx.Err(), context.DeadlineExceeded):
		return nil, fmt.Errorf("--host-discovery-script %q did not finish within %s", script, timeout)
	case err != nil:
		msg := fmt.Sprintf("--host-discovery-script %q: %v", script, err)
		if tail := stderr.Lines(); len(tail) > 0 {
			msg += ": " + strings.Join(tail, " / ")
		}
		return nil, errors.New(msg)
	case stdout.over:
		return nil, fmt.Errorf("--host-discovery-script %q printed more than %d bytes", script, maxDiscoveryOutput)
	}
	hosts, err := elastic.ParseDiscovery(stdout.String(), slotsPerHost)
	if err != nil {
		return nil, fmt.Errorf("--host-discovery-script %q: %w", script, err)
	}
	return hosts, nil
}

// cappedBuffer keeps the first max bytes written to it and notes whether there were more.
type cappedBuffer struct {
	bytes.Buffer
	max  int
	over bool
}

func (c *cappedBuffer) Write(p []byte) (int, error) {
	if room := c.max - c.Len(); len(p) > room {
		c.over = true
		c.Buffer.Write(p[:max(room, 0)])
		return len(p), nil
	}
	return c.Buffer.Write(p)
}

// lineSink feeds a tailBuffer the lines written to it (a script's stderr, for its error message).
type lineSink struct{ t *proc.Tail }

func (l lineSink) Write(p []byte) (int, error) {
	for _, line := range strings.Split(strings.TrimRight(string(p), "\n"), "\n") {
		if line = strings.TrimSpace(line); line != "" {
			l.t.Add(line)
		}
	}
	return len(p), nil
}
