package e2e

import (
	"fmt"
	"os"
	"testing"

	"github.com/kolo-dl/kolo/internal/settings"
)

// RequireTestbedsEnv, set to 1 (CI sets it), turns "this machine has no mpirun/Slurm/..." from a
// skip into a failure, so that a CI image that lost a package cannot pass by skipping.
var RequireTestbedsEnv = settings.RequireTestbeds.Name

// Unavailable skips the test because a test bed is missing, or fails it where test beds are
// required.
func Unavailable(t testing.TB, format string, args ...any) {
	t.Helper()
	msg := fmt.Sprintf(format, args...)
	if os.Getenv(RequireTestbedsEnv) == "1" {
		t.Fatalf("test bed unavailable and %s=1: %s", RequireTestbedsEnv, msg)
	}
	t.Skip(msg)
}
