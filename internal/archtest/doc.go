// Package archtest holds one test, TestPackageRules: the table of what each kolo package's comment
// says it must not import, depend on or call, checked against the code, so that a broken "must not"
// fails `go test` with the rule's own words instead of waiting for a reviewer.
//
// It has no code of its own and must not be imported.
package archtest
