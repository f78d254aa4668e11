//go:build !purego

package reduce

// cpuid and xgetbv are in cpu_amd64.s: the stdlib's internal/cpu is not importable and x/sys/cpu is not
// a dependency of this module.
func cpuid(leaf, sub uint32) (eax, ebx, ecx, edx uint32)
func xgetbv() (eax, edx uint32)

// available lists the kernel sets this CPU and OS can run, best first. Both need the OS to save the
// vector state (OSXSAVE + XCR0), not just the CPU to have the instructions.
func available() []*kernelSet {
	maxLeaf, _, _, _ := cpuid(0, 0)
	if maxLeaf < 7 {
		return nil
	}
	_, _, ecx1, _ := cpuid(1, 0)
	const osxsave, avx, f16c = 1 << 27, 1 << 28, 1 << 29
	if ecx1&(osxsave|avx|f16c) != osxsave|avx|f16c {
		return nil
	}
	xcr0, _ := xgetbv()
	const ymmState, zmmState = 0x6, 0xe6 // SSE+AVX; plus opmask, ZMM0-15 high halves, ZMM16-31
	if xcr0&ymmState != ymmState {
		return nil
	}
	_, ebx7, _, _ := cpuid(7, 0)
	const avx2, avx512f, avx512dq, avx512bw, avx512vl = 1 << 5, 1 << 16, 1 << 17, 1 << 30, 1 << 31
	if ebx7&avx2 == 0 {
		return nil
	}
	var sets []*kernelSet
	const need512 = avx512f | avx512dq | avx512bw | avx512vl
	if ebx7&need512 == need512 && xcr0&zmmState == zmmState {
		sets = append(sets, &kernelsAVX512)
	}
	return append(sets, &kernelsAVX2)
}
