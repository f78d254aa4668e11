package gpu

import (
	"fmt"
	"runtime"
)

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
	err := Group(c, func() error {
		var first error
		for p := range n {
			if sendCounts[p] > 0 {
				if err := c.Send(send.Add(sendDispls[p]*size), sendCounts[p], t, p, s); err != nil && first == nil {
					first = fmt.Errorf("send to rank %d: %w", p, err)
				}
			}
			if recvCounts[p] > 0 {
				if err := c.Recv(recv.Add(recvDispls[p]*size), recvCounts[p], t, p, s); err != nil && first == nil {
					first = fmt.Errorf("recv from rank %d: %w", p, err)
				}
			}
		}
		return first
	})
	if err != nil {
		return fmt.Errorf("alltoall: %w", err)
	}
	return nil
}

// Group runs body, which enqueues operations on c, between c.GroupStart and c.GroupEnd, all on
// one OS thread: NCCL's group state is per thread (thread_local ncclGroupDepth), and a goroutine
// may change thread between two cgo calls. A group started on one thread and ended on another
// launches its operations one by one (sends and receives deadlock), fails at GroupEnd ("not in a
// group call") and leaves the first thread inside a group, which swallows the next NCCL calls
// made on it. The group is ended even when body fails, for the same reason.
func Group(c Comm, body func() error) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if err := c.GroupStart(); err != nil {
		return err
	}
	err := body()
	if e := c.GroupEnd(); e != nil && err == nil {
		err = e
	}
	return err
}
