package launch

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/kolo-dl/kolo/internal/launch/elastic"
	"github.com/kolo-dl/kolo/internal/launch/proc"
)

// discover runs the --host-discovery-script, then again discoverEvery after each run ends, and
// sends every result to out until ctx ends.
func (j *elasticJob) discover(ctx context.Context, out chan<- discovery) {
	for pause := time.Duration(0); ; pause = j.set.discoverEvery {
		select {
		case <-ctx.Done():
			return
		case <-time.After(pause):
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
	}
}

// maxDiscoveryOutput bounds what a discovery script may print: a host list, not a log.
const maxDiscoveryOutput = 1 << 20

// RunDiscoveryScript runs script with sh -c (Horovod runs it through a shell too, so it may carry
// arguments) and parses what it prints with elastic.ParseDiscovery; a line without ":slots" gets
// slotsPerHost. The script fails when it exits non-zero, prints more than 1 MiB, or runs longer
// than timeout; then it is killed with everything it started in its process group.
func RunDiscoveryScript(ctx context.Context, script string, timeout time.Duration, slotsPerHost int) ([]elastic.Host, error) {
	stdout := &cappedBuffer{max: maxDiscoveryOutput}
	// The supervisor of the ranks runs it too: its own process group, killed with it, and a
	// bounded wait for a child that escaped the group and holds the pipes open.
	sup := &proc.Supervisor{Starter: proc.LocalStarter{}, Stdout: proc.NewLineWriter(stdout, false),
		Stderr: proc.NewLineWriter(nil, false), Plain: true, StreamWait: time.Second}
	exited := make(chan proc.Exit, 1)
	c, err := sup.Start(ctx, proc.Worker{Argv: []string{"/bin/sh", "-c", script}}, "discovery", "", func(e proc.Exit) { exited <- e })
	if err != nil {
		return nil, fmt.Errorf("--host-discovery-script %q: %w", script, err)
	}
	tctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var e proc.Exit
	timedOut := false
	select {
	case e = <-exited:
	case <-tctx.Done():
		timedOut = ctx.Err() == nil
		c.Kill()
		e = <-exited
	}
	sup.Close()
	switch {
	case timedOut:
		return nil, fmt.Errorf("--host-discovery-script %q did not finish within %s", script, timeout)
	case e.Failed():
		msg := fmt.Sprintf("--host-discovery-script %q: %v", script, e)
		var tail []string
		for _, l := range c.Tail(0) {
			if l = strings.TrimSpace(l); l != "" {
				tail = append(tail, l)
			}
		}
		if len(tail) > 3 {
			tail = tail[len(tail)-3:]
		}
		if len(tail) > 0 {
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
