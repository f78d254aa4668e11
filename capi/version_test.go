package main

import (
	"os"
	"regexp"
	"testing"

	"github.com/kolo-dl/kolo"
)

// The Python package refuses a library of another version, and the wheel takes its version from
// the package: both must say kolo.Version.
func TestPythonPackageVersionMatches(t *testing.T) {
	src, err := os.ReadFile("../python/kolo/__init__.py")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^__version__ = "([^"]+)"`).FindSubmatch(src)
	if m == nil {
		t.Fatal("python/kolo/__init__.py has no __version__ line")
	}
	if string(m[1]) != kolo.Version {
		t.Errorf("python/kolo/__init__.py says %s, kolo.Version is %s: change both", m[1], kolo.Version)
	}
}
