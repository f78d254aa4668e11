//go:build !cgo || !linux

package nccl

// Open reports that this build cannot load NCCL: dlopen needs cgo.
func Open(Options) (Backend, error) { return nil, ErrNoCgo }
