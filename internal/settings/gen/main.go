// Command gen writes the settings table of README.md from package settings' declarations: go run
// ./internal/settings/gen from the module's root, or go generate ./internal/settings (which names the file). It must
// not change anything else in the file.
package main

import (
	"fmt"
	"os"

	"github.com/kolo-dl/kolo/internal/settings"
)

func main() {
	path := "README.md"
	if len(os.Args) > 1 {
		path = os.Args[1]
	}
	doc, err := os.ReadFile(path)
	if err != nil {
		fmt.Fprintln(os.Stderr, "internal/settings/gen:", err)
		os.Exit(1)
	}
	out, err := settings.WithTable(string(doc))
	if err != nil {
		fmt.Fprintf(os.Stderr, "internal/settings/gen: %s: %v\n", path, err)
		os.Exit(1)
	}
	if err := os.WriteFile(path, []byte(out), 0o644); err != nil {
		fmt.Fprintln(os.Stderr, "internal/settings/gen:", err)
		os.Exit(1)
	}
}
