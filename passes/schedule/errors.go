package schedule

import "errors"

// The sentinel errors name the family of rule a schedule or a request broke.
// Every error this package returns wraps exactly one of them, so a caller
// (the CLI, a planner trying several schedules) can tell a bad request from a
// broken schedule without matching on message text.
var (
	// ErrConfig: a generator was asked for an impossible shape (p, v, m).
	ErrConfig = errors.New("no such schedule")
	// ErrParse: the text form is malformed.
	ErrParse = errors.New("schedule parse error")
	// ErrInvalid: an action is out of range, on the wrong rank, duplicated or
	// out of order within its rank.
	ErrInvalid = errors.New("invalid schedule")
	// ErrMissing: some (chunk, microbatch) never runs a pass it must run.
	ErrMissing = errors.New("missing action")
	// ErrUnmatched: a send without its receive, a receive without its send,
	// or a pair whose peers disagree.
	ErrUnmatched = errors.New("unmatched send/recv")
	// ErrDeadlock: every remaining rank waits on something that never comes.
	ErrDeadlock = errors.New("deadlock")
)
