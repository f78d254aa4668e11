package launch

import (
	"context"
	"io"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"github.com/kolo-dl/kolo/internal/launch/flags"
)

func TestBindToRefusesSSHRanks(t *testing.T) {
	o, err := flags.Parse([]string{"-H", "localhost:1,node-that-is-not-here:1", "--bind-to", "core", "true"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	code, err := RunHosts(context.Background(), o, io.Discard, io.Discard)
	if code != ExitUsage || err == nil || !strings.Contains(err.Error(), "--bind-to core") ||
		!strings.Contains(err.Error(), "node-that-is-not-here") {
		t.Fatalf("RunHosts = %d, %v; want a usage error naming --bind-to core and the ssh host", code, err)
	}
}

func TestBindToRefusesTooManyLocalRanks(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("binding is Linux only")
	}
	o, err := flags.Parse([]string{"-np", strconv.Itoa(runtime.NumCPU() + 1), "--bind-to", "core", "true"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	code, err := RunHosts(context.Background(), o, io.Discard, io.Discard)
	if code != ExitUsage || err == nil || !strings.Contains(err.Error(), "ranks but only") {
		t.Fatalf("RunHosts = %d, %v; want a usage error before any rank starts", code, err)
	}
}

func TestBindToRefusesTwoNamesForThisMachine(t *testing.T) {
	o, err := flags.Parse([]string{"-H", "localhost:1,127.0.0.1:1", "--bind-to", "core", "true"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	code, err := RunHosts(context.Background(), o, io.Discard, io.Discard)
	if code != ExitUsage || err == nil || !strings.Contains(err.Error(), "127.0.0.1, localhost") {
		t.Fatalf("RunHosts = %d, %v; want a usage error naming both host names", code, err)
	}
}

// In no-ssh mode the split is checked before the node meets the others: a usage error at once,
// not a failed rank after every node has gathered.
func TestBindToRefusesTooManyRanksOnANode(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("binding is Linux only")
	}
	o, err := flags.Parse([]string{"--rendezvous", "127.0.0.1:1", "--nnodes", "2", "--nproc-per-node",
		strconv.Itoa(runtime.NumCPU() + 1), "--bind-to", "core", "true"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv("KOLO_SECRET", "9caf06bb4436cdbfa20af9121a626bc1")
	code, err := RunNode(context.Background(), o, io.Discard, io.Discard)
	if code != ExitUsage || err == nil || !strings.Contains(err.Error(), "ranks but only") {
		t.Fatalf("RunNode = %d, %v; want a usage error before meeting", code, err)
	}
}
