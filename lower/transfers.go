package lower

import (
	"errors"
	"fmt"
	"strings"
)

// ErrTransferOrder marks pipeline programs whose sends and receives do not
// pair up: a runtime that matches transfers by their order between two
// ranks (NCCL) would deliver the wrong bytes or hang.
var ErrTransferOrder = errors.New("pipeline transfers do not pair up")

// ErrDeadlock marks pipeline programs that cannot all run to the end even
// when every send completes at once. Such errors wrap ErrTransferOrder too.
var ErrDeadlock = errors.New("pipeline programs deadlock")

// orderRule is why position-by-position agreement is required: the tag is
// not on the wire, so the receiver cannot pick the right message.
const orderRule = "NCCL pairs sends and receives between two ranks by their order"

// maxReported bounds how many problems one error lists; one mismatch tends
// to shift every later position, and the first few say what went wrong.
const maxReported = 8

// findings collects the first maxReported problems a check finds.
type findings []string

func (f *findings) add(format string, args ...any) {
	if len(*f) < maxReported {
		*f = append(*f, fmt.Sprintf(format, args...))
	}
}

// CheckTransfers proves that the per-rank programs of a pipeline (index =
// pipeline rank) exchange data consistently, before a runtime that runs
// each rank in its own process starts them:
//
//   - for every ordered pair of ranks a → b, the sends in progs[a] to b and
//     the receives in progs[b] from a agree in number and, position by
//     position, in tag and byte size, because transports such as NCCL
//     match them by order, not by tag;
//   - every send and receive names a peer that exists and is not itself;
//   - all ranks run to their last instruction when a send never waits and a
//     receive waits for the next unmatched send from its peer (FIFO).
//
// The last check models the lowering's contract (a value is sent right
// after it is computed, and the send does not wait for the receiver): it
// rules out wait cycles among the receives. It does not prove that a
// transport whose sends block until the peer posts the receive, as NCCL's
// do, can run the programs without buffering the sends; a runtime on such
// a transport must issue sends so that they do not hold up later work.
//
// The pairing is checked first, and the simulation runs only when it
// holds. Errors wrap ErrTransferOrder, and also ErrDeadlock for the
// simulation, and name the instructions involved. A single program, or
// programs without transfers, pass. The cost is linear in the number of
// instructions.
func CheckTransfers(progs []*Program) error { return checkTransfers(progs, false) }

// checkTransfers pairs the transfers by order or, byTag, by tag, then
// simulates the programs with that matching.
func checkTransfers(progs []*Program, byTag bool) error {
	if len(progs) <= 1 {
		return nil
	}
	t, err := collectTransfers(progs)
	if err != nil {
		return err
	}
	pair := t.checkPairs
	if byTag {
		pair = t.checkTags
	}
	if err := pair(); err != nil {
		return err
	}
	return t.simulate(byTag)
}

// transfers indexes every send and receive by ordered rank pair.
type transfers struct {
	progs []*Program
	// sends[a][b] and recvs[b][a] list the instruction indices of a's
	// sends to b and b's receives from a, in program order.
	sends, recvs [][][]int
	any          bool
}

func collectTransfers(progs []*Program) (*transfers, error) {
	n := len(progs)
	t := &transfers{progs: progs, sends: make([][][]int, n), recvs: make([][][]int, n)}
	var bad findings
	for r, p := range progs {
		if p == nil {
			return nil, fmt.Errorf("%w: rank %d has no program", ErrTransferOrder, r)
		}
		t.sends[r], t.recvs[r] = make([][]int, n), make([][]int, n)
		for i := range p.Instrs {
			in := &p.Instrs[i]
			if in.Op != "send" && in.Op != "recv" {
				continue
			}
			t.any = true
			if in.Peer < 0 || in.Peer >= n || in.Peer == r {
				bad.add("rank %d: %s has peer %d; want another rank in [0, %d)", r, t.describe(r, i), in.Peer, n)
				continue
			}
			if _, ok := t.bytes(r, i); !ok {
				bad.add("rank %d: %s names no buffer of the program", r, t.describe(r, i))
				continue
			}
			if in.Op == "send" {
				t.sends[r][in.Peer] = append(t.sends[r][in.Peer], i)
			} else {
				t.recvs[r][in.Peer] = append(t.recvs[r][in.Peer], i)
			}
		}
	}
	if len(bad) > 0 {
		return nil, fmt.Errorf("%w: %s", ErrTransferOrder, strings.Join(bad, "\n  "))
	}
	return t, nil
}

// bytes is the size of a transfer: the sent buffer or the received one.
func (t *transfers) bytes(rank, i int) (int64, bool) {
	p := t.progs[rank]
	in := &p.Instrs[i]
	id := in.Out
	if in.Op == "send" {
		if len(in.Args) == 0 {
			return 0, false
		}
		id = in.Args[0]
	}
	if id < 0 || id >= len(p.Buffers) {
		return 0, false
	}
	return p.Buffers[id].Bytes, true
}

// describe names one instruction for a diagnostic:
// "recv tag 57 (4096 B f32[4,16,16]) at instruction 88 (%57 add @gpt.go:41)".
func (t *transfers) describe(rank, i int) string {
	in := &t.progs[rank].Instrs[i]
	var b strings.Builder
	fmt.Fprintf(&b, "%s tag %d", in.Op, in.Tag)
	if n, ok := t.bytes(rank, i); ok {
		typ := in.OutType
		if in.Op == "send" && len(in.ArgTypes) > 0 {
			typ = in.ArgTypes[0]
		}
		fmt.Fprintf(&b, " (%d B %v)", n, typ)
	}
	fmt.Fprintf(&b, " at instruction %d", i)
	if in.Value != nil {
		fmt.Fprintf(&b, " (%s)", in.Value.Where())
	}
	if in.Block != "" {
		fmt.Fprintf(&b, " in block %q", in.Block)
	}
	return b.String()
}

// checkPairs compares, for each ordered pair, the sender's list with the
// receiver's, position by position.
func (t *transfers) checkPairs() error {
	var bad findings
	for a := range t.progs {
		for b := range t.progs {
			ss, rs := t.sends[a][b], t.recvs[b][a]
			for k := range min(len(ss), len(rs)) {
				si, ri := &t.progs[a].Instrs[ss[k]], &t.progs[b].Instrs[rs[k]]
				sn, _ := t.bytes(a, ss[k])
				rn, _ := t.bytes(b, rs[k])
				var what string
				switch {
				case si.Tag != ri.Tag && sn != rn:
					what = "tag and size differ"
				case si.Tag != ri.Tag:
					what = "tags differ"
				case sn != rn:
					what = "sizes differ"
				default:
					continue
				}
				bad.add("rank %d → rank %d, transfer %d: %s: rank %d's %s, rank %d's %s",
					a, b, k, what, a, t.describe(a, ss[k]), b, t.describe(b, rs[k]))
			}
			switch {
			case len(ss) > len(rs):
				bad.add("rank %d → rank %d: rank %d sends %d values, rank %d receives %d; transfer %d, rank %d's %s, is never received",
					a, b, a, len(ss), b, len(rs), len(rs), a, t.describe(a, ss[len(rs)]))
			case len(rs) > len(ss):
				bad.add("rank %d → rank %d: rank %d sends %d values, rank %d receives %d; transfer %d, rank %d's %s, is never sent",
					a, b, a, len(ss), b, len(rs), len(ss), b, t.describe(b, rs[len(ss)]))
			}
		}
	}
	if len(bad) == 0 {
		return nil
	}
	return fmt.Errorf("%w (%s, so both ranks must list their transfers in the same order with the same sizes):\n  %s",
		ErrTransferOrder, orderRule, strings.Join(bad, "\n  "))
}

// simulate runs every rank's instruction list with buffered sends: a send
// completes at once; a receive waits until its peer has executed the
// matching send: the next unmatched one of the pair (the pairs agree, so
// the k-th receive from a peer matches that peer's k-th send), or, byTag,
// of the pair and tag. Each rank runs until it blocks; a send wakes its
// receiver when that satisfies the receive it waits on. Every instruction
// executes once, so the cost is linear.
func (t *transfers) simulate(byTag bool) error {
	if !t.any {
		return nil
	}
	key := func(from, to int, in *Instr) tagKey {
		k := tagKey{from, to, 0}
		if byTag {
			k.tag = in.Tag
		}
		return k
	}
	n := len(t.progs)
	pc := make([]int, n)
	// sent counts executed sends, got executed receives, by key.
	sent, got := map[tagKey]int{}, map[tagKey]int{}
	waiting := make([]bool, n)
	ready := make([]int, 0, n)
	for r := range n {
		ready = append(ready, r)
	}
	for len(ready) > 0 {
		r := ready[len(ready)-1]
		ready = ready[:len(ready)-1]
		waiting[r] = false
		instrs := t.progs[r].Instrs
		for pc[r] < len(instrs) {
			in := &instrs[pc[r]]
			if in.Op == "recv" {
				k := key(in.Peer, r, in)
				if got[k] >= sent[k] {
					waiting[r] = true
					break
				}
				got[k]++
			} else if in.Op == "send" {
				k := key(r, in.Peer, in)
				sent[k]++
				// Wake the receiver if this is the send it waits on.
				if q := in.Peer; waiting[q] {
					if w := &t.progs[q].Instrs[pc[q]]; w.Peer == r && key(r, q, w) == k && got[k] < sent[k] {
						waiting[q] = false
						ready = append(ready, q)
					}
				}
			}
			pc[r]++
		}
	}
	var stuck []string
	first := -1
	for r := range n {
		if pc[r] == len(t.progs[r].Instrs) {
			continue
		}
		if first < 0 {
			first = r
		}
		in := &t.progs[r].Instrs[pc[r]]
		k := key(in.Peer, r, in)
		stuck = append(stuck, fmt.Sprintf("rank %d waits for rank %d at %s (it has received %d such transfers from rank %d, which has sent %d)",
			r, in.Peer, t.describe(r, pc[r]), got[k], in.Peer, sent[k]))
	}
	if first < 0 {
		return nil
	}
	return fmt.Errorf("%w: %w: even with buffered sends, %d of %d ranks stop before their last instruction (wait cycle %s):\n  %s",
		ErrTransferOrder, ErrDeadlock, len(stuck), n, t.cycle(first, pc), strings.Join(stuck, "\n  "))
}

// cycle follows who waits for whom from a stuck rank. The pairs agree, so
// a rank waiting on a finished peer would have its data; every stuck rank
// waits on another stuck rank, and the walk ends in a cycle.
func (t *transfers) cycle(from int, pc []int) string {
	seen := map[int]int{}
	var path []int
	for r := from; ; {
		if at, ok := seen[r]; ok {
			path = append(path[at:], r)
			break
		}
		seen[r] = len(path)
		path = append(path, r)
		if pc[r] >= len(t.progs[r].Instrs) {
			break
		}
		r = t.progs[r].Instrs[pc[r]].Peer
	}
	parts := make([]string, len(path))
	for i, r := range path {
		parts[i] = fmt.Sprintf("rank %d", r)
	}
	return strings.Join(parts, " → ")
}

// CheckTransfersByTag is CheckTransfers for the runtime's transports,
// which match a receive with the next send of the same tag between two
// ranks (the CPU backend's comms, and the CUDA backend's NCCL transfers,
// whose receiver posts in the sender's order and takes the one it needs):
//
//   - every send and receive names a peer that exists and is not itself;
//   - for every ordered pair a → b and every tag, a sends it as often as b
//     receives it, and the k-th send and k-th receive of a tag have the
//     same size;
//   - all ranks run to their last instruction when a send never waits and
//     a receive waits until its peer has sent its tag once more than it
//     has received.
//
// The lowering sends a value when it is computed and receives it where it
// is first used, so the two ends of a pair may list their transfers in
// different orders (a tied embedding is sent first and used last); that is
// fine here, and CheckTransfers, for transports that match by order, says
// so. Errors wrap ErrTransferOrder, and ErrDeadlock for the simulation.
func CheckTransfersByTag(progs []*Program) error { return checkTransfers(progs, true) }

// tagKey is one tag of one ordered pair.
type tagKey struct{ from, to, tag int }

// checkTags compares, for each ordered pair and tag, the sender's sends
// with the receiver's receives, occurrence by occurrence.
func (t *transfers) checkTags() error {
	var bad findings
	for a := range t.progs {
		for b := range t.progs {
			sent := map[int][]int{} // tag → a's send instructions, in order
			for _, i := range t.sends[a][b] {
				tag := t.progs[a].Instrs[i].Tag
				sent[tag] = append(sent[tag], i)
			}
			got := map[int][]int{}
			for _, i := range t.recvs[b][a] {
				tag := t.progs[b].Instrs[i].Tag
				got[tag] = append(got[tag], i)
			}
			for _, i := range t.recvs[b][a] {
				tag := t.progs[b].Instrs[i].Tag
				ss, rs := sent[tag], got[tag]
				if len(rs) == 0 || rs[0] != i {
					continue // reported with the tag's first receive
				}
				for k := range min(len(ss), len(rs)) {
					sn, _ := t.bytes(a, ss[k])
					rn, _ := t.bytes(b, rs[k])
					if sn != rn {
						bad.add("rank %d → rank %d, tag %d, occurrence %d: sizes differ: rank %d's %s, rank %d's %s",
							a, b, tag, k, a, t.describe(a, ss[k]), b, t.describe(b, rs[k]))
					}
				}
				if len(rs) > len(ss) {
					bad.add("rank %d → rank %d: rank %d receives tag %d %d times, rank %d sends it %d; rank %d's %s is never sent",
						a, b, b, tag, len(rs), a, len(ss), b, t.describe(b, rs[len(ss)]))
				}
			}
			for _, i := range t.sends[a][b] {
				tag := t.progs[a].Instrs[i].Tag
				ss, rs := sent[tag], got[tag]
				if ss[0] == i && len(ss) > len(rs) {
					bad.add("rank %d → rank %d: rank %d sends tag %d %d times, rank %d receives it %d; rank %d's %s is never received",
						a, b, a, tag, len(ss), b, len(rs), a, t.describe(a, ss[len(rs)]))
				}
			}
		}
	}
	if len(bad) == 0 {
		return nil
	}
	return fmt.Errorf("%w (every send must have its receive, tag by tag, with the same size):\n  %s", ErrTransferOrder, strings.Join(bad, "\n  "))
}
