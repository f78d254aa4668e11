package kolo_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/kolo-dl/kolo/internal/bench"
	"github.com/kolo-dl/kolo/testbed/e2e"
)

var (
	hostsRate    = flag.String("hosts-rate", "200mbit", "BenchmarkAllreduceAcrossHosts: tbf rate of every host's egress (tc's syntax); at 1gbit four busy hosts are limited by this machine's 2 CPUs")
	hostsLayouts = flag.String("hosts-layouts", "2x1,4x1,2x2", "BenchmarkAllreduceAcrossHosts: jobs as HOSTSxRANKS_PER_HOST, comma-separated")
	hostsSizes   = flag.String("hosts-sizes", "4MiB,64MiB", "BenchmarkAllreduceAcrossHosts: allreduce sizes per rank")
	hostsRepeats = flag.Int("hosts-repeats", 3, "BenchmarkAllreduceAcrossHosts: runs of each peer per layout, alternated")
	hostsIters   = flag.Int("hosts-iters", 20, "BenchmarkAllreduceAcrossHosts: timed allreduces per size and run")
	hostsWarmup  = flag.Int("hosts-warmup", 3, "BenchmarkAllreduceAcrossHosts: untimed allreduces per size and run")
	hostsPause   = flag.Duration("hosts-pause", 3*time.Second, "BenchmarkAllreduceAcrossHosts: pause before every run")
	hostsLatency = flag.String("hosts-tbf-latency", "400ms", "BenchmarkAllreduceAcrossHosts: the longest a byte may queue in a host's tbf (tc's syntax; its queue's depth)")
	hostsKoloEnv = flag.String("hosts-kolo-env", "", "BenchmarkAllreduceAcrossHosts: KEY=VALUE,... more environment for kolo's ranks (an experiment's knob)")
)

// mallocEnv tells glibc to keep freed memory, for both peers, as bench/compare.py does.
var mallocEnv = []string{"MALLOC_MMAP_MAX_=0", "MALLOC_TRIM_THRESHOLD_=1000000000000"}

// hostsLayout is one job shape: hosts x ranks per host, one host's ranks on one namespace.
type hostsLayout struct{ hosts, slots int }

func (l hostsLayout) String() string { return fmt.Sprintf("%dx%d", l.hosts, l.slots) }

// hostsRun is one peer's run of one layout: busbw in GB/s by size, or why it failed.
type hostsRun struct {
	busbw map[int64]float64
	err   error
}

// BenchmarkAllreduceAcrossHosts measures allreduce bus bandwidth across network-namespace hosts
// whose links are capped (a tbf qdisc on every host's egress, -hosts-rate), kolo (`kolo run` over
// ssh, `kolo bench allreduce`) beside OpenMPI (mpirun over ssh, bench/peers/mpi_allreduce.py
// through mpi4py), run alternately with a pause before each run, -hosts-repeats times per
// layout. It measures the capped link once with a single TCP stream between two hosts and
// prints one markdown table: busbw medians (ranges), kolo/OpenMPI, and busbw as a share of that
// link rate. Run it alone and once:
//
//	go test -run '^$' -bench AllreduceAcrossHosts -benchtime 1x -timeout 60m .
//
// (-hosts-layouts, -hosts-sizes, -hosts-repeats, -hosts-iters, -hosts-warmup, -hosts-pause,
// -hosts-rate change the run.) It skips where namespaces or sshd cannot be made; without mpirun
// or mpi4py it measures kolo alone and says so.
func BenchmarkAllreduceAcrossHosts(b *testing.B) {
	layouts, err := parseHostsLayouts(*hostsLayouts)
	if err != nil {
		b.Fatal(err)
	}
	sizes, err := bench.ParseSizes(*hostsSizes)
	if err != nil {
		b.Fatal(err)
	}
	nhosts := 0
	for _, l := range layouts {
		nhosts = max(nhosts, l.hosts)
	}
	hosts := e2e.NewSSHHosts(b, max(nhosts, 2), 12370)
	kolo := buildKolo(b)
	// Whatever a run left on a host (a rank whose launcher was killed) is killed by pid, before
	// sshd and the namespaces (with their qdiscs) go.
	b.Cleanup(func() { reapHosts(hosts) })
	if err := hosts.CapEgress(*hostsRate, *hostsLatency); err != nil {
		b.Fatal(err)
	}
	single, err := hosts.TCPStream(1, 0, 4*time.Second)
	if err != nil {
		b.Fatalf("measure the capped link: %v", err)
	}
	// The reference is what plain TCP gets when every host sends and receives at once, in a ring
	// of streams, as an allreduce does: on this 2-CPU machine the hosts share the CPUs that
	// carry every host's traffic, and at 1 Gbit/s per host four busy hosts get about half of it
	// (a single stream still gets 95%), which would be the test bed's limit, not kolo's.
	ring := make([]float64, max(nhosts, 2))
	errs := make([]error, len(ring))
	var wg sync.WaitGroup
	for i := range ring {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ring[i], errs[i] = hosts.TCPStream(i, (i+1)%len(ring), 4*time.Second)
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		b.Fatalf("measure the capped links under a ring of streams: %v", err)
	}
	link := median(ring)
	b.Logf("link, tbf rate %s: one TCP stream host 2 -> host 1 %.0f Mbit/s; a ring of %d streams at once (the reference) %.0f Mbit/s each (median; %.0f-%.0f)",
		*hostsRate, single/1e6, len(ring), link/1e6, slices.Min(ring)/1e6, slices.Max(ring)/1e6)
	mpiMissing := mpiUnavailable()

	dir := b.TempDir()
	runs := map[hostsLayout]map[string][]hostsRun{}
	first := true
	for _, l := range layouts {
		runs[l] = map[string][]hostsRun{}
		for rep := range *hostsRepeats {
			peers := []string{"kolo", "openmpi"}
			if rep%2 == 1 {
				peers = []string{"openmpi", "kolo"}
			}
			for _, peer := range peers {
				if peer == "openmpi" && mpiMissing != "" {
					continue
				}
				if !first {
					time.Sleep(*hostsPause)
				}
				first = false
				out := filepath.Join(dir, fmt.Sprintf("%s-%s-%d.json", peer, l, rep))
				var argv []string
				if peer == "kolo" {
					argv = koloHostsArgv(kolo, hosts, l, out)
				} else {
					argv = mpiHostsArgv(hosts, l, out)
				}
				r := runHostsJob(argv, out)
				if r.err != nil {
					b.Errorf("%s %s, repeat %d: %v", peer, l, rep+1, r.err)
				}
				if left := reapHosts(hosts); len(left) > 0 && r.err == nil {
					b.Logf("%s %s, repeat %d: processes left on the hosts after a successful run, killed: %v", peer, l, rep+1, left)
				}
				runs[l][peer] = append(runs[l][peer], r)
			}
		}
	}

	fmt.Fprintf(os.Stdout, "\nallreduce float32 sum across network-namespace hosts, every host's egress capped (tbf rate %s burst 256kbit latency %s); "+
		"link: %.0f Mbit/s per stream in a ring of TCP streams among all hosts at once (one stream alone: %.0f); %d runs per peer and layout, alternated, %s apart; "+
		"median of %d ops after %d untimed per run; busbw = algbw x 2(n-1)/n (n ranks), in Gbit/s; medians (ranges over runs); "+
		"glibc MALLOC_MMAP_MAX_=0 MALLOC_TRIM_THRESHOLD_=1000000000000 for both\n\n",
		*hostsRate, *hostsLatency, link/1e6, single/1e6, *hostsRepeats, *hostsPause, *hostsIters, *hostsWarmup)
	fmt.Fprintf(os.Stdout, "| hosts x ranks | size | kolo busbw Gbit/s | OpenMPI busbw Gbit/s | kolo/OpenMPI | kolo %% of link | OpenMPI %% of link |\n|---|---:|---:|---:|---:|---:|---:|\n")
	for _, l := range layouts {
		for _, size := range sizes {
			k := hostsBusbw(runs[l]["kolo"], size)
			m := hostsBusbw(runs[l]["openmpi"], size)
			var ratios []float64 // run i of kolo against run i of OpenMPI: neighbours in time
			for i := range min(len(runs[l]["kolo"]), len(runs[l]["openmpi"])) {
				kb, ok1 := runs[l]["kolo"][i].busbw[size]
				mb, ok2 := runs[l]["openmpi"][i].busbw[size]
				if ok1 && ok2 && mb > 0 {
					ratios = append(ratios, kb/mb)
				}
			}
			ratio := "-"
			if len(k) > 0 && len(m) > 0 {
				ratio = fmt.Sprintf("%.2fx (%.2f-%.2f)", median(k)/median(m), slices.Min(ratios), slices.Max(ratios))
			}
			pct := func(v []float64) string {
				if len(v) == 0 {
					return "-"
				}
				return fmt.Sprintf("%.0f%% (%.0f-%.0f)", 100*median(v)/link, 100*slices.Min(v)/link, 100*slices.Max(v)/link)
			}
			fmt.Fprintf(os.Stdout, "| %s | %s | %s | %s | %s | %s | %s |\n", l, bench.HumanBytes(size),
				gbits(k), gbits(m), ratio, pct(k), pct(m))
			if len(k) > 0 {
				b.ReportMetric(100*median(k)/link, fmt.Sprintf("%%link-kolo-%s-%s", l, bench.HumanBytes(size)))
			}
		}
	}
	if mpiMissing != "" {
		fmt.Fprintf(os.Stdout, "\nOpenMPI not measured: %s\n", mpiMissing)
	}
	if slices.ContainsFunc(layouts, func(l hostsLayout) bool { return l.slots > 1 }) {
		fmt.Fprintf(os.Stdout, "\nWith several ranks per host, busbw counts ranks, not links: a hierarchical allreduce sends "+
			"2(h-1)/h of the data over each host's link for h hosts, so busbw can exceed the link rate.\n")
	}
}

func parseHostsLayouts(s string) ([]hostsLayout, error) {
	var ls []hostsLayout
	for _, f := range strings.Split(s, ",") {
		h, r, ok := strings.Cut(strings.TrimSpace(f), "x")
		nh, err1 := strconv.Atoi(h)
		nr, err2 := strconv.Atoi(r)
		if !ok || err1 != nil || err2 != nil || nh < 2 || nr < 1 {
			return nil, fmt.Errorf("-hosts-layouts %q: want HOSTSxRANKS_PER_HOST, e.g. 2x1,4x1,2x2 (at least 2 hosts)", s)
		}
		ls = append(ls, hostsLayout{nh, nr})
	}
	return ls, nil
}

func hostsSpec(addrs []string, l hostsLayout) string {
	var spec []string
	for _, a := range addrs[:l.hosts] {
		spec = append(spec, fmt.Sprintf("%s:%d", a, l.slots))
	}
	return strings.Join(spec, ",")
}

func hostsBenchArgs(out string) []string {
	return []string{"--sizes", *hostsSizes, "--iters", strconv.Itoa(*hostsIters), "--warmup", strconv.Itoa(*hostsWarmup), "--json", out}
}

func koloHostsArgv(kolo string, hosts *e2e.SSHHosts, l hostsLayout, out string) []string {
	argv := append([]string{kolo, "run"}, hosts.SSHFlags()...)
	argv = append(argv, "-np", strconv.Itoa(l.hosts*l.slots), "-H", hostsSpec(hosts.Addrs, l),
		"--network-interface", hosts.Bridge+",eth0")
	for _, kv := range mallocEnv {
		argv = append(argv, "-x", kv)
	}
	for _, kv := range strings.Split(*hostsKoloEnv, ",") {
		if kv != "" {
			argv = append(argv, "-x", kv)
		}
	}
	argv = append(argv, kolo, "bench", "allreduce")
	return append(argv, hostsBenchArgs(out)...)
}

// mpiHostsArgv is mpirun over ssh to the hosts: ob1 with TCP between hosts (shared memory within
// one), on the bridge's subnet only, for the daemons' connections too.
func mpiHostsArgv(hosts *e2e.SSHHosts, l hostsLayout, out string) []string {
	subnet := hosts.Gateway[:strings.LastIndex(hosts.Gateway, ".")] + ".0/24"
	rsh := fmt.Sprintf("-p %d -i %s -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o BatchMode=yes -o IdentitiesOnly=yes -o LogLevel=ERROR",
		hosts.Port, hosts.Key)
	argv := []string{"mpirun", "--allow-run-as-root", "-np", strconv.Itoa(l.hosts * l.slots), "-H", hostsSpec(hosts.Addrs, l),
		"--mca", "plm_rsh_agent", "ssh", "--mca", "plm_rsh_args", rsh,
		"--mca", "pml", "ob1", "--mca", "btl", "self,vader,tcp",
		"--mca", "btl_tcp_if_include", subnet, "--mca", "oob_tcp_if_include", subnet}
	for _, kv := range mallocEnv {
		argv = append(argv, "-x", kv)
	}
	wd, _ := os.Getwd() // the root package's directory: the repository's root
	argv = append(argv, "/usr/bin/python3", filepath.Join(wd, "bench", "peers", "mpi_allreduce.py"))
	return append(argv, hostsBenchArgs(out)...)
}

// mpiUnavailable says why OpenMPI cannot be measured here, or "".
func mpiUnavailable() string {
	if _, err := exec.LookPath("mpirun"); err != nil {
		return "mpirun not found (apt-get install openmpi-bin python3-mpi4py)"
	}
	if out, err := exec.Command("/usr/bin/python3", "-c", "import mpi4py, numpy").CombinedOutput(); err != nil {
		return fmt.Sprintf("/usr/bin/python3 cannot import mpi4py and numpy (apt-get install python3-mpi4py): %v: %s",
			err, bytes.TrimSpace(out))
	}
	return ""
}

// runHostsJob runs one launcher (kolo run or mpirun) to its end, at most 10 minutes, and reads the
// JSON its rank 0 wrote. On a timeout the launcher's process group is killed; its remote ranks
// are reapHosts'.
func runHostsJob(argv []string, out string) hostsRun {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Env = launchEnv(mallocEnv...)
	var log bytes.Buffer
	cmd.Stdout, cmd.Stderr = &log, &log
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 5 * time.Second
	tail := func() string {
		s := log.String()
		if len(s) > 4000 {
			s = "..." + s[len(s)-4000:]
		}
		return s
	}
	if err := cmd.Run(); err != nil {
		return hostsRun{err: fmt.Errorf("%s: %v; its output ends:\n%s", strings.Join(argv, " "), err, tail())}
	}
	data, err := os.ReadFile(out)
	if err != nil {
		return hostsRun{err: fmt.Errorf("%s exited 0 but wrote no results: %v; its output ends:\n%s", argv[0], err, tail())}
	}
	var rep bench.Report
	if err := json.Unmarshal(data, &rep); err != nil {
		return hostsRun{err: fmt.Errorf("%s: %v", out, err)}
	}
	r := hostsRun{busbw: map[int64]float64{}}
	for _, res := range rep.Results {
		r.busbw[res.Bytes] = res.BusBW
	}
	return r
}

// reapHosts kills, by pid, every process on the hosts but their sshd servers, and lists them.
func reapHosts(hosts *e2e.SSHHosts) []string {
	var left []string
	sshd := hosts.SSHDPids()
	for i := range hosts.Names {
		for _, p := range hosts.NamespaceProcs(i, sshd) {
			if pid, err := strconv.Atoi(strings.Fields(p)[0]); err == nil {
				syscall.Kill(pid, syscall.SIGKILL)
				left = append(left, p)
			}
		}
	}
	return left
}

// hostsBusbw is the busbw of size in each run that has it, sorted.
func hostsBusbw(runs []hostsRun, size int64) []float64 {
	var v []float64
	for _, r := range runs {
		if bw, ok := r.busbw[size]; ok {
			v = append(v, bw*8e9) // GB/s -> bit/s
		}
	}
	slices.Sort(v)
	return v
}

// median of v, in any order (v is not changed).
func median(v []float64) float64 {
	v = slices.Sorted(slices.Values(v))
	if len(v)%2 == 1 {
		return v[len(v)/2]
	}
	return (v[len(v)/2-1] + v[len(v)/2]) / 2
}

func gbits(v []float64) string {
	if len(v) == 0 {
		return "-"
	}
	return fmt.Sprintf("%.3f (%.3f-%.3f)", median(v)/1e9, v[0]/1e9, v[len(v)-1]/1e9)
}
