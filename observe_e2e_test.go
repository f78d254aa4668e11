package kolo_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

var (
	metricsAddrLine = regexp.MustCompile(`kolo run: metrics at (http://\S+/metrics)`)
	latenessSeries  = regexp.MustCompile(`(?m)^kolo_rank_lateness_seconds\{host="[^"]*",rank="(\d+)"\} (\S+)$`)
	statusSlowestRe = regexp.MustCompile(`slowest: rank (\d+) on \S+ arrives last in \d+% of \w+, ([\d.]+) ms after`)
	slowestLineRe   = regexp.MustCompile(`(?m)^slowest: rank (\d+) on \S+, (\S+) after`)
	endRowRe        = regexp.MustCompile(`(?m)^\|\s+(\d+) \| [^|]+\|\s+(\d+) \|`)
	flightFileLine  = regexp.MustCompile(`flight recorder\) written to (\S+\.json)`)
)

// TestLiveViewNamesTheSlowRank runs 4 ranks of the Go example, one of them slowed in every step or
// none, with --metrics-addr and --status on: while the job runs, /metrics shows the slowed rank as
// the latest to arrive and the status lines name it, and the end of the job on stderr names it. With none slowed, no rank is late by half the
// slowdown, in /metrics or at the end: 4 ranks on a loaded 2-CPU machine do make one late by
// 10-15 ms now and then, which rank 0 rightly names, so "none" is "none like the slowed rank".
func TestLiveViewNamesTheSlowRank(t *testing.T) {
	if testing.Short() {
		t.Skip("starts kolo run")
	}
	kolo, softmax := buildKolo(t), buildSoftmax(t)
	const slow = 60 * time.Millisecond
	for _, tc := range []struct {
		name     string
		slowRank int // -1: none
	}{
		{"rank 2 slowed", 2},
		{"none slowed", -1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// -pace gives every rank the same step time, so that "none slowed" runs as long and
			// is measured as well.
			l := startLauncher(t, launchEnv(), kolo, "run", "-np", "4", "--metrics-addr", "127.0.0.1:0", "--status", "on",
				softmax, "-steps", "120", "-pace", slow.String(), "-slow-rank", strconv.Itoa(tc.slowRank), "-slow", slow.String())
			url := l.metricsURL(t)
			// Scrape until the job ends; keep the last scrape with every rank's lateness.
			var late map[int]float64
			scrapes := 0
			for running := true; running; {
				select {
				case <-l.done:
					running = false
				case <-time.After(300 * time.Millisecond):
				}
				if body, err := scrape(url); err == nil {
					scrapes++
					if m := latenessOf(body); len(m) == 4 {
						late = m
					}
				}
			}
			if code := l.wait(t, time.Minute); code != 0 {
				t.Fatalf("kolo run exited %d\nstderr:\n%s", code, l.stderr.String())
			}
			if late == nil {
				t.Fatalf("%d scrapes of %s, none with the lateness of every rank\nstderr:\n%s", scrapes, url, l.stderr.String())
			}
			latest := -1
			for r, v := range late {
				if latest < 0 || v > late[latest] {
					latest = r
				}
			}
			half := (slow / 2).Seconds()
			switch {
			case tc.slowRank >= 0 && (latest != tc.slowRank || late[latest] < half):
				t.Errorf("lateness by rank %v: want rank %d latest by at least %v", late, tc.slowRank, slow/2)
			case tc.slowRank < 0 && late[latest] >= half:
				t.Errorf("lateness by rank %v: no rank was slowed, yet rank %d is %.1f ms late", late, latest, 1000*late[latest])
			}

			stderr := l.stderr.String()
			rows := endRowRe.FindAllStringSubmatch(stderr, -1)
			if len(rows) != 4 {
				t.Fatalf("end table: want 4 rank rows on stderr, got %d:\n%s", len(rows), stderr)
			}
			for _, r := range rows {
				if r[2] != "120" {
					t.Errorf("end table: rank %s took %s steps, want 120", r[1], r[2])
				}
			}
			named := slowestLineRe.FindAllStringSubmatch(stderr, -1)
			switch {
			case tc.slowRank >= 0 && (len(named) != 1 || named[0][1] != strconv.Itoa(tc.slowRank)):
				t.Errorf("end of the job: want rank %d named slowest:\n%s", tc.slowRank, stderr)
			case tc.slowRank < 0 && len(named) != 0:
				if d, err := time.ParseDuration(named[0][2]); err != nil || d >= slow/2 {
					t.Errorf("end of the job: no rank was slowed, yet one is named slowest by %s:\n%s", named[0][2], stderr)
				}
			}
			if strings.Contains(l.stdout.String(), "| rank |") {
				t.Errorf("the end table went to stdout:\n%s", l.stdout.String())
			}
			// The status lines (--status on draws them on any stdout) name the same rank while
			// the job runs, and none like it when no rank is slowed.
			viewed := statusSlowestRe.FindAllStringSubmatch(l.stdout.String(), -1)
			switch {
			case tc.slowRank >= 0 && (len(viewed) == 0 || viewed[len(viewed)-1][1] != strconv.Itoa(tc.slowRank)):
				t.Errorf("status lines: want rank %d named slowest, got %v", tc.slowRank, viewed)
			case tc.slowRank < 0 && len(viewed) > 0:
				// The last frame, as for /metrics: a load spike on this machine can make a rank
				// last for a few steps, which the view rightly shows while it lasts.
				v := viewed[len(viewed)-1]
				if ms, err := strconv.ParseFloat(v[2], 64); err != nil || ms >= float64(slow/2/time.Millisecond) {
					t.Errorf("status lines: no rank was slowed, yet the last frame says %q", v[0])
				}
			}
		})
	}
}

// metricsURL waits (up to 30 s) for the /metrics address kolo run prints on stderr.
func (l *launcher) metricsURL(t *testing.T) string {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if m := metricsAddrLine.FindStringSubmatch(l.stderr.String()); m != nil {
			return m[1]
		}
	}
	t.Fatalf("no metrics address on stderr within 30 s:\n%s", l.output())
	return ""
}

func scrape(url string) (string, error) {
	c := http.Client{Timeout: 2 * time.Second}
	resp, err := c.Get(url)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return string(b), err
}

// latenessOf reads kolo_rank_lateness_seconds by rank from a scrape.
func latenessOf(body string) map[int]float64 {
	m := map[int]float64{}
	for _, s := range latenessSeries.FindAllStringSubmatch(body, -1) {
		r, _ := strconv.Atoi(s[1])
		v, err := strconv.ParseFloat(s[2], 64)
		if err == nil {
			m[r] = v
		}
	}
	return m
}

// TestFlightFileOnFailure runs 4 ranks, one of which is slow and then exits in the middle of the
// job: kolo run writes the flight-recorder file into --output-filename's directory, names it on
// stderr, and it parses and holds each rank's current op. The others wait for the slow rank most
// of each step, so their last reports (the launcher stops them as soon as the rank exits) find
// them in the gradient allreduce.
func TestFlightFileOnFailure(t *testing.T) {
	if testing.Short() {
		t.Skip("starts kolo run")
	}
	kolo, softmax := buildKolo(t), buildSoftmax(t)
	dir := t.TempDir()
	// 20 steps of 50 ms leave time for the ranks' reports to reach the launcher before rank 1 exits.
	l := startLauncher(t, launchEnv(), kolo, "run", "-np", "4", "--output-filename", dir,
		softmax, "-steps", "200", "-slow-rank", "1", "-slow", "50ms", "-exit-rank", "1", "-exit-step", "20")
	if code := l.wait(t, time.Minute); code != 3 {
		t.Fatalf("kolo run exited %d, want rank 1's 3\nstderr:\n%s", code, l.stderr.String())
	}
	stderr := l.stderr.String()
	m := flightFileLine.FindStringSubmatch(stderr)
	if m == nil {
		t.Fatalf("no flight-recorder file named on stderr:\n%s", stderr)
	}
	if filepath.Dir(m[1]) != dir {
		t.Errorf("flight-recorder file %s: want it in --output-filename %s", m[1], dir)
	}
	raw, err := os.ReadFile(m[1])
	if err != nil {
		t.Fatal(err)
	}
	var f struct {
		Reason string `json:"reason"`
		Size   int    `json:"size"`
		Ranks  []struct {
			Rank int `json:"rank"`
			Ops  []struct {
				Name  string `json:"name"`
				Kind  string `json:"kind"`
				State string `json:"state"`
			} `json:"ops"`
		} `json:"ranks"`
	}
	if err := json.Unmarshal(raw, &f); err != nil {
		t.Fatalf("flight-recorder file does not parse: %v\n%s", err, raw)
	}
	if f.Size != 4 || len(f.Ranks) != 4 || !strings.Contains(f.Reason, "rank 1") {
		t.Fatalf("flight-recorder file: size %d, %d ranks, reason %q; want 4, 4, naming rank 1\n%s", f.Size, len(f.Ranks), f.Reason, raw)
	}
	waiting := 0
	for _, r := range f.Ranks {
		if len(r.Ops) == 0 {
			t.Errorf("rank %d: no ops in the flight-recorder file", r.Rank)
			continue
		}
		cur := r.Ops[len(r.Ops)-1]
		if cur.Name == "" || cur.Kind == "" || cur.State == "" {
			t.Errorf("rank %d: current op %+v lacks a name, kind or state", r.Rank, cur)
		}
		if r.Rank != 1 && cur.State != "done" {
			waiting++
		}
	}
	// A report is taken at a moment of the step: one in 20 finds a rank between ops.
	if waiting == 0 {
		t.Errorf("no rank but 1 is in an op in the flight-recorder file; they wait for rank 1 most of each step\n%s", raw)
	}
	if !strings.Contains(stderr, "still in") {
		t.Errorf("stderr does not say what the surviving ranks are in:\n%s", stderr)
	}
}
