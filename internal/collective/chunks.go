package collective

// partition cuts nbytes into n consecutive parts at element boundaries, as evenly as possible (the
// first parts get one element more), and returns the n+1 boundaries. Every rank computes the same
// cut from the same arguments, which is what lets ranks agree on chunks without talking. Parts are
// empty when there are fewer elements than parts.
func partition(bounds []int, nbytes, elemSize, n int) []int {
	elems := nbytes / elemSize
	base, extra := elems/n, elems%n
	bounds = append(bounds[:0], 0)
	off := 0
	for i := range n {
		k := base
		if i < extra {
			k++
		}
		off += k * elemSize
		bounds = append(bounds, off)
	}
	return bounds
}

// part returns the i-th part of an n-way partition of nbytes, without building the whole table.
func part(nbytes, elemSize, n, i int) (lo, hi int) {
	elems := nbytes / elemSize
	base, extra := elems/n, elems%n
	lo = i*base + min(i, extra)
	hi = lo + base
	if i < extra {
		hi++
	}
	return lo * elemSize, hi * elemSize
}

// segment returns b[off:off+size], clipped to b (empty past its end).
func segment(b []byte, off, size int) []byte {
	if off >= len(b) {
		return b[len(b):]
	}
	return b[off:min(off+size, len(b))]
}

// mod is the non-negative remainder, for ring arithmetic on ranks.
func mod(a, n int) int {
	a %= n
	if a < 0 {
		a += n
	}
	return a
}
