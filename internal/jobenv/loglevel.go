package jobenv

import (
	"fmt"
	"log/slog"
	"strings"

	"github.com/kolo-dl/kolo/internal/settings"
)

// LogLevel is the variable through which kolo run --log-level reaches workers; kolo.Init applies it
// to the default slog logger when the program has not installed its own.
var LogLevel = settings.LogLevel.Name

// ParseLogLevel reads Horovod's level names (TRACE, DEBUG, INFO, WARNING, ERROR, FATAL) and slog's
// (WARN), in any case. TRACE maps below slog's Debug and FATAL above its Error.
func ParseLogLevel(s string) (slog.Level, error) {
	if l, ok := logLevels[strings.ToUpper(strings.TrimSpace(s))]; ok {
		return l, nil
	}
	return 0, fmt.Errorf("log level %q: want one of TRACE, DEBUG, INFO, WARNING, ERROR, FATAL", s)
}

var logLevels = map[string]slog.Level{"TRACE": slog.LevelDebug - 4, "DEBUG": slog.LevelDebug, "INFO": slog.LevelInfo,
	"WARNING": slog.LevelWarn, "WARN": slog.LevelWarn, "ERROR": slog.LevelError, "FATAL": slog.LevelError + 4}
