// Package archtest holds the import-rule tests: TestPackageRules, the table of what each kolo
// package's comment says it must not import, depend on or call, checked against the code;
// TestFoldersFormLayers, which fails when two folders (top-level, or directly under internal/)
// import each other around a loop; and TestOnlyTheAPIIsPublic, which fails when a package that
// ships can be imported by other modules without being kolo's documented Go API.
// A broken rule fails `go test` with the rule's own words instead of waiting for a reviewer.
//
// It has no code of its own and must not be imported.
package archtest
