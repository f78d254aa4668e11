package gpu

import "fmt"

// AllToAll sends sendCounts[p] elements from send+sendDispls[p] to every rank p and receives
// recvCounts[p] elements from p into recv+recvDispls[p] (counts and displacements in elements),
// as one group of sends and receives, which is how NCCL does uneven all-to-all. A zero count
// posts nothing for that peer.
func AllToAll(c Comm, send Ptr, sendCounts, sendDispls []int, recv Ptr, recvCounts, recvDispls []int, t DataType, s Stream) error {
	n := c.Size()
	if len(sendCounts) != n || len(sendDispls) != n || len(recvCounts) != n || len(recvDispls) != n {
		return fmt.Errorf("alltoall on %d ranks: %d send counts, %d send displacements, %d recv counts, %d recv displacements",
			n, len(sendCounts), len(sendDispls), len(recvCounts), len(recvDispls))
	}
	size := t.Size()
	if err := c.GroupStart(); err != nil {
		return fmt.Errorf("alltoall: %w", err)
	}
	var first error
	for p := range n {
		if sendCounts[p] > 0 {
			if err := c.Send(send.Add(sendDispls[p]*size), sendCounts[p], t, p, s); err != nil && first == nil {
				first = fmt.Errorf("alltoall: send to rank %d: %w", p, err)
			}
		}
		if recvCounts[p] > 0 {
			if err := c.Recv(recv.Add(recvDispls[p]*size), recvCounts[p], t, p, s); err != nil && first == nil {
				first = fmt.Errorf("alltoall: recv from rank %d: %w", p, err)
			}
		}
	}
	// The group is always ended, so that a refused enqueue does not leave it open.
	if err := c.GroupEnd(); err != nil && first == nil {
		first = fmt.Errorf("alltoall: %w", err)
	}
	return first
}
