package version

import (
	"os"
	"regexp"
	"testing"
)

// The wheel takes its version from the Python package; a release that bumps only one side would
// make every `kolo run` refuse the library it shipped with.
func TestPythonPackageAgrees(t *testing.T) {
	src, err := os.ReadFile("../../python/kolo/__init__.py")
	if err != nil {
		t.Fatalf("read the Python package's version: %v", err)
	}
	m := regexp.MustCompile(`(?m)^__version__ = "([^"]+)"`).FindSubmatch(src)
	if m == nil {
		t.Fatal(`python/kolo/__init__.py has no __version__ = "..." line`)
	}
	if got := string(m[1]); got != Version {
		t.Errorf("python/kolo/__init__.py says %q, version.Version is %q", got, Version)
	}
}
