// Package version holds kolo's version, one constant that the launcher, the library and the Python
// package must agree on. It imports nothing so that any package (the launcher included) can use it
// without pulling in the engine.
package version

// Version is kolo's release. python/kolo/__init__.py's __version__ must match (checked by a test).
const Version = "0.1.0"
