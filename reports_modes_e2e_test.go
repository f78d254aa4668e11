package kolo_test

import (
	"fmt"
	"net"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// The ranks' reports and failure records reach every kind of launcher: an elastic job and a no-ssh
// job show the live view, serve the metrics, print the end table and name the rank behind a
// failure from its record, as a static job does (TestLiveViewNamesTheSlowRank,
// TestFlightFileOnFailure).

var resetsSeries = regexp.MustCompile(`(?m)^kolo_elastic_resets_total (\S+)$`)

// An elastic job of 3 workers on two host names whose rank 2 gives up (kolo.Abort) at step 20 of
// the first round: the launcher quotes its failure record, the view and the metrics count the
// re-form, and the job ends on 2 workers with the end table of that world.
func TestReportsInAnElasticJob(t *testing.T) {
	if testing.Short() {
		t.Skip("starts kolo run")
	}
	kolo, softmax := buildKolo(t), buildSoftmax(t)
	l := startLauncher(t, launchEnv(), kolo, "run", "-np", "3", "--min-np", "2", "--max-np", "3",
		"-H", "localhost:2,127.0.0.1:1", "--metrics-addr", "127.0.0.1:0", "--status", "on",
		softmax, "-elastic", "-steps", "150", "-commit", "10", "-pace", "20ms",
		"-exit-rank", "2", "-exit-step", "20", "-abort")
	url := l.metricsURL(t)
	resets := 0.0
	for running := true; running; {
		select {
		case <-l.done:
			running = false
		case <-time.After(200 * time.Millisecond):
		}
		if body, err := scrape(url); err == nil {
			if m := resetsSeries.FindStringSubmatch(body); m != nil {
				resets, _ = strconv.ParseFloat(m[1], 64)
			}
		}
	}
	if code := l.wait(t, time.Minute); code != 0 {
		t.Fatalf("kolo run exited %d\n%s", code, l.output())
	}
	stderr := l.stderr.String()
	if !regexp.MustCompile(`127\.0\.0\.1\[0\] \(started for round 1 as rank 2\) exited with code 3: rank 2 of round 1 reported exception: gave up at step 20`).MatchString(stderr) {
		t.Errorf("the launcher does not quote the failed worker's record:\n%s", stderr)
	}
	if resets < 1 {
		t.Errorf("kolo_elastic_resets_total was %v at the last scrape, want at least 1", resets)
	}
	if !strings.Contains(l.stdout.String(), "elastic: 1 reset") {
		t.Errorf("the status lines never counted the reset:\n%s", l.stdout.String())
	}
	if rows := endRowRe.FindAllStringSubmatch(stderr, -1); len(rows) != 2 {
		t.Errorf("end table: want the 2 ranks of the last world, got %d rows:\n%s", len(rows), stderr)
	}
}

// A no-ssh job of 2 nodes on this machine: the node serving the rendezvous draws the status lines,
// and each node prints the end table of both ranks; when rank 1 gives up (kolo.Abort), each names
// it from its record, whichever rank exited first.
func TestReportsInANoSSHJob(t *testing.T) {
	if testing.Short() {
		t.Skip("starts kolo run")
	}
	kolo, softmax := buildKolo(t), buildSoftmax(t)
	env := launchEnv("KOLO_SECRET=0123456789abcdef0123456789abcdef")
	nodes := func(args ...string) []*launcher {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		port := ln.Addr().(*net.TCPAddr).Port
		ln.Close()
		ls := make([]*launcher, 2)
		for i := range ls {
			argv := append([]string{kolo, "run", "--rendezvous", fmt.Sprintf("127.0.0.1:%d", port), "--nnodes", "2",
				"--node-rank", strconv.Itoa(i), "--nproc-per-node", "1", "--start-timeout", "20s", "--status", "on",
				softmax, "-pace", "10ms"}, args...)
			ls[i] = startLauncher(t, env, argv...)
		}
		return ls
	}
	t.Run("status lines and end table", func(t *testing.T) {
		drawn := 0
		for i, l := range nodes("-steps", "100") {
			if code := l.wait(t, time.Minute); code != 0 {
				t.Fatalf("node %d exited %d\n%s", i, code, l.output())
			}
			if rows := endRowRe.FindAllStringSubmatch(l.stderr.String(), -1); len(rows) != 2 {
				t.Errorf("node %d: end table: want 2 rank rows, got %d:\n%s", i, len(rows), l.stderr.String())
			}
			if strings.Contains(l.stdout.String(), "2 ranks on ") {
				drawn++
			}
		}
		if drawn != 1 {
			t.Errorf("%d nodes drew status lines counting both ranks, want 1: the node serving the rendezvous", drawn)
		}
	})
	t.Run("failure record", func(t *testing.T) {
		for i, l := range nodes("-steps", "200", "-exit-rank", "1", "-exit-step", "20", "-abort") {
			if code := l.wait(t, time.Minute); code != 3 {
				t.Errorf("node %d exited %d, want rank 1's 3\n%s", i, code, l.output())
			}
			stderr := l.stderr.String()
			for _, want := range []string{"exited with code 3 (the first rank to fail).\nRank 1 reported: exception: gave up at step 20",
				"(peer failed, blames rank 1)"} {
				if !strings.Contains(stderr, want) {
					t.Errorf("node %d: the summary lacks %q:\n%s", i, want, stderr)
				}
			}
		}
	})
}
