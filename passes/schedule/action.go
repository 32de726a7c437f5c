package schedule

import (
	"fmt"
	"strconv"
	"strings"
)

// Kind is what an action does. The zero-bubble split of the backward into B
// (input gradient) and W (weight gradient) is expressed by the presence of W
// actions: schedules without them treat B as the whole backward.
type Kind uint8

// The action kinds. Sends and receives carry the chunk whose data crosses the
// rank boundary (see Action) so that a matching pair can be found without
// looking at the rest of the list.
const (
	F        Kind = iota // forward of one chunk on one microbatch
	B                    // backward (input gradient; whole backward when no W exists)
	W                    // weight gradient, split off B by zero-bubble schedules
	SendF                // send chunk's output activation to the next chunk's rank
	RecvF                // receive chunk's input activation from the previous chunk's rank
	SendB                // send the gradient of chunk's input to the previous chunk's rank
	RecvB                // receive the gradient of chunk's output from the next chunk's rank
	GradSync             // data-parallel gradient reduction, once per step
	Optim                // optimizer step, once per step
	numKinds
)

var kindNames = [numKinds]string{"F", "B", "W", "SendF", "RecvF", "SendB", "RecvB", "GradSync", "Optim"}

// String gives the Go-ish name, used in messages about kinds rather than
// about individual actions.
func (k Kind) String() string {
	if k < numKinds {
		return kindNames[k]
	}
	return "Kind(" + strconv.Itoa(int(k)) + ")"
}

// Action is one entry of a rank's list. Chunk is the global chunk index, so an
// action names its work unambiguously without knowing which rank it sits on;
// Peer is the other rank of a send or receive and is zero otherwise.
//
// For SendF/SendB, Chunk is the sending chunk (SendF carries its output
// forward, SendB carries the gradient of its input backward). For
// RecvF/RecvB, Chunk is the receiving chunk (RecvF brings in its input,
// RecvB the gradient of its output). So SendF(j) pairs with RecvF(j+1) and
// SendB(j) with RecvB(j−1), always on the same microbatch.
type Action struct {
	Kind  Kind
	Chunk int
	Micro int
	Peer  int
}

// String prints the compact form that dumps show and Parse reads.
func (a Action) String() string {
	return string(appendAction(nil, a))
}

// appendAction writes the compact form into buf; Schedule.String uses it
// directly so printing a million-action schedule does not allocate per
// action.
func appendAction(buf []byte, a Action) []byte {
	switch a.Kind {
	case F, B, W:
		buf = strconv.AppendInt(buf, int64(a.Chunk), 10)
		buf = append(buf, "FBW"[a.Kind])
		return strconv.AppendInt(buf, int64(a.Micro), 10)
	case SendF, RecvF, SendB, RecvB:
		buf = strconv.AppendInt(buf, int64(a.Chunk), 10)
		var tag, arrow string
		switch a.Kind {
		case SendF:
			tag, arrow = "sf", ">r"
		case RecvF:
			tag, arrow = "rf", "<r"
		case SendB:
			tag, arrow = "sb", ">r"
		default:
			tag, arrow = "rb", "<r"
		}
		buf = append(buf, tag...)
		buf = strconv.AppendInt(buf, int64(a.Micro), 10)
		buf = append(buf, arrow...)
		return strconv.AppendInt(buf, int64(a.Peer), 10)
	case GradSync:
		return append(buf, "sync"...)
	case Optim:
		return append(buf, "opt"...)
	}
	return append(buf, a.Kind.String()...)
}

// parseAction is the inverse of appendAction. The grammar is small enough
// that a hand-written scanner gives better messages than a regexp.
func parseAction(tok string) (Action, error) {
	switch tok {
	case "sync":
		return Action{Kind: GradSync}, nil
	case "opt":
		return Action{Kind: Optim}, nil
	}
	chunk, rest, err := leadingInt(tok, "chunk")
	if err != nil {
		return Action{}, err
	}
	if rest == "" {
		return Action{}, fmt.Errorf("expected F, B, W, sf, rf, sb or rb after chunk %d", chunk)
	}
	switch rest[0] {
	case 'F', 'B', 'W':
		kind := Kind(strings.IndexByte("FBW", rest[0]))
		micro, tail, err := leadingInt(rest[1:], "microbatch")
		if err != nil {
			return Action{}, err
		}
		if tail != "" {
			return Action{}, fmt.Errorf("unexpected %q after microbatch", tail)
		}
		return Action{Kind: kind, Chunk: chunk, Micro: micro}, nil
	}
	if len(rest) < 2 {
		return Action{}, fmt.Errorf("expected F, B, W, sf, rf, sb or rb after chunk %d, got %q", chunk, rest)
	}
	var kind Kind
	var arrow string
	switch rest[:2] {
	case "sf":
		kind, arrow = SendF, ">r"
	case "rf":
		kind, arrow = RecvF, "<r"
	case "sb":
		kind, arrow = SendB, ">r"
	case "rb":
		kind, arrow = RecvB, "<r"
	default:
		return Action{}, fmt.Errorf("expected F, B, W, sf, rf, sb or rb after chunk %d, got %q", chunk, rest)
	}
	micro, tail, err := leadingInt(rest[2:], "microbatch")
	if err != nil {
		return Action{}, err
	}
	if len(tail) < 2 || tail[:2] != arrow {
		return Action{}, fmt.Errorf("expected %q and a peer rank after microbatch %d", arrow, micro)
	}
	peer, tail, err := leadingInt(tail[2:], "peer rank")
	if err != nil {
		return Action{}, err
	}
	if tail != "" {
		return Action{}, fmt.Errorf("unexpected %q after peer rank", tail)
	}
	return Action{Kind: kind, Chunk: chunk, Micro: micro, Peer: peer}, nil
}

// leadingInt splits a non-negative decimal prefix off s.
func leadingInt(s, what string) (int, string, error) {
	n := 0
	for n < len(s) && s[n] >= '0' && s[n] <= '9' {
		n++
	}
	if n == 0 {
		if s == "" {
			return 0, "", fmt.Errorf("expected %s number at end of token", what)
		}
		return 0, "", fmt.Errorf("expected %s number, got %q", what, s)
	}
	v, err := strconv.Atoi(s[:n])
	if err != nil {
		return 0, "", fmt.Errorf("%s number %q: %w", what, s[:n], err)
	}
	return v, s[n:], nil
}
