//go:build !linux

package cpuset

// Current returns the CPUs the calling thread may run on.
func Current() (Set, error) { return nil, ErrUnsupported }

// Of returns the CPUs process pid may run on.
func Of(pid int) (Set, error) { return nil, ErrUnsupported }

// Apply makes the calling OS thread run only on the CPUs of s.
func Apply(s Set) error { return ErrUnsupported }
