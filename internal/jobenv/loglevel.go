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
	switch strings.ToUpper(strings.TrimSpace(s)) {
	case "TRACE":
		return slog.LevelDebug - 4, nil
	case "DEBUG":
		return slog.LevelDebug, nil
	case "INFO":
		return slog.LevelInfo, nil
	case "WARNING", "WARN":
		return slog.LevelWarn, nil
	case "ERROR":
		return slog.LevelError, nil
	case "FATAL":
		return slog.LevelError + 4, nil
	}
	return 0, fmt.Errorf("log level %q: want one of TRACE, DEBUG, INFO, WARNING, ERROR, FATAL", s)
}
