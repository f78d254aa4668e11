package kolo_test

import (
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/kolo-dl/kolo/testbed/e2e"
)

// BenchmarkElasticHostLoss measures what losing a host costs an elastic job: hosts x 2 ranks on
// network-namespace hosts reached over ssh, training the Go example; each trial kills every
// process of a host drawn at random (rank 0's included) at a random moment, and times the kill
// to the survivors' first step in their new world. It prints a table of medians, p95 and
// maxima per host count:
//
//	go test -run '^$' -bench ElasticHostLoss -benchtime 20x .
//
// With KOLO_BENCH_BASELINE=DIR (DIR holding kolo and softmax built from another checkout:
// `go build -o DIR/kolo ./cmd/kolo; go build -o DIR/softmax ./examples/softmax`), every trial
// runs with both builds, alternating which goes first, against the same host at the same moment,
// and the table has a row for each.
func BenchmarkElasticHostLoss(b *testing.B) {
	builds := benchBuilds(b)
	rng := rand.New(rand.NewPCG(2026, 11))
	type row struct {
		hosts    int
		d        []float64
		rank0Hit int
	}
	rows := map[string]row{} // by host count and build: the last run of each (go test runs a benchmark more than once)
	counts := []int{2, 4, 8}
	for i, n := range counts {
		b.Run(fmt.Sprintf("hosts=%d", n), func(b *testing.B) {
			hosts := e2e.NewSSHHosts(b, n, 12350+i)
			rs := make([]row, len(builds))
			for trial := range b.N {
				victim, pause := rng.IntN(n), time.Duration(rng.IntN(500))*time.Millisecond
				for k := range builds {
					k = (k + trial) % len(builds) // alternate which build goes first
					bd := builds[k]
					if victim == 0 {
						rs[k].rank0Hit++
					}
					j := startElasticHostJob(b, bd.kolo, bd.softmax, hosts, 2, nil, "-steps", "600", "-commit", "10", "-pace", "5ms")
					j.await(b, regexp.MustCompile(`<stdout>:step +100 `), time.Now().Add(-time.Hour), 90*time.Second)
					time.Sleep(pause)
					killed := time.Now()
					killHost(b, hosts, victim)
					l := j.await(b, regexp.MustCompile(`<stdout>:round \d+: `+strconv.Itoa(2*(n-1))+` ranks from step`), killed, 60*time.Second)
					rs[k].d = append(rs[k].d, l.at.Sub(killed).Seconds())
					j.awaitSuccess(b)
					time.Sleep(time.Second) // let the machine settle between trials
				}
			}
			for k, r := range rs {
				slices.Sort(r.d)
				r.hosts = n
				rows[fmt.Sprint(n, builds[k].name)] = r
			}
			b.ReportMetric(rs[0].d[len(rs[0].d)/2], "s-median")
			b.ReportMetric(p95(rs[0].d), "s-p95")
		})
	}
	fmt.Fprintf(os.Stdout, "\nkill of a host -> survivors' first step in the new world (hosts x 2 ranks over ssh, network namespaces)\n\n")
	fmt.Fprintf(os.Stdout, "| hosts | ranks | build | trials | rank 0's host killed | median s | p95 s | max s |\n|---:|---:|---|---:|---:|---:|---:|---:|\n")
	for _, n := range counts {
		for _, bd := range builds {
			r := rows[fmt.Sprint(n, bd.name)]
			if len(r.d) == 0 {
				continue
			}
			fmt.Fprintf(os.Stdout, "| %d | %d | %s | %d | %d | %.2f | %.2f | %.2f |\n", r.hosts, 2*r.hosts, bd.name, len(r.d), r.rank0Hit, r.d[len(r.d)/2], p95(r.d), r.d[len(r.d)-1])
		}
	}
}

// benchBuild is one build of kolo that an elastic benchmark runs.
type benchBuild struct{ name, kolo, softmax string }

// benchBuilds is this tree's build, and the one in KOLO_BENCH_BASELINE's directory if it is set.
func benchBuilds(b *testing.B) []benchBuild {
	builds := []benchBuild{{"this tree", buildKolo(b), buildSoftmax(b)}}
	if dir := os.Getenv("KOLO_BENCH_BASELINE"); dir != "" {
		bd := benchBuild{"baseline (" + dir + ")", filepath.Join(dir, "kolo"), filepath.Join(dir, "softmax")}
		for _, f := range []string{bd.kolo, bd.softmax} {
			if _, err := os.Stat(f); err != nil {
				b.Fatalf("KOLO_BENCH_BASELINE: %v", err)
			}
		}
		builds = append(builds, bd)
	}
	return builds
}

// p95 is the 95th percentile of sorted d (the nearest rank above).
func p95(d []float64) float64 { return d[min(len(d)-1, (len(d)*95+99)/100-1)] }

// BenchmarkElasticHostCut is BenchmarkElasticHostLoss with the host's link cut instead of its
// processes killed (`ip link set eth0 down`: they live on, unreachable), 4 hosts x 2 ranks, with
// --progress-timeout-seconds 3 (a cut host is noticed by the control connections' TCP user
// timeout, which follows it): the cut to the survivors' first step in their new world.
// KOLO_BENCH_BASELINE adds a build to compare, as there.
//
//	go test -run '^$' -bench ElasticHostCut -benchtime 20x .
func BenchmarkElasticHostCut(b *testing.B) {
	builds := benchBuilds(b)
	rng := rand.New(rand.NewPCG(2026, 12))
	const n = 4
	hosts := e2e.NewSSHHosts(b, n, 12360)
	d := make([][]float64, len(builds))
	rank0 := make([]int, len(builds))
	for trial := range b.N {
		victim, pause := rng.IntN(n), time.Duration(rng.IntN(500))*time.Millisecond
		for k := range builds {
			k = (k + trial) % len(builds) // alternate which build goes first
			if victim == 0 {
				rank0[k]++
			}
			j := startElasticHostJob(b, builds[k].kolo, builds[k].softmax, hosts, 2, []string{"--progress-timeout-seconds", "3"},
				"-steps", "1500", "-commit", "10", "-pace", "5ms")
			j.await(b, regexp.MustCompile(`<stdout>:step +100 `), time.Now().Add(-time.Hour), 90*time.Second)
			time.Sleep(pause)
			cut := time.Now()
			if out, err := exec.Command("ip", "-n", hosts.Names[victim], "link", "set", "eth0", "down").CombinedOutput(); err != nil {
				b.Fatalf("cut host %d: %v: %s", victim, err, out)
			}
			l := j.await(b, regexp.MustCompile(`<stdout>:round \d+: `+strconv.Itoa(2*(n-1))+` ranks from step`), cut, 60*time.Second)
			d[k] = append(d[k], l.at.Sub(cut).Seconds())
			if l.at.Sub(cut) > 10*time.Second {
				// Far beyond the user timeout: say what the launcher saw.
				b.Logf("trial %d (%s): the survivors trained again %.1f s after the cut of host %d; launcher:\n%s",
					trial, builds[k].name, l.at.Sub(cut).Seconds(), victim, j.stderr.String())
			}
			j.awaitSuccess(b)
			killHost(b, hosts, victim) // its workers lived on behind the cut
			if out, err := exec.Command("ip", "-n", hosts.Names[victim], "link", "set", "eth0", "up").CombinedOutput(); err != nil {
				b.Fatalf("restore host %d's link: %v: %s", victim, err, out)
			}
			time.Sleep(time.Second)
		}
	}
	for k := range d {
		slices.Sort(d[k])
	}
	b.ReportMetric(d[0][len(d[0])/2], "s-median")
	b.ReportMetric(p95(d[0]), "s-p95")
	fmt.Fprintf(os.Stdout, "\nlink of a host cut -> survivors' first step in the new world (4 hosts x 2 ranks, --progress-timeout-seconds 3)\n\n")
	fmt.Fprintf(os.Stdout, "| hosts | ranks | build | trials | rank 0's host cut | median s | p95 s | max s |\n|---:|---:|---|---:|---:|---:|---:|---:|\n")
	for k, bd := range builds {
		fmt.Fprintf(os.Stdout, "| %d | %d | %s | %d | %d | %.2f | %.2f | %.2f |\n", n, 2*n, bd.name, len(d[k]), rank0[k], d[k][len(d[k])/2], p95(d[k]), d[k][len(d[k])-1])
	}
}

// BenchmarkElasticHostRejoin kills a host (4 hosts x 2 ranks) and lets it come back after a 2-3
// s cooldown. It reports how long after the kill the 8 ranks train again, and whether
// throughput is back at once: the time of the first 10 steps of the 8-rank world that follows,
// against the median time of 10 steps before the kill (from rank 0's line per step, with its time
// as it is printed; no -pace: the steps go as fast as 8 ranks on the machine's cores allow).
// KOLO_BENCH_BASELINE adds a build to compare, as in BenchmarkElasticHostLoss.
//
//	go test -run '^$' -bench ElasticHostRejoin -benchtime 10x .
func BenchmarkElasticHostRejoin(b *testing.B) {
	builds := benchBuilds(b)
	rng := rand.New(rand.NewPCG(2026, 13))
	const n = 4
	hosts := e2e.NewSSHHosts(b, n, 12361)
	res := make([]rejoinTrials, len(builds))
	for trial := range b.N {
		victim := 1 + rng.IntN(n-1) // not rank 0's host: the rejoin is what is timed
		for k := range builds {
			k = (k + trial) % len(builds) // alternate which build goes first
			res[k].run(b, builds[k], hosts, victim)
			time.Sleep(time.Second)
		}
	}
	fmt.Fprintf(os.Stdout, "\nhost killed, back after a 2-3 s cooldown (4 hosts x 2 ranks): 8 ranks again, and their first 10 steps against 10 steps before the kill\n\n")
	fmt.Fprintf(os.Stdout, "| build | trials | 8 ranks again after kill: median s | p95 s | 10 steps before the kill: median ms | first 10 steps after the rejoin: median ms | first 10 / before: median | max | steps 11-20 / before: median | max |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for k, r := range res {
		for _, d := range [][]float64{r.back, r.ratio, r.ratio2, r.pre10, r.post10} {
			slices.Sort(d)
		}
		if k == 0 {
			b.ReportMetric(r.back[len(r.back)/2], "s-back-median")
			b.ReportMetric(r.ratio[len(r.ratio)/2], "x-10steps-median")
		}
		fmt.Fprintf(os.Stdout, "| %s | %d | %.2f | %.2f | %.1f | %.1f | %.2fx | %.2fx | %.2fx | %.2fx |\n", builds[k].name, len(r.back), r.back[len(r.back)/2], p95(r.back),
			r.pre10[len(r.pre10)/2], r.post10[len(r.post10)/2], r.ratio[len(r.ratio)/2], r.ratio[len(r.ratio)-1], r.ratio2[len(r.ratio2)/2], r.ratio2[len(r.ratio2)-1])
	}
}

// rejoinTrials are one build's trials of BenchmarkElasticHostRejoin.
type rejoinTrials struct{ back, ratio, ratio2, pre10, post10 []float64 }

// run runs one trial of build bd, host victim killed and back after its cooldown, and records it.
func (r *rejoinTrials) run(b *testing.B, bd benchBuild, hosts *e2e.SSHHosts, victim int) {
	stepRe := regexp.MustCompile(`<stdout>:step +(\d+) .* t (\d+\.\d+)$`)
	j := startElasticHostJob(b, bd.kolo, bd.softmax, hosts, 2, []string{"--blacklist-cooldown-range", "2", "3"},
		"-steps", "20000", "-commit", "10", "-log-every", "1")
	j.await(b, regexp.MustCompile(`<stdout>:step +300 `), time.Now().Add(-time.Hour), 90*time.Second)
	killed := time.Now()
	killHost(b, hosts, victim)
	shrunk := j.await(b, regexp.MustCompile(`<stdout>:round \d+: 6 ranks from step`), killed, 60*time.Second)
	full := j.await(b, regexp.MustCompile(`<stdout>:round \d+: 8 ranks from step (\d+)`), shrunk.at, 60*time.Second)
	from, _ := strconv.Atoi(regexp.MustCompile(`from step (\d+)`).FindStringSubmatch(full.text)[1])
	j.awaitSuccess(b)
	// Rank 0's step lines (its clock, the same process throughout: its host is never the
	// victim) before the kill and in the 8-rank world after it.
	pre, post := map[int]float64{}, map[int]float64{}
	var before []float64
	j.out.mu.Lock()
	for _, l := range j.out.lines {
		if m := stepRe.FindStringSubmatch(l.text); m != nil {
			s, _ := strconv.Atoi(m[1])
			t, _ := strconv.ParseFloat(m[2], 64)
			if l.at.Before(killed) {
				pre[s] = t
			} else if l.at.After(full.at.Add(-time.Millisecond)) && s > from {
				post[s] = t
			}
		}
	}
	j.out.mu.Unlock()
	for s := 100; s+10 <= 300; s += 10 {
		a, ok1 := pre[s]
		z, ok2 := pre[s+10]
		if ok1 && ok2 {
			before = append(before, z-a)
		}
	}
	a, ok1 := post[from+1]
	z, ok2 := post[from+11]
	z2, ok3 := post[from+21]
	if len(before) == 0 || !ok1 || !ok2 || !ok3 {
		b.Fatalf("%s: missing step lines (from %d)\n%s", bd.name, from, j.output())
	}
	slices.Sort(before)
	r.back = append(r.back, full.at.Sub(killed).Seconds())
	r.ratio = append(r.ratio, (z-a)/before[len(before)/2])
	r.ratio2 = append(r.ratio2, (z2-z)/before[len(before)/2])
	r.pre10, r.post10 = append(r.pre10, 1e3*before[len(before)/2]), append(r.post10, 1e3*(z-a))
}
