package main

import (
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/kolo-dl/kolo/engine"
	"github.com/kolo-dl/kolo/gpu"
	"github.com/kolo-dl/kolo/jobenv"
	"github.com/kolo-dl/kolo/launch/flags"
)

// checkSettings parses, before any rank starts, every setting the ranks will parse at init: the
// environment they inherit, -x's values and the tuning flags' variables. A malformed or
// out-of-range one is an error naming it here, once, rather than in every rank seconds later.
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
	get := func(k string) string { return env[k] }
	var errs []error
	if _, err := engine.ConfigFromEnv(get); err != nil {
		errs = append(errs, err)
	}
	if v := env[jobenv.LogLevel]; v != "" {
		if _, err := jobenv.ParseLogLevel(v); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", jobenv.LogLevel, err))
		}
	}
	if _, err := jobenv.ParseSwitch(jobenv.TCPFullMesh, env[jobenv.TCPFullMesh]); err != nil {
		errs = append(errs, err)
	}
	if _, err := jobenv.ElasticTimeoutFrom(env); err != nil {
		errs = append(errs, err)
	}
	if _, err := jobenv.ReportsFrom(env); err != nil {
		errs = append(errs, err)
	}
	if _, err := gpu.ParseMode(get); err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("the ranks' settings (checked before starting any): %w", err)
	}
	return nil
}
