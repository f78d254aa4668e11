package main

import (
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/kolo-dl/kolo/internal/jobenv"
	"github.com/kolo-dl/kolo/internal/launch/flags"
	"github.com/kolo-dl/kolo/internal/settings"
)

// checkSettings parses, before any rank starts, every setting the ranks will parse at init: the
// environment they inherit, -x's values and the tuning flags' variables, each by its declaration
// (settings.Check). A malformed or out-of-range one is an error naming it here, once, rather than
// in every rank seconds later.
func checkSettings(opts *flags.Options) error {
	env := jobenv.FromEnviron(os.Environ())
	for _, kv := range opts.Env {
		if k, v, ok := strings.Cut(kv, "="); ok {
			env[k] = v
		}
	}
	for k, v := range opts.EngineEnv {
		env[k] = v
	}
	if err := errors.Join(settings.Check(settings.Env(env))...); err != nil {
		return fmt.Errorf("the ranks' settings (checked before starting any): %w", err)
	}
	return nil
}
