package cuda

import (
	"fmt"

	"gcompile/lower"
	"gcompile/runtime/cuda/driver"
)

// Transfers: the lowering's copies (between device buffers, and to and
// from offloaded host buffers) and pipeline sends and receives. They move
// bytes of any dtype, so they never pass through the 16-bit emulation.
func init() {
	register((*compiler).copyInstr, "copy")
	register((*compiler).transfer, "send", "recv")
}

// copyInstr is the lowering's copy. Between device buffers it is a copy
// on the compute stream. From host to device (an offloaded buffer fetched
// for its use window) it runs on the copy stream, after the compute work
// queued before it, and the compute stream waits for it only where the
// copied buffer is first used, so a prefetch overlaps the layers before
// it. Back to the host it runs on the compute stream once earlier fetches
// are done (they may read the host bytes it writes).
func (c *compiler) copyInstr() (func() error, error) {
	src, dst := c.buf(c.in.Args[0]), c.buf(c.in.Out)
	if src.Bytes != dst.Bytes {
		return nil, fmt.Errorf("copy of %d bytes into %d", src.Bytes, dst.Bytes)
	}
	d := c.d
	switch {
	case !src.Host && !dst.Host:
		return c.deviceCopy(src, dst)
	case src.Host && !dst.Host:
		issue, err := d.event()
		if err != nil {
			return nil, err
		}
		done, err := d.event()
		if err != nil {
			return nil, err
		}
		d.fetches[c.index] = done
		c.note(fmt.Sprintf("copy %d bytes host→device on the copy stream", src.Bytes))
		return func() error {
			drv := d.rt.drv
			h, err := d.hostBytes(at(src), src.Bytes)
			if err != nil {
				return err
			}
			if err := drv.EventRecord(issue, d.compute); err != nil {
				return err
			}
			if err := drv.StreamWaitEvent(d.copies, issue); err != nil {
				return err
			}
			if err := drv.MemcpyHtoDAsync(d.ptr(at(dst)), h, d.copies); err != nil {
				return err
			}
			return drv.EventRecord(done, d.copies)
		}, nil
	case !src.Host && dst.Host:
		d.hostWrites[c.index] = true
		c.note(fmt.Sprintf("copy %d bytes device→host", src.Bytes))
		return func() error {
			h, err := d.hostBytes(at(dst), dst.Bytes)
			if err != nil {
				return err
			}
			return d.rt.drv.MemcpyDtoHAsync(h, d.ptr(at(src)), d.compute)
		}, nil
	}
	d.hostWrites[c.index] = true
	c.note(fmt.Sprintf("copy %d bytes host→host", src.Bytes))
	return func() error {
		if err := d.rt.drv.StreamSynchronize(d.compute); err != nil {
			return err
		}
		host := d.mem.host.Bytes()
		copy(host[dst.Offset:dst.Offset+dst.Bytes], host[src.Offset:src.Offset+src.Bytes])
		return nil
	}, nil
}

// deviceCopy copies one device buffer over another on the compute stream.
func (c *compiler) deviceCopy(src, dst lower.Buffer) (func() error, error) {
	if src.Host || dst.Host {
		return nil, fmt.Errorf("%s → %s: a host buffer moves only by copy", bufferName(src), bufferName(dst))
	}
	d := c.d
	c.note(fmt.Sprintf("copy %d bytes device→device", src.Bytes))
	if src.Bytes == 0 || src.Offset == dst.Offset {
		return func() error { return nil }, nil
	}
	return func() error {
		return d.rt.drv.MemcpyDtoDAsync(d.ptr(at(dst)), d.ptr(at(src)), uint64(src.Bytes), d.compute)
	}, nil
}

// planCopyWaits decides, once at load, where the compute stream waits
// for host-to-device copies: before the first instruction that uses the
// copied buffer (as an argument, its result or a buffer its closure
// touches), after the one that frees it unused, and before any
// instruction that writes host memory a pending copy may still read.
func (d *Device) planCopyWaits() {
	n := len(d.prog.Instrs)
	d.waitBefore = make([][]driver.Event, n)
	d.waitAfter = make([][]driver.Event, n)
	pending := map[int]driver.Event{}
	var last driver.Event
	outstanding := false
	for i, in := range d.prog.Instrs {
		if d.hostWrites[i] && outstanding {
			// The copy stream runs in order: its latest copy done means
			// all are.
			d.waitBefore[i] = append(d.waitBefore[i], last)
			clear(pending)
			outstanding = false
		}
		ids := append(in.Args[:len(in.Args):len(in.Args)], d.touches[i]...)
		if in.Out >= 0 {
			ids = append(ids, in.Out)
		}
		for _, id := range ids {
			if e, ok := pending[id]; ok {
				d.waitBefore[i] = append(d.waitBefore[i], e)
				delete(pending, id)
			}
		}
		if e, ok := d.fetches[i]; ok {
			pending[in.Out], last, outstanding = e, e, true
		}
		for _, id := range in.Frees {
			if e, ok := pending[id]; ok {
				d.waitAfter[i] = append(d.waitAfter[i], e)
				delete(pending, id)
			}
		}
	}
}

// transfer is a pipeline send or receive: to or from the device with the
// same data- and tensor-parallel coordinates on the peer pipeline rank.
// Sends never wait for their receiver (they are staged, like the CPU
// backend's comm), which is what keeps a schedule the simulator proved
// deadlock-free free of deadlocks here too.
func (c *compiler) transfer() (func() error, error) {
	in, d := c.in, c.d
	m := d.prog.Mesh
	ax := m.PipelineAxis()
	if ax < 0 || d.comm == nil {
		return nil, fmt.Errorf("%s needs a pipeline (a pp mesh axis and a cluster)", in.Op)
	}
	coords := append([]int(nil), d.coords...)
	coords[ax] = in.Peer
	peer, tag := m.Rank(coords), in.Tag
	if in.Op == "send" {
		b := c.buf(in.Args[0])
		if b.Host {
			return nil, fmt.Errorf("%s is offloaded to host memory; pipeline transfers send device buffers", bufferName(b))
		}
		t, err := d.comm.prepareSend(d, peer, b.Bytes)
		if err != nil {
			return nil, err
		}
		c.note(fmt.Sprintf("send %d bytes to device %d (tag %d)", b.Bytes, peer, tag))
		return func() error { return d.comm.send(d, t, peer, tag, d.ptr(at(b)), b.Bytes) }, nil
	}
	b := c.buf(in.Out)
	if b.Host {
		return nil, fmt.Errorf("%s is offloaded to host memory; pipeline transfers receive into device buffers", bufferName(b))
	}
	if err := d.comm.prepareRecv(d, peer, tag, b.Bytes); err != nil {
		return nil, err
	}
	c.note(fmt.Sprintf("receive %d bytes from device %d (tag %d)", b.Bytes, peer, tag))
	return func() error { return d.comm.recv(d, peer, tag, d.ptr(at(b)), b.Bytes) }, nil
}
