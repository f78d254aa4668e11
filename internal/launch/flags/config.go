package flags

import (
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"

	"gopkg.in/yaml.v3"
)

// configSetting is one value of a --config-file, as the flag it stands for.
type configSetting struct {
	Key   string // section.key, for messages
	Line  int
	Flag  string
	Value string
}

// configKey maps a key of horovodrun's config file onto a kolo run flag. negate: the key says the
// opposite of the flag (stall_check.enabled vs --no-stall-check).
type configKey struct {
	flag    string
	boolean bool // read yes/no/on/off as YAML 1.1 does
	negate  bool
}

// configSections are the sections and keys of horovodrun's --config-file that kolo has flags for.
var configSections = map[string]map[string]configKey{
	"params": {
		"fusion_threshold_mb":    {flag: "fusion-threshold-mb"},
		"cycle_time_ms":          {flag: "cycle-time-ms"},
		"cache_capacity":         {flag: "cache-capacity"},
		"hierarchical_allreduce": {flag: "hierarchical-allreduce", boolean: true},
		"hierarchical_allgather": {flag: "hierarchical-allgather", boolean: true},
	},
	"autotune": {
		"enabled":                {flag: "autotune", boolean: true},
		"log_file":               {flag: "autotune-log-file"},
		"warmup_samples":         {flag: "autotune-warmup-samples"},
		"steps_per_sample":       {flag: "autotune-steps-per-sample"},
		"bayes_opt_max_samples":  {flag: "autotune-bayes-opt-max-samples"},
		"gaussian_process_noise": {flag: "autotune-gaussian-process-noise"},
	},
	"timeline": {
		"filename":    {flag: "timeline-filename"},
		"mark_cycles": {flag: "timeline-mark-cycles", boolean: true},
	},
	"stall_check": {
		"enabled":                  {flag: "no-stall-check", boolean: true, negate: true},
		"warning_time_seconds":     {flag: "stall-check-warning-time-seconds"},
		"shutdown_time_seconds":    {flag: "stall-check-shutdown-time-seconds"},
		"crossed_time_seconds":     {flag: "stall-check-crossed-time-seconds"},
		"progress_timeout_seconds": {flag: "progress-timeout-seconds"},
	},
	"logging": {
		"level": {flag: "log-level"},
	},
}

// notForKolo explains keys of horovodrun's config file that have no meaning here.
var notForKolo = map[string]string{
	"controller":             "kolo has one controller (its own TCP rendezvous); remove it",
	"library_options":        "configures MPI, NCCL, oneCCL and Gloo, which kolo does not use; remove it",
	"logging.with_timestamp": "kolo's log lines always carry the time; remove it",
}

// ParseConfig reads a horovodrun-style YAML config file: sections params, autotune, timeline,
// stall_check and logging, each a map of keys to scalars. Unknown sections and keys are errors
// naming the file, line and key: a misspelt key must not be silently ignored.
func ParseConfig(name string, data []byte) ([]configSetting, error) {
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	if len(doc.Content) == 0 { // an empty file sets nothing
		return nil, nil
	}
	root := doc.Content[0]
	if root.Kind != yaml.MappingNode {
		return nil, fmt.Errorf("%s:%d: want a map of sections (params, autotune, timeline, stall_check, logging)", name, root.Line)
	}
	var out []configSetting
	for i := 0; i+1 < len(root.Content); i += 2 {
		sk, sv := root.Content[i], root.Content[i+1]
		keys, ok := configSections[sk.Value]
		if !ok {
			return nil, unknownKey(name, sk.Line, sk.Value)
		}
		if sv.Kind == yaml.ScalarNode && sv.Tag == "!!null" { // "params:" with nothing under it
			continue
		}
		if sv.Kind != yaml.MappingNode {
			return nil, fmt.Errorf("%s:%d: section %q: want a map of keys", name, sv.Line, sk.Value)
		}
		for j := 0; j+1 < len(sv.Content); j += 2 {
			k, v := sv.Content[j], sv.Content[j+1]
			full := sk.Value + "." + k.Value
			ck, ok := keys[k.Value]
			if !ok {
				return nil, unknownKey(name, k.Line, full)
			}
			if v.Kind != yaml.ScalarNode || v.Tag == "!!null" {
				return nil, fmt.Errorf("%s:%d: %s: want a single value", name, v.Line, full)
			}
			value := v.Value
			if b, ok := yamlBool(v); ok && ck.boolean {
				value = strconv.FormatBool(b != ck.negate)
			} else if ck.boolean {
				return nil, fmt.Errorf("%s:%d: %s: want true or false, got %q", name, v.Line, full, v.Value)
			}
			out = append(out, configSetting{Key: full, Line: v.Line, Flag: ck.flag, Value: value})
		}
	}
	return out, nil
}

// yamlBool reads a boolean the way horovodrun's YAML 1.1 parser does, so that "enabled: yes"
// means what it meant there (YAML 1.2 would make it a string).
func yamlBool(v *yaml.Node) (b, ok bool) {
	if v.Style&(yaml.SingleQuotedStyle|yaml.DoubleQuotedStyle) != 0 {
		return false, false
	}
	switch strings.ToLower(v.Value) {
	case "true", "yes", "on", "y":
		return true, true
	case "false", "no", "off", "n":
		return false, true
	}
	return false, false
}

func unknownKey(name string, line int, key string) error {
	if why := notForKolo[key]; why != "" {
		return fmt.Errorf("%s:%d: %q is not a kolo setting: %s", name, line, key, why)
	}
	return fmt.Errorf("%s:%d: unknown key %q (sections: params, autotune, timeline, stall_check, logging; see docs/launcher.md)", name, line, key)
}

// configFileFlag is --config-file: applying the file sets its flags at that point of the command
// line, so flags given after it win and flags given before it lose. Once applied, the file has
// nothing more to say: its settings are in the flags.
type configFileFlag struct {
	fs *flag.FlagSet
}

func (configFileFlag) String() string { return "" }

func (c configFileFlag) Set(path string) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	settings, err := ParseConfig(path, data)
	if err != nil {
		return err
	}
	for _, s := range settings {
		if err := c.fs.Set(s.Flag, s.Value); err != nil {
			return fmt.Errorf("%s:%d: %s: %w", path, s.Line, s.Key, err)
		}
	}
	return nil
}
