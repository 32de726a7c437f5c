package lower_test

import (
	"errors"
	"fmt"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"gcompile/examples/gpt"
	"gcompile/frontend"
	"gcompile/ir"
	"gcompile/lower"
	"gcompile/passes"
	"gcompile/passes/schedule"
)

// pipeCase is one pipelined compile of a small GPT (hidden 32).
type pipeCase struct {
	schedule       string
	pp, vpp, micro int
	dp, tp, zero   int
	layers         int
	noClip         bool
	optimizer      string
	offload        string
	hidden         string // default 32
}

func (c pipeCase) String() string {
	s := fmt.Sprintf("%s_pp%d_vpp%d_m%d_dp%d_tp%d_l%d", c.schedule, c.pp, max(c.vpp, 1), c.micro, max(c.dp, 1), max(c.tp, 1), c.layers)
	if c.zero > 0 {
		s += fmt.Sprintf("_zero%d", c.zero)
	}
	if c.offload != "" {
		s += "_offload"
	}
	return s
}

// scheduleBlocks is the compute order of the named schedule, which the
// schedule simulator proves deadlock-free first.
func scheduleBlocks(t testing.TB, name string, p, v, m int) [][]lower.Block {
	t.Helper()
	s, err := schedule.New(name, p, v, m)
	require.NoError(t, err)
	_, err = schedule.Simulate(s, nil)
	require.NoError(t, err)
	out := make([][]lower.Block, p)
	for r, acts := range s.Actions {
		for _, a := range acts {
			switch a.Kind {
			case schedule.F, schedule.B, schedule.W:
				out[r] = append(out[r], lower.Block{Kind: a.Kind.String()[0], Chunk: a.Chunk, Micro: a.Micro})
			}
		}
	}
	return out
}

// compilePipe compiles the GPT for c and lowers it to one program per
// pipeline rank.
func compilePipe(t testing.TB, c pipeCase) []*lower.Program {
	t.Helper()
	m, err := frontend.Build(gpt.Model, frontend.Config{Name: "gpt", Batch: max(c.dp, 1) * c.micro, Set: map[string]string{
		"layers": fmt.Sprint(c.layers), "hidden": "32", "heads": "4", "seq": "8"}})
	require.NoError(t, err)
	opts := passes.DefaultOptions()
	mesh := &ir.Mesh{Axes: []ir.MeshAxis{{Name: "pp", Size: c.pp}}}
	if c.dp > 1 {
		mesh.Axes = append(mesh.Axes, ir.MeshAxis{Name: "dp", Size: c.dp})
	}
	if c.tp > 1 {
		mesh.Axes = append(mesh.Axes, ir.MeshAxis{Name: "tp", Size: c.tp})
	}
	opts.Mesh = mesh
	opts.VPP = c.vpp
	opts.Microbatches = c.micro
	opts.Zero = c.zero
	opts.TwoBW = c.schedule == "2bw"
	_, err = passes.Run(m, opts, passes.Hooks{})
	require.NoError(t, err)
	progs, err := lower.LowerPipelineWith(m, scheduleBlocks(t, c.schedule, c.pp, max(c.vpp, 1), c.micro), lower.Options{Offload: c.offload})
	require.NoError(t, err)
	return progs
}

// countTransfers is the number of sends and receives over all programs.
func countTransfers(progs []*lower.Program) int {
	n := 0
	for _, p := range progs {
		for _, in := range p.Instrs {
			if in.Op == "send" || in.Op == "recv" {
				n++
			}
		}
	}
	return n
}

// Lowered pipelines whose transfers the lowering lists in the same order on
// both ends pass both checks.
func TestCheckTransfersAcceptsLoweredPipelines(t *testing.T) {
	for _, c := range []pipeCase{
		{schedule: "1f1b", pp: 4, micro: 4, layers: 4},
		{schedule: "gpipe", pp: 4, micro: 4, layers: 4},
		{schedule: "zb", pp: 4, micro: 4, layers: 4},
		{schedule: "2bw", pp: 4, micro: 4, layers: 4},
		{schedule: "1f1b", pp: 3, micro: 3, layers: 3},
		{schedule: "1f1b", pp: 4, micro: 4, layers: 4, dp: 2, tp: 2},
		{schedule: "1f1b", pp: 4, micro: 4, layers: 4, dp: 2, zero: 1},
		{schedule: "1f1b", pp: 4, micro: 4, layers: 4, dp: 2, zero: 2},
		{schedule: "1f1b", pp: 4, micro: 4, layers: 4, offload: "optimizer,params"},
	} {
		t.Run(c.String(), func(t *testing.T) {
			progs := compilePipe(t, c)
			require.Positive(t, countTransfers(progs), "a pipeline exchanges data")
			assert.NoError(t, lower.CheckTransfers(progs))
		})
	}
}

// The lowering sends a value right after computing it and receives it
// right before its first use. Where one rank pair carries values of
// different kinds, the two orders differ, and a transport that pairs by
// order would hand the receiver the wrong tensor:
//   - pp=2: rank 0 sends the tied embedding at the start of the step, before
//     the first activation, while rank 1 receives it at the LM head, after
//     that activation; backwards, the embedding's gradient leaves rank 1
//     before the input gradient of the same block and arrives after it;
//   - interleaved: the same for the tied embedding; and each chunk's
//     gradient sum of squares (for the gradient norm) leaves in the order
//     the chunks finish and is received in the optimizer's order;
//   - ZeRO-3: rank 0 sends the embedding's shard at the start of the step
//     and its all-gathered copy in the first forward; the last rank
//     receives the gathered copy first.
//
// CheckTransfers must call these order errors, not deadlocks, and the
// transfers of every pair must be the same ones in another order. Once the
// lowering lists both ends in one order, these cases belong in
// TestCheckTransfersAcceptsLoweredPipelines.
func TestCheckTransfersRejectsLoweringOrderMismatch(t *testing.T) {
	for _, c := range []pipeCase{
		{schedule: "1f1b", pp: 2, micro: 2, layers: 2},
		{schedule: "gpipe", pp: 2, micro: 2, layers: 2},
		{schedule: "zb", pp: 2, micro: 2, layers: 2},
		{schedule: "interleaved", pp: 2, vpp: 2, micro: 4, layers: 4},
		{schedule: "interleaved", pp: 4, vpp: 2, micro: 4, layers: 8},
		{schedule: "1f1b", pp: 4, micro: 4, layers: 4, dp: 2, zero: 3},
	} {
		t.Run(c.String(), func(t *testing.T) {
			progs := compilePipe(t, c)
			err := lower.CheckTransfers(progs)
			require.ErrorIs(t, err, lower.ErrTransferOrder)
			assert.NotErrorIs(t, err, lower.ErrDeadlock)
			assert.ErrorContains(t, err, ncclRule)
			for a := range progs {
				for b := range progs {
					sent, got := pairTransfers(progs, a, b)
					slices.Sort(sent)
					slices.Sort(got)
					assert.Equal(t, sent, got, "rank %d → rank %d move the same values", a, b)
				}
			}
		})
	}
}

// ncclRule is the reason order errors give.
const ncclRule = "NCCL pairs sends and receives between two ranks by their order"

// pairTransfers lists "tag:bytes" of a's sends to b and b's receives from
// a, in program order.
func pairTransfers(progs []*lower.Program, a, b int) (sent, got []string) {
	for _, in := range progs[a].Instrs {
		if in.Op == "send" && in.Peer == b {
			sent = append(sent, fmt.Sprintf("%d:%d", in.Tag, progs[a].Buffers[in.Args[0]].Bytes))
		}
	}
	for _, in := range progs[b].Instrs {
		if in.Op == "recv" && in.Peer == a {
			got = append(got, fmt.Sprintf("%d:%d", in.Tag, progs[b].Buffers[in.Out].Bytes))
		}
	}
	return sent, got
}

// cloneProgs copies what the corruptions below change: instruction lists
// and buffers.
func cloneProgs(progs []*lower.Program) []*lower.Program {
	out := make([]*lower.Program, len(progs))
	for i, p := range progs {
		c := *p
		c.Instrs = slices.Clone(p.Instrs)
		c.Buffers = slices.Clone(p.Buffers)
		out[i] = &c
	}
	return out
}

// transferAt is the index of the k-th instruction of op with peer in p.
func transferAt(t *testing.T, p *lower.Program, op string, peer, k int) int {
	t.Helper()
	for i, in := range p.Instrs {
		if in.Op == op && in.Peer == peer {
			if k == 0 {
				return i
			}
			k--
		}
	}
	require.FailNow(t, "no such transfer", "%s peer %d in %s", op, peer, p.Name)
	return -1
}

// Corrupting a correct pipeline in the ways a lowering or scheduling bug
// would is caught, with the sentinel and the instructions named.
func TestCheckTransfersRejectsCorruptions(t *testing.T) {
	base := compilePipe(t, pipeCase{schedule: "1f1b", pp: 4, micro: 4, layers: 4})
	require.NoError(t, lower.CheckTransfers(base))
	for _, tc := range []struct {
		name     string
		corrupt  func(t *testing.T, progs []*lower.Program) []string // returns substrings the error must hold
		deadlock bool
	}{
		{name: "swapped receives", corrupt: func(t *testing.T, progs []*lower.Program) []string {
			p := progs[1]
			i, j := transferAt(t, p, "recv", 0, 0), transferAt(t, p, "recv", 0, 1)
			require.NotEqual(t, p.Instrs[i].Tag, p.Instrs[j].Tag)
			p.Instrs[i], p.Instrs[j] = p.Instrs[j], p.Instrs[i]
			return []string{"rank 0 → rank 1, transfer 0: tags differ",
				fmt.Sprintf("recv tag %d", p.Instrs[i].Tag), fmt.Sprintf("at instruction %d", i), p.Instrs[i].Value.Where(),
				fmt.Sprintf("send tag %d", p.Instrs[j].Tag), ncclRule}
		}},
		{name: "dropped send", corrupt: func(t *testing.T, progs []*lower.Program) []string {
			p := progs[2]
			i := transferAt(t, p, "send", 3, 1)
			dropped := p.Instrs[i]
			p.Instrs = slices.Delete(p.Instrs, i, i+1)
			return []string{"rank 2 → rank 3", "is never sent", fmt.Sprintf("recv tag %d", dropped.Tag), dropped.Value.Where(), ncclRule}
		}},
		{name: "dropped receive", corrupt: func(t *testing.T, progs []*lower.Program) []string {
			p := progs[0]
			i := transferAt(t, p, "recv", 1, 3)
			tag := p.Instrs[i].Tag
			p.Instrs = slices.Delete(p.Instrs, i, i+1)
			return []string{"rank 1 → rank 0", "is never received", fmt.Sprintf("send tag %d", tag), ncclRule}
		}},
		{name: "changed size", corrupt: func(t *testing.T, progs []*lower.Program) []string {
			p := progs[3]
			i := transferAt(t, p, "recv", 2, 2)
			p.Buffers[p.Instrs[i].Out].Bytes /= 2
			return []string{"rank 2 → rank 3, transfer 2: sizes differ", fmt.Sprintf("at instruction %d", i),
				fmt.Sprintf("(%d B ", p.Buffers[p.Instrs[i].Out].Bytes), ncclRule}
		}},
		{name: "changed tag", corrupt: func(t *testing.T, progs []*lower.Program) []string {
			p := progs[1]
			i := transferAt(t, p, "send", 2, 0)
			p.Instrs[i].Tag = 99999
			return []string{"rank 1 → rank 2, transfer 0: tags differ", "send tag 99999", ncclRule}
		}},
		{name: "peer out of range", corrupt: func(t *testing.T, progs []*lower.Program) []string {
			p := progs[1]
			p.Instrs[transferAt(t, p, "send", 2, 0)].Peer = 7
			return []string{"rank 1: send tag", "has peer 7"}
		}},
		{name: "peer is itself", corrupt: func(t *testing.T, progs []*lower.Program) []string {
			p := progs[2]
			p.Instrs[transferAt(t, p, "recv", 1, 0)].Peer = 2
			return []string{"rank 2: recv tag", "has peer 2"}
		}},
		{name: "receive hoisted before the send it depends on", deadlock: true, corrupt: func(t *testing.T, progs []*lower.Program) []string {
			// Rank 0's first input gradient comes back only after its
			// first activation went out; waiting for it first is a cycle.
			p := progs[0]
			i := transferAt(t, p, "recv", 1, 0)
			in := p.Instrs[i]
			p.Instrs = slices.Insert(slices.Delete(p.Instrs, i, i+1), 0, in)
			return []string{"rank 0 waits for rank 1 at recv tag " + fmt.Sprint(in.Tag), "at instruction 0", in.Value.Where(),
				"rank 1 waits for rank 0", "wait cycle rank 0 → rank 1 → rank 0"}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			progs := cloneProgs(base)
			want := tc.corrupt(t, progs)
			err := lower.CheckTransfers(progs)
			require.ErrorIs(t, err, lower.ErrTransferOrder)
			assert.Equal(t, tc.deadlock, errors.Is(err, lower.ErrDeadlock), "deadlock sentinel: %v", err)
			for _, s := range want {
				assert.ErrorContains(t, err, s)
			}
		})
	}
}

// xfer is one instruction of a hand-made program: a send or recv of n
// bytes, or a local op when peer is -1.
type xfer struct {
	op        string
	peer, tag int
	bytes     int64
}

// handProgs builds programs from transfer lists; each transfer gets its
// own buffer of the given size.
func handProgs(ranks ...[]xfer) []*lower.Program {
	progs := make([]*lower.Program, len(ranks))
	for r, xs := range ranks {
		p := &lower.Program{Name: fmt.Sprintf("hand.pp%d", r), Buffers: make([]lower.Buffer, 0, len(xs)), Instrs: make([]lower.Instr, 0, len(xs))}
		for _, x := range xs {
			id := len(p.Buffers)
			p.Buffers = append(p.Buffers, lower.Buffer{ID: id, Bytes: x.bytes})
			in := lower.Instr{Op: x.op, Peer: x.peer, Tag: x.tag, Out: id}
			if x.op == "send" {
				in.Args, in.Out = []int{id}, -1
			}
			p.Instrs = append(p.Instrs, in)
		}
		progs[r] = p
	}
	return progs
}

func send(peer, tag int) xfer { return xfer{"send", peer, tag, 64} }
func recv(peer, tag int) xfer { return xfer{"recv", peer, tag, 64} }
func local() xfer             { return xfer{"add", -1, 0, 8} }

func TestCheckTransfersHandMade(t *testing.T) {
	for _, tc := range []struct {
		name    string
		progs   []*lower.Program
		wantErr error
		want    []string
	}{
		{name: "none", progs: nil},
		{name: "single program", progs: handProgs([]xfer{local(), local()})},
		{name: "no transfers", progs: handProgs([]xfer{local()}, []xfer{local(), local()}, nil)},
		{name: "both send first", progs: handProgs(
			[]xfer{send(1, 1), recv(1, 2)},
			[]xfer{send(0, 2), recv(0, 1)})},
		{name: "ring", progs: handProgs(
			[]xfer{send(1, 1), local(), recv(2, 3)},
			[]xfer{recv(0, 1), send(2, 2)},
			[]xfer{recv(1, 2), local(), send(0, 3)})},
		{name: "receive first while the peer sends first", progs: handProgs(
			[]xfer{recv(1, 1), local(), send(1, 2)},
			[]xfer{send(0, 1), recv(0, 2)})},
		{name: "both receive first", wantErr: lower.ErrDeadlock, progs: handProgs(
			[]xfer{recv(1, 2), send(1, 1)},
			[]xfer{recv(0, 1), send(0, 2)}),
			want: []string{"2 of 2 ranks", "rank 0 waits for rank 1 at recv tag 2 (64 B", "at instruction 0", "rank 1 waits for rank 0 at recv tag 1", "wait cycle rank 0 → rank 1 → rank 0"}},
		{name: "cycle of three behind a working pair", wantErr: lower.ErrDeadlock, progs: handProgs(
			[]xfer{send(3, 9), recv(2, 3), send(1, 1)},
			[]xfer{recv(0, 1), send(2, 2)},
			[]xfer{recv(1, 2), send(0, 3)},
			[]xfer{recv(0, 9), local()}),
			want: []string{"3 of 4 ranks", "rank 0 waits for rank 2 at recv tag 3 (64 B", "at instruction 1", "rank 2 waits for rank 1"}},
		{name: "size differs", wantErr: lower.ErrTransferOrder, progs: handProgs(
			[]xfer{{"send", 1, 5, 64}},
			[]xfer{{"recv", 0, 5, 32}}),
			want: []string{"rank 0 → rank 1, transfer 0: sizes differ: rank 0's send tag 5 (64 B", "rank 1's recv tag 5 (32 B", "at instruction 0", ncclRule}},
		{name: "receive from a rank that never sends", wantErr: lower.ErrTransferOrder, progs: handProgs(
			[]xfer{local()},
			[]xfer{recv(0, 4)}),
			want: []string{"rank 0 sends 0 values, rank 1 receives 1", "recv tag 4", "is never sent"}},
		{name: "send without a buffer", wantErr: lower.ErrTransferOrder, progs: []*lower.Program{
			{Instrs: []lower.Instr{{Op: "send", Peer: 1, Out: -1}}}, {}},
			want: []string{"rank 0: send tag 0 at instruction 0 names no buffer"}},
		{name: "missing program", wantErr: lower.ErrTransferOrder, progs: []*lower.Program{{}, nil},
			want: []string{"rank 1 has no program"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := lower.CheckTransfers(tc.progs)
			if tc.wantErr == nil {
				require.NoError(t, err)
				return
			}
			require.ErrorIs(t, err, tc.wantErr)
			require.ErrorIs(t, err, lower.ErrTransferOrder, "every transfer error is an order error")
			for _, s := range tc.want {
				assert.ErrorContains(t, err, s)
			}
		})
	}
}

// longPipeline is p ranks passing m values down a chain and m gradients
// back, GPipe-style: every rank receives, computes, sends. Rank r's first
// receive waits for a chain of r sends, so a check that rescans blocked
// ranks would be quadratic here.
func longPipeline(p, m int) []*lower.Program {
	ranks := make([][]xfer, p)
	for r := range p {
		for k := range m {
			if r > 0 {
				ranks[r] = append(ranks[r], recv(r-1, k))
			}
			ranks[r] = append(ranks[r], local())
			if r < p-1 {
				ranks[r] = append(ranks[r], send(r+1, k))
			}
		}
		for k := range m {
			if r < p-1 {
				ranks[r] = append(ranks[r], recv(r+1, m+k))
			}
			ranks[r] = append(ranks[r], local())
			if r > 0 {
				ranks[r] = append(ranks[r], send(r-1, m+k))
			}
		}
	}
	return handProgs(ranks...)
}

func TestCheckTransfersLongPipeline(t *testing.T) {
	progs := longPipeline(8, 4000)
	require.NoError(t, lower.CheckTransfers(progs))
	// Swapping the last two receives of the middle rank is still found.
	p := progs[4]
	n := len(p.Instrs)
	p.Instrs[n-3], p.Instrs[n-6] = p.Instrs[n-6], p.Instrs[n-3]
	assert.ErrorIs(t, lower.CheckTransfers(progs), lower.ErrTransferOrder)
}

func BenchmarkCheckTransfers(b *testing.B) {
	progs := longPipeline(16, 20000)
	b.ReportMetric(float64(countTransfers(progs)), "transfers")
	for b.Loop() {
		if err := lower.CheckTransfers(progs); err != nil {
			b.Fatal(err)
		}
	}
}

// The runtime matches transfers by tag, so every lowered pipeline passes
// CheckTransfersByTag, the ones whose ends list transfers in different
// orders included; and the corruptions that break a pipeline whatever the
// matching are still caught.
func TestCheckTransfersByTag(t *testing.T) {
	for _, c := range []pipeCase{
		{schedule: "1f1b", pp: 2, micro: 2, layers: 2},
		{schedule: "gpipe", pp: 2, micro: 2, layers: 2},
		{schedule: "zb", pp: 2, micro: 2, layers: 2},
		{schedule: "interleaved", pp: 2, vpp: 2, micro: 4, layers: 4},
		{schedule: "1f1b", pp: 4, micro: 4, layers: 4, dp: 2, zero: 3},
		{schedule: "1f1b", pp: 4, micro: 4, layers: 4, dp: 2, tp: 2},
	} {
		t.Run(c.String(), func(t *testing.T) {
			assert.NoError(t, lower.CheckTransfersByTag(compilePipe(t, c)))
		})
	}
	base := compilePipe(t, pipeCase{schedule: "1f1b", pp: 4, micro: 4, layers: 4})
	for _, tc := range []struct {
		name     string
		corrupt  func(t *testing.T, progs []*lower.Program) []string
		deadlock bool
	}{
		{name: "swapped receives pass", corrupt: func(t *testing.T, progs []*lower.Program) []string {
			p := progs[3]
			i, j := transferAt(t, p, "recv", 2, 0), transferAt(t, p, "recv", 2, 1)
			p.Instrs[i], p.Instrs[j] = p.Instrs[j], p.Instrs[i]
			return nil
		}},
		{name: "dropped send", corrupt: func(t *testing.T, progs []*lower.Program) []string {
			p := progs[2]
			i := transferAt(t, p, "send", 3, 1)
			dropped := p.Instrs[i]
			p.Instrs = slices.Delete(p.Instrs, i, i+1)
			return []string{"rank 2 → rank 3", fmt.Sprintf("receives tag %d 1 times, rank 2 sends it 0", dropped.Tag), "is never sent"}
		}},
		{name: "changed size", corrupt: func(t *testing.T, progs []*lower.Program) []string {
			p := progs[3]
			i := transferAt(t, p, "recv", 2, 2)
			p.Buffers[p.Instrs[i].Out].Bytes /= 2
			return []string{"rank 2 → rank 3, tag", "sizes differ"}
		}},
		{name: "receive hoisted before the send it depends on", deadlock: true, corrupt: func(t *testing.T, progs []*lower.Program) []string {
			p := progs[0]
			i := transferAt(t, p, "recv", 1, 0)
			in := p.Instrs[i]
			p.Instrs = slices.Insert(slices.Delete(p.Instrs, i, i+1), 0, in)
			return []string{"rank 0 waits for rank 1 at recv tag " + fmt.Sprint(in.Tag), "wait cycle rank 0 → rank 1 → rank 0"}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			progs := cloneProgs(base)
			want := tc.corrupt(t, progs)
			err := lower.CheckTransfersByTag(progs)
			if want == nil {
				assert.NoError(t, err)
				return
			}
			require.ErrorIs(t, err, lower.ErrTransferOrder)
			assert.Equal(t, tc.deadlock, errors.Is(err, lower.ErrDeadlock), "deadlock sentinel: %v", err)
			for _, s := range want {
				assert.ErrorContains(t, err, s)
			}
		})
	}
}
