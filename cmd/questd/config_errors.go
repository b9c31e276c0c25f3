package main

import (
	"errors"
	"flag"
	"fmt"
	"regexp"
	"strings"
)

// withOrigin appends where the value came from, when not the command line.
func withOrigin(err error, origin string) error {
	if origin == "" {
		return err
	}
	return fmt.Errorf("%w (set by %s)", err, origin)
}

// parseErrorRE matches the flag package's "invalid value" errors.
var parseErrorRE = regexp.MustCompile(`^invalid (?:boolean )?value "(.*)" for (?:flag )?-([^:]+): (.*)$`)

// parseError rewrites fs.Parse's errors as `--flag "value": why`.
func parseError(fs *flag.FlagSet, err error) string {
	m := parseErrorRE.FindStringSubmatch(err.Error())
	if m == nil {
		s := strings.Replace(err.Error(), "flag provided but not defined: -", "unknown flag --", 1)
		return strings.Replace(s, "flag needs an argument: -", "flag needs an argument: --", 1)
	}
	return fmt.Sprintf("--%s %q: %s", m[2], m[1], setWhy(fs.Lookup(m[2]), errors.New(m[3])))
}

// setWhy says in words why a value did not parse for f.
func setWhy(f *flag.Flag, err error) string {
	why := err.Error()
	kind := "a value"
	if f != nil {
		switch kindOf(f) {
		case kindInt:
			kind = "an integer"
		case kindBool:
			kind = "true or false"
		case kindDuration:
			kind = "a duration such as 2s"
		}
	}
	switch {
	case strings.HasSuffix(why, "parse error"), strings.HasSuffix(why, "invalid syntax"):
		return "not " + kind
	case strings.HasSuffix(why, "value out of range"):
		return "too large for " + kind
	}
	return why
}

// fieldError is a validation error about one flag's value.
type fieldError struct {
	flag, value, why string
}

func (e *fieldError) Error() string { return fmt.Sprintf("--%s %q: %s", e.flag, e.value, e.why) }

func bad(name, value, format string, args ...any) error {
	return &fieldError{flag: name, value: value, why: fmt.Sprintf(format, args...)}
}
