package cpu

import (
	"fmt"

	"gcompile/lower"
)

// Ops that move a buffer's bytes as they are, whatever its dtype (16-bit
// buffers included, so nothing is widened around them): copies between
// the arena and the host (offload) and pipeline transfers between ranks.
func init() {
	builtin(Kernel{raw: compileCopy}, "copy")
	builtin(Kernel{raw: compileTransfer}, "send", "recv")
}

func compileCopy(d *Device, in lower.Instr) (func() error, error) {
	src, dst := d.raw(d.prog.Buffers[in.Args[0]]), d.raw(d.prog.Buffers[in.Out])
	return func() error { copy(dst, src); return nil }, nil
}

// compileTransfer moves a value between pipeline ranks: to the device with
// the same data- and tensor-parallel coordinates on the peer rank. Sends
// are buffered (Comm.Send returns at once), as the schedule's deadlock
// proof assumes.
func compileTransfer(d *Device, in lower.Instr) (func() error, error) {
	m := d.prog.Mesh
	ax := m.PipelineAxis()
	if ax < 0 || d.comm == nil {
		return nil, fmt.Errorf("%s needs a pipeline (a pp mesh axis and a comm)", in.Op)
	}
	c := append([]int(nil), d.coords...)
	c[ax] = in.Peer
	peer, comm, rank, tag := m.Rank(c), d.comm, d.rank, in.Tag
	if in.Op == "send" {
		b := d.prog.Buffers[in.Args[0]]
		data, dt := d.raw(b), b.Type.DType
		return func() error { return comm.Send(rank, peer, tag, dt, data) }, nil
	}
	b := d.prog.Buffers[in.Out]
	data, dt := d.raw(b), b.Type.DType
	return func() error { return comm.Recv(peer, rank, tag, dt, data) }, nil
}
