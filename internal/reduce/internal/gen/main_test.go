package main

import (
	"bytes"
	"os"
	"testing"
)

// TestGeneratedUpToDate fails when kernels_amd64.{s,go} were edited by hand or the generator changed
// without `go generate ./internal/reduce/`.
func TestGeneratedUpToDate(t *testing.T) {
	s, g, err := Generate()
	if err != nil {
		t.Fatal(err)
	}
	for path, want := range map[string][]byte{"../../kernels_amd64.s": s, "../../kernels_amd64.go": g} {
		got, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%s is stale: run go generate ./reduce/", path)
		}
	}
}
