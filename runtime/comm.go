package runtime

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"gcompile/ir"
)

// Comm moves data between the global ranks of a job's devices, wherever
// they run: goroutines of one process (runtime/comm's Local), processes on
// one or many machines (runtime/comm's Net, over TCP). A process calls it
// for each rank it holds, each rank from its own goroutine. The CUDA
// backend moves device memory with NCCL and keeps a Comm for what crosses
// the host (scalars, checkpoints, metrics).
//
// Semantics follow NCCL's: collectives are matched by call order within a
// group (the k-th call of every member meets the k-th calls of the
// others), sends and receives by (from, to, tag) in FIFO order. Unlike
// NCCL, every reduction adds the members' contributions in group-position
// order, one rounding per add in the element type, whatever the transport,
// so a job gives the same bits on one process or many. Members whose
// arguments disagree all fail with the same kind of error (ErrMismatch,
// ErrArgs) instead of hanging.
//
// Buffers are little-endian elements of dt (the layout both backends keep
// in memory); lengths are in bytes and must be whole elements.
type Comm interface {
	// Size is the number of global ranks the comm connects.
	Size() int
	// AllReduce sums bufs in place: every member's bufs[i] becomes the
	// sum over members. Several bufs form one bucket and one collective;
	// members must pass as many buffers, of the same lengths.
	AllReduce(g Group, rank int, dt ir.DType, bufs ...[]byte) error
	// ReduceScatter leaves in out the caller's chunk of the sum of the
	// members' in: len(in) = g.Size()·len(out), and out is the sum of
	// every member's chunk at the caller's position.
	ReduceScatter(g Group, rank int, dt ir.DType, in, out []byte) error
	// AllGather concatenates the members' in, in position order, into out.
	AllGather(g Group, rank int, dt ir.DType, in, out []byte) error
	// AllToAll sends chunk j of in to member j and puts the chunk from
	// member p at chunk p of out; len(in) = len(out), a multiple of g.Size().
	AllToAll(g Group, rank int, dt ir.DType, in, out []byte) error
	// Broadcast copies the buffer of the member at group position root
	// into every other member's buf.
	Broadcast(g Group, rank, root int, dt ir.DType, buf []byte) error
	// Barrier returns once every member of g has called it.
	Barrier(g Group, rank int) error
	// Send posts a copy of buf for rank to and returns without waiting
	// for the receiver, so buf may be reused at once: pipeline schedules
	// are proven deadlock-free under buffered sends.
	Send(from, to, tag int, dt ir.DType, buf []byte) error
	// Recv waits for the next message from rank from to rank to with tag
	// and copies it into buf, whose length and dtype must match.
	Recv(from, to, tag int, dt ir.DType, buf []byte) error
	// Abort makes every blocked and later call fail with err (wrapped in
	// ErrAborted), in this process and, for a transport between
	// processes, in every other: a rank that fails calls it so that no
	// other waits for it until a timeout.
	Abort(err error)
	// Stats counts the completed operations.
	Stats() CommStats
}

// Errors a Comm call wraps; the message around them names the call, the
// group, the ranks involved and the rule that was broken.
var (
	// ErrAborted marks a call that failed because Abort was called (here
	// or, for a transport between processes, by another process); the
	// error also carries the cause handed to Abort.
	ErrAborted = errors.New("comm aborted")
	// ErrGroup marks an invalid group, a rank outside the comm or a
	// caller that is not a member of the group it names.
	ErrGroup = errors.New("invalid group")
	// ErrArgs marks a member whose own arguments break a rule (a length
	// that does not fit the group, a root outside it, overlapping
	// buffers). Every member of that collective fails, so none hangs.
	ErrArgs = errors.New("invalid arguments")
	// ErrMismatch marks members of one collective, or the two sides of a
	// Send/Recv pair, that disagree: on the collective, the element type,
	// a length or the root.
	ErrMismatch = errors.New("members disagree")
	// ErrTimeout marks a call that waited longer than the comm's timeout
	// for another rank; the message names the rank and what was awaited.
	ErrTimeout = errors.New("timed out")
	// ErrPeerLost marks a call that failed because the process holding a
	// rank it needed went away (its connection closed).
	ErrPeerLost = errors.New("peer lost")
)

// DefaultTimeout is how long a Comm call waits for another rank before
// failing, as NCCL's watchdog does.
const DefaultTimeout = 10 * time.Minute

// Group is an ordered set of global device ranks. A member's position in
// Ranks is its rank within the group; reductions add contributions in
// position order, whatever order members arrive in.
//
// Channel keeps apart groups with the same ranks that must not share call
// order: the devices' collectives and the host's exchanges between steps,
// say. The zero Channel is the devices'.
type Group struct {
	Ranks   []int
	Channel string
}

// Pos is rank's position in the group, or -1 if it is not a member.
func (g Group) Pos(rank int) int {
	for i, r := range g.Ranks {
		if r == rank {
			return i
		}
	}
	return -1
}

// Size is the number of members.
func (g Group) Size() int { return len(g.Ranks) }

// String prints the ranks in position order, e.g. "[0 2 5]", and the
// channel if there is one.
func (g Group) String() string {
	if g.Channel != "" {
		return fmt.Sprintf("%v (%s)", g.Ranks, g.Channel)
	}
	return fmt.Sprint(g.Ranks)
}

// Key encodes the group so that equal groups, and only they, share it:
// the ranks in order and the channel.
func (g Group) Key() string {
	var b strings.Builder
	b.WriteString(g.Channel)
	b.WriteByte('|')
	for i, r := range g.Ranks {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.Itoa(r))
	}
	return b.String()
}

// Check reports a group with no members, a rank outside [0,size) or a
// rank listed twice.
func (g Group) Check(size int) error {
	if len(g.Ranks) == 0 {
		return fmt.Errorf("%w: the group has no members", ErrGroup)
	}
	seen := make(map[int]int, len(g.Ranks))
	for p, r := range g.Ranks {
		if r < 0 || r >= size {
			return fmt.Errorf("%w: rank %d at position %d is outside [0,%d)", ErrGroup, r, p, size)
		}
		if q, dup := seen[r]; dup {
			return fmt.Errorf("%w: rank %d appears twice, at positions %d and %d", ErrGroup, r, q, p)
		}
		seen[r] = p
	}
	return nil
}

// CommStats counts the completed operations the ranks of one process took
// part in, for metrics. A collective counts once however many of its
// members the process holds; a failed one does not count.
type CommStats struct {
	AllReduce, ReduceScatter, AllGather, AllToAll, Broadcast, Barrier int64
	// SendRecv counts messages received.
	SendRecv int64
	// Bytes is the payload the process's members handed in: for
	// AllReduce, ReduceScatter, AllGather and AllToAll each member's
	// input, for Broadcast the root's buffer, for a message the received
	// buffer.
	Bytes int64
}
