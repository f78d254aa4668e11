// Command gen writes the settings table of README.md from package settings' declarations. Run it
// from the module's root: go run ./settings/gen. It must not change anything else in the file.
package main

import (
	"fmt"
	"os"

	"github.com/kolo-dl/kolo/settings"
)

func main() {
	const path = "README.md"
	doc, err := os.ReadFile(path)
	if err != nil {
		fmt.Fprintln(os.Stderr, "settings/gen:", err)
		os.Exit(1)
	}
	out, err := settings.WithTable(string(doc))
	if err != nil {
		fmt.Fprintf(os.Stderr, "settings/gen: %s: %v\n", path, err)
		os.Exit(1)
	}
	if err := os.WriteFile(path, []byte(out), 0o644); err != nil {
		fmt.Fprintln(os.Stderr, "settings/gen:", err)
		os.Exit(1)
	}
}
