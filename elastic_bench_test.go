package kolo_test

import (
	"fmt"
	"math/rand/v2"
	"os"
	"regexp"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/kolo-dl/kolo/internal/e2e"
)

// BenchmarkElasticHostLoss measures what losing a host costs an elastic job: hosts x 2 ranks on
// network-namespace hosts reached over ssh, training the Go example; each trial kills every
// process of a host drawn at random (rank 0's included) at a random moment, and times the kill
// to the survivors' first step in their new world. It prints a table of medians, p95 and
// maxima per host count:
//
//	go test -run '^$' -bench ElasticHostLoss -benchtime 20x .
func BenchmarkElasticHostLoss(b *testing.B) {
	kolo, softmax := buildKolo(b), buildSoftmax(b)
	rng := rand.New(rand.NewPCG(2026, 11))
	type row struct {
		hosts    int
		d        []float64
		rank0Hit int
	}
	rows := map[int]row{} // by host count: the last run of each (go test runs a benchmark more than once)
	counts := []int{2, 4, 8}
	for i, n := range counts {
		b.Run(fmt.Sprintf("hosts=%d", n), func(b *testing.B) {
			hosts := e2e.NewSSHHosts(b, n, 12350+i)
			r := row{hosts: n}
			for range b.N {
				victim := rng.IntN(n)
				if victim == 0 {
					r.rank0Hit++
				}
				j := startElasticHostJob(b, kolo, softmax, hosts, 2, nil, "-steps", "600", "-commit", "10", "-pace", "5ms")
				j.await(b, regexp.MustCompile(`<stdout>:step +100 `), time.Now().Add(-time.Hour), 90*time.Second)
				time.Sleep(time.Duration(rng.IntN(500)) * time.Millisecond)
				killed := time.Now()
				killHost(b, hosts, victim)
				l := j.await(b, regexp.MustCompile(`<stdout>:round \d+: `+strconv.Itoa(2*(n-1))+` ranks from step`), killed, 60*time.Second)
				r.d = append(r.d, l.at.Sub(killed).Seconds())
				select {
				case <-j.done:
				case <-time.After(2 * time.Minute):
					b.Fatalf("kolo run still running\n%s", j.output())
				}
				if j.code != 0 {
					b.Fatalf("kolo run exited %d\n%s", j.code, j.output())
				}
				time.Sleep(time.Second) // let the machine settle between trials
			}
			slices.Sort(r.d)
			b.ReportMetric(r.d[len(r.d)/2], "s-median")
			b.ReportMetric(r.d[min(len(r.d)-1, (len(r.d)*95+99)/100-1)], "s-p95")
			rows[n] = r
		})
	}
	fmt.Fprintf(os.Stdout, "\nkill of a host -> survivors' first step in the new world (hosts x 2 ranks over ssh, network namespaces)\n\n")
	fmt.Fprintf(os.Stdout, "| hosts | ranks | trials | rank 0's host killed | median s | p95 s | max s |\n|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, n := range counts {
		r := rows[n]
		if len(r.d) == 0 {
			continue
		}
		p95 := r.d[min(len(r.d)-1, (len(r.d)*95+99)/100-1)]
		fmt.Fprintf(os.Stdout, "| %d | %d | %d | %d | %.2f | %.2f | %.2f |\n", r.hosts, 2*r.hosts, len(r.d), r.rank0Hit, r.d[len(r.d)/2], p95, r.d[len(r.d)-1])
	}
}
