package rankproc

import "time"

const (
	// MaxNodes is the largest group: processes on one host.
	MaxNodes = 64
	// DefaultTimeout is a configuration's default time limit.
	DefaultTimeout = 60 * time.Second
	// ChildTimeoutMargin is how much later than the parent's deadline a
	// child's own should pass: the parent kills the children first and
	// names the ranks that did not report; the child's own is for when
	// the parent is gone.
	ChildTimeoutMargin = 5 * time.Second
	// failGrace is how long a failed configuration waits for the other
	// ranks' failures, to name the one that caused them.
	failGrace = 500 * time.Millisecond
)

// Hello is a child's first stdout line.
type Hello struct {
	Rank int    `json:"rank"`
	PID  int    `json:"pid"`
	Addr string `json:"addr"`
}

// Peers is the line the parent writes to every child's stdin.
type Peers struct {
	Peers []string `json:"peers"`
}
