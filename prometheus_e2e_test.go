package kolo_test

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/kolo-dl/kolo/testbed/e2e"
	"github.com/kolo-dl/kolo/testbed/proctest"
)

// TestPrometheusScrapesTheJob has a real Prometheus server scrape kolo run --metrics-addr while 4
// ranks train, one of them slowed in every step, and then asks it, as a user's dashboard would,
// which rank was the latest to arrive and how many steps the ranks took.
func TestPrometheusScrapesTheJob(t *testing.T) {
	if testing.Short() {
		t.Skip("starts kolo run and prometheus")
	}
	prom, err := exec.LookPath("prometheus")
	if err != nil {
		e2e.Unavailable(t, "no prometheus server (Debian's prometheus package; scripts/deps.sh installs it)")
	}
	kolo, softmax := buildKolo(t), buildSoftmax(t)
	metricsAddr, promAddr := freeLoopbackAddr(t), freeLoopbackAddr(t)

	dir := t.TempDir()
	cfg := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(cfg, []byte(fmt.Sprintf(`global:
  scrape_interval: 500ms
  scrape_timeout: 400ms
scrape_configs:
  - job_name: kolo
    static_configs:
      - targets: [%q]
`, metricsAddr)), 0o644); err != nil {
		t.Fatal(err)
	}
	p := exec.Command(prom, "--config.file="+cfg, "--storage.tsdb.path="+filepath.Join(dir, "data"),
		"--web.listen-address="+promAddr, "--log.level=warn")
	var promLog proctest.Buffer
	p.Stdout, p.Stderr = &promLog, &promLog
	if err := p.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Process.Kill(); p.Wait() })
	for deadline := time.Now().Add(30 * time.Second); ; {
		if resp, err := http.Get("http://" + promAddr + "/-/ready"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("prometheus not ready after 30 s:\n%s", promLog.String())
		}
		time.Sleep(100 * time.Millisecond)
	}

	const slowRank, steps = 2, 150
	l := startLauncher(t, launchEnv(), kolo, "run", "-np", "4", "--metrics-addr", metricsAddr,
		softmax, "-steps", strconv.Itoa(steps), "-pace", "40ms", "-slow-rank", strconv.Itoa(slowRank), "-slow", "40ms")
	if code := l.wait(t, 2*time.Minute); code != 0 {
		t.Fatalf("kolo run exited %d\nstderr:\n%s", code, l.stderr.String())
	}

	late := promQuery(t, promAddr, `topk(1, max_over_time(kolo_rank_lateness_seconds[10m]))`)
	if len(late) != 1 || late[0].Metric["rank"] != strconv.Itoa(slowRank) || late[0].value(t) < 0.02 {
		t.Errorf("prometheus: latest rank %+v, want rank %d late by at least 20 ms\nprometheus log:\n%s", late, slowRank, promLog.String())
	}
	stepsSeen := promQuery(t, promAddr, `max_over_time(kolo_rank_steps_total[10m])`)
	if len(stepsSeen) != 4 {
		t.Fatalf("prometheus: steps of %d ranks, want 4: %+v", len(stepsSeen), stepsSeen)
	}
	for _, s := range stepsSeen {
		// The last scrape may come a little before the job's end.
		if v := s.value(t); v < steps/2 || v > steps {
			t.Errorf("prometheus: rank %s took %v steps, want about %d", s.Metric["rank"], v, steps)
		}
	}
}

// freeLoopbackAddr is a loopback address with a port nothing listens on now.
func freeLoopbackAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

type promSample struct {
	Metric map[string]string `json:"metric"`
	Value  [2]any            `json:"value"`
}

func (s promSample) value(t *testing.T) float64 {
	t.Helper()
	str, _ := s.Value[1].(string)
	v, err := strconv.ParseFloat(str, 64)
	if err != nil {
		t.Fatalf("prometheus sample %+v: %v", s, err)
	}
	return v
}

// promQuery runs an instant query on the Prometheus server at addr.
func promQuery(t *testing.T, addr, query string) []promSample {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/api/v1/query?query=" + url.QueryEscape(query))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var r struct {
		Status string `json:"status"`
		Error  string `json:"error"`
		Data   struct {
			Result []promSample `json:"result"`
		} `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&r); err != nil {
		t.Fatalf("prometheus query %s: %v", query, err)
	}
	if r.Status != "success" {
		t.Fatalf("prometheus query %s: %s %s", query, r.Status, r.Error)
	}
	return r.Data.Result
}
