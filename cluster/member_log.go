package cluster

import (
	"context"
	"log/slog"
	"strings"
)

// logBridge is the io.Writer behind memberlist's *log.Logger: each write is
// one line "[LEVEL] memberlist: message", which it logs to a *slog.Logger
// at the matching level (DEBUG, INFO, WARN, ERR; anything else at INFO).
//
// memberlist v0.7.0 reports its own suspicion of a member only in its log
// ("Suspect NAME has failed, no acks received", state.go probeNode), so
// the bridge also passes that name to onSuspect. A test
// (TestMembershipKillDetected) fails if a memberlist upgrade rewords it.
type logBridge struct {
	log       *slog.Logger
	onSuspect func(name string)
}

func (b *logBridge) Write(p []byte) (int, error) {
	level, msg := parseMemberlistLine(string(p))
	if b.onSuspect != nil {
		if name, ok := suspectedName(msg); ok {
			b.onSuspect(name)
		}
	}
	ctx := context.Background()
	if b.log.Enabled(ctx, level) {
		b.log.Log(ctx, level, msg)
	}
	return len(p), nil
}

// parseMemberlistLine splits a memberlist log line into its level and the
// message without the "memberlist: " prefix.
func parseMemberlistLine(line string) (slog.Level, string) {
	line = strings.TrimRight(line, "\r\n")
	level := slog.LevelInfo
	if rest, ok := strings.CutPrefix(line, "["); ok {
		if tag, msg, ok := strings.Cut(rest, "] "); ok {
			switch tag {
			case "DEBUG", "TRACE":
				level = slog.LevelDebug
			case "INFO":
				level = slog.LevelInfo
			case "WARN":
				level = slog.LevelWarn
			case "ERR", "ERROR":
				level = slog.LevelError
			}
			line = msg
		}
	}
	line = strings.TrimPrefix(line, "memberlist: ")
	return level, line
}

// suspectedName recognizes memberlist's log of a failed probe.
func suspectedName(msg string) (string, bool) {
	rest, ok := strings.CutPrefix(msg, "Suspect ")
	if !ok {
		return "", false
	}
	name, ok := strings.CutSuffix(rest, " has failed, no acks received")
	return name, ok && name != ""
}
