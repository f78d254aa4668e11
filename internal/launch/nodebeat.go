package launch

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/kolo-dl/kolo/internal/rendezvous"
)

// No-ssh mode's nodes have one liveness mechanism, whatever the job (node.go): every node other
// than the serving one (nodeagent.go) adds 1 to a heartbeat counter of its own at the rendezvous
// every beat interval (sendBeats), and the serving node, reading the counters on its own ticks,
// takes a node whose counter has not moved for a silence as gone (beatWatch). A counter rather
// than a session record (rendezvous.Client.SetSession): a node whose kolo run is stopped, or whose
// rendezvous connection is wedged, still holds its connection, but stops beating.

// sendBeats adds 1 at key every interval until ctx ends, and returns nil then. Otherwise it
// returns why the rendezvous is lost: an error other than a request's time-out or, with a
// positive silence, no answer for that long.
func sendBeats(ctx context.Context, rv *rendezvous.Client, key string, interval, silence time.Duration) error {
	t := time.NewTicker(interval)
	defer t.Stop()
	last := time.Now()
	for {
		bctx, cancel := context.WithTimeout(ctx, interval)
		_, err := rv.Add(bctx, key, 1)
		cancel()
		switch {
		case ctx.Err() != nil:
			return nil
		case err == nil:
			last = time.Now()
		case !errors.Is(err, context.DeadlineExceeded):
			return err
		case silence > 0 && time.Since(last) >= silence:
			return fmt.Errorf("the serving node has not answered for %.1f s", time.Since(last).Seconds())
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// beatWatch is the serving node's view of one node's heartbeat counter.
type beatWatch struct {
	beat string    // the counter's value when last read
	at   time.Time // when it last moved (or the watch began)
}

// silent takes the counter's value read at now and returns how long it has not moved.
func (w *beatWatch) silent(beat []byte, now time.Time) time.Duration {
	if string(beat) != w.beat {
		w.beat, w.at = string(beat), now
		return 0
	}
	return now.Sub(w.at)
}
