//go:build !linux

package shm

import (
	"context"
	"errors"

	"github.com/kolo-dl/kolo/internal/transport"
)

var errNeedLinux = errors.New("shm transport needs linux")

// Group is this rank's attachment to the host's segment; on this OS Open always fails.
type Group struct{}

// Open fails: the shm transport needs Linux (futexes on a shared mapping).
func Open(ctx context.Context, cfg Config) (*Group, error) { return nil, errNeedLinux }

func (g *Group) Comm() transport.Comm           { return nil }
func (g *Group) Messenger() transport.Messenger { return nil }
func (g *Group) Abort(err error)                {}
func (g *Group) Close() error                   { return errNeedLinux }

// SegmentPrefix begins the name of every segment kolo creates.
const SegmentPrefix = "kolo-"

// Sweep does nothing on this OS: no segment was made here.
func Sweep(dir string) ([]string, error) { return nil, nil }
