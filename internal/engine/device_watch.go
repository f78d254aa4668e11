package engine

// The device path's watchdog, its memory and event recycling, and its end (see device.go).

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/kolo-dl/kolo/internal/gpu"
)

// deviceWatch follows the device work in flight until the engine stops (see the file comment).
func (e *Engine) deviceWatch() {
	d := e.dev
	every := checkEvery
	if t := e.cfg.ProgressTimeout; t > 0 {
		every = min(every, max(t/8, time.Millisecond))
	}
	tk := time.NewTicker(every)
	defer tk.Stop()
	for {
		select {
		case <-e.stopped:
			return
		case <-d.stopWait:
			return
		case <-tk.C:
		}
		d.release(d.reap())
		d.wmu.Lock()
		busy := len(d.inflight) > 0
		var oldest *deviceWork
		var since time.Time // the deadline runs from the later of the oldest work's start and the last completion
		if busy {
			oldest = d.inflight[0]
			since = oldest.since
			if d.progress.After(since) {
				since = d.progress
			}
		}
		comms := slices.Clone(d.comms)
		d.wmu.Unlock()
		if !busy {
			continue
		}
		// A lost peer shows up among the control messages: have the loop read them.
		e.summonBackground()
		for _, c := range comms {
			if err := c.AsyncError(); err != nil {
				e.Abort(fmt.Errorf("rank %d: device communicator failed during %s: %w", e.g.Rank, oldest.what, err))
				return
			}
		}
		if t := e.cfg.ProgressTimeout; t > 0 && time.Since(since) > t {
			e.Abort(fmt.Errorf("rank %d: device %s made no progress for %v (a peer never reached the collective)", e.g.Rank, oldest.what, t))
			return
		}
	}
}

// reap drops the work that has run and returns the memory whose readers have run, for release.
func (d *devicePath) reap() []gpu.Ptr {
	d.wmu.Lock()
	defer d.wmu.Unlock()
	i := 0
	for ; i < len(d.inflight); i++ {
		if ok, _ := d.inflight[i].done.Query(); !ok {
			break
		}
		// A consumer that calls WaitOnStream after this waits on nothing (ran); one that
		// looked before may wait on the event recorded again for later work on the same
		// stream: for more than its op, never for less.
		for _, res := range d.inflight[i].results {
			res.ran.Store(true)
		}
		d.events = append(d.events, d.inflight[i].done)
	}
	if i > 0 {
		d.progress = time.Now()
	}
	d.inflight = d.inflight[i:]
	kept := d.frees[:0]
	var free []gpu.Ptr
	for _, f := range d.frees {
		if ok, _ := f.ev.Query(); ok {
			free = append(free, f.p)
			d.events = append(d.events, f.ev)
			continue
		}
		kept = append(kept, f)
	}
	d.frees = kept
	return free
}

// release frees ps on a goroutine of its own, one at a time. cudaFree synchronizes the device: it
// waits for all its work, torch's and a collective stuck on a lost peer included. Under the
// watch lock it would keep halt from aborting the communicator that ends that collective; on
// the watchdog it would keep the watchdog from seeing that nothing progresses.
func (d *devicePath) release(ps []gpu.Ptr) {
	if len(ps) == 0 {
		return
	}
	d.wmu.Lock()
	d.toFree = append(d.toFree, ps...)
	start := !d.releasing
	d.releasing = true
	d.wmu.Unlock()
	if start {
		go d.releaseAll()
	}
}

func (d *devicePath) releaseAll() {
	for {
		d.wmu.Lock()
		ps := d.toFree
		d.toFree = nil
		if len(ps) == 0 {
			d.releasing = false
			d.wmu.Unlock()
			return
		}
		d.wmu.Unlock()
		for _, p := range ps {
			_ = d.dev.Free(p)
		}
	}
}

// abort fails the device work in flight with err and aborts every communicator, which ends the
// collectives stuck on a lost peer (on every rank, since every rank's engine stops). halt calls it.
func (d *devicePath) abort(err error) {
	d.wmu.Lock()
	defer d.wmu.Unlock()
	for _, w := range d.inflight {
		for _, res := range w.results {
			res.err.CompareAndSwap(nil, &err)
		}
	}
	for _, c := range d.comms {
		_ = c.Abort()
	}
	d.comms = nil
	if !d.closed {
		d.closed = true
		close(d.stopWait)
	}
}

// close ends the device path at shutdown: work still in flight after ctx ends is aborted; memory
// is freed once the engine's stream has drained.
func (d *devicePath) close(ctx context.Context) {
	select {
	case <-d.decided:
	default:
		return
	}
	if d.stream == nil {
		return
	}
	if err := d.stream.Synchronize(ctx); err != nil {
		d.abort(fmt.Errorf("device work still in flight at shutdown: %w", err))
		return // the stream's memory may still be read: leave it to the process's end
	}
	d.wmu.Lock()
	comms, frees := d.comms, d.frees
	d.comms, d.frees = nil, nil
	if !d.closed {
		d.closed = true
		close(d.stopWait)
	}
	d.wmu.Unlock()
	for _, c := range comms {
		_ = c.Destroy()
	}
	for _, f := range frees {
		_ = f.ev.Synchronize(ctx)
		_ = d.dev.Free(f.p)
	}
	for _, p := range append(d.retired, d.fusion) {
		if p != 0 {
			_ = d.dev.Free(p)
		}
	}
	d.retired, d.fusion, d.fusionCap = nil, 0, 0
	d.wmu.Lock()
	for _, ev := range d.events {
		_ = ev.Destroy()
	}
	d.events = nil
	d.wmu.Unlock()
	_ = d.stream.Destroy()
}

// event is a completed event to record anew: one from the pool, else a new one.
func (d *devicePath) event() (gpu.Event, error) {
	d.wmu.Lock()
	if n := len(d.events); n > 0 {
		ev := d.events[n-1]
		d.events = d.events[:n-1]
		d.wmu.Unlock()
		return ev, nil
	}
	d.wmu.Unlock()
	return d.dev.NewEvent()
}

// recycle returns an event whose latest record a stream wait has captured already (a wait is on
// the record made before it was enqueued, so recording the event again does not move it).
func (d *devicePath) recycle(ev gpu.Event) {
	d.wmu.Lock()
	d.events = append(d.events, ev)
	d.wmu.Unlock()
}
