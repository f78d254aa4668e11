// Package archtest holds the import-rule tests: TestPackageRules, the table of what each kolo
// package's comment says it must not import, depend on or call, checked against the code, and
// TestFoldersFormLayers, which fails when two top-level folders import each other around a loop.
// A broken rule fails `go test` with the rule's own words instead of waiting for a reviewer.
//
// It has no code of its own and must not be imported.
package archtest
