package main

import (
	"strings"
	"testing"

	"github.com/kolo-dl/kolo/internal/launch/flags"
)

// Every malformed or out-of-range setting a rank would parse at init is refused by kolo run
// before any rank starts, naming it, whether it comes from the environment, -x or a flag.
func TestCheckSettings(t *testing.T) {
	for _, tc := range []struct {
		name    string
		env     map[string]string // of kolo run
		x       []string          // -x
		engine  map[string]string // tuning flags' variables
		wantErr string
	}{
		{"all good", map[string]string{"KOLO_FUSION_THRESHOLD": "64MiB", "KOLO_TCP_FULL_MESH": "1"}, nil, nil, ""},
		{"a switch that is neither", map[string]string{"KOLO_TCP_FULL_MESH": "maybe"}, nil, nil, `KOLO_TCP_FULL_MESH="maybe"`},
		{"a number out of range", map[string]string{"KOLO_FUSION_THRESHOLD": "99999999999999999999"}, nil, nil, "KOLO_FUSION_THRESHOLD"},
		{"Horovod's name", map[string]string{"HOROVOD_CYCLE_TIME": "soon"}, nil, nil, "HOROVOD_CYCLE_TIME"},
		{"a bad log level", map[string]string{"KOLO_LOG_LEVEL": "loud"}, nil, nil, "KOLO_LOG_LEVEL"},
		{"through -x", nil, []string{"KOLO_SPIN_TIME=x"}, nil, "KOLO_SPIN_TIME"},
		{"reports neither on nor off", map[string]string{"KOLO_REPORTS": "sometimes"}, nil, nil, "KOLO_REPORTS"},
		{"the device path", map[string]string{"KOLO_NCCL": "fast"}, nil, nil, "KOLO_NCCL"},
		{"Horovod's GPU library", map[string]string{"HOROVOD_GPU_OPERATIONS": "CUDA"}, nil, nil, "HOROVOD_GPU_OPERATIONS"},
		{"an elastic timeout", map[string]string{"KOLO_ELASTIC_TIMEOUT": "-3"}, nil, nil, "KOLO_ELASTIC_TIMEOUT"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			err := checkSettings(&flags.Options{Env: tc.x, EngineEnv: tc.engine})
			if tc.wantErr == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) || !strings.Contains(err.Error(), "before starting any") {
				t.Fatalf("err = %v, want one naming %s", err, tc.wantErr)
			}
		})
	}
}
