package runtime

import "gcompile/lower"

// PeakMeter measures a device's peak memory the way the memory plan
// predicts it: persistent buffers once, each device temporary from its
// first write to its last use (Instr.Frees), offloaded (host) buffers not
// at all. Every backend counts with it, so a measured peak can be held
// against Program.PeakBytes and against another backend's.
type PeakMeter struct {
	prog *lower.Program
	// born[i]: instruction i is the first to write a device temporary, so
	// its bytes become live there (an offloaded param's device copy is
	// written again by its in-place update; that adds nothing).
	born       []bool
	live, high int64
}

// NewPeakMeter is a meter for runs of p's instructions.
func NewPeakMeter(p *lower.Program) PeakMeter {
	m := PeakMeter{prog: p, born: make([]bool, len(p.Instrs))}
	written := map[int]bool{}
	for i, in := range p.Instrs {
		if in.Out < 0 || written[in.Out] {
			continue
		}
		if b := p.Buffers[in.Out]; b.Kind == lower.Temp && !b.Host {
			m.born[i] = true
			written[in.Out] = true
		}
	}
	return m
}

// Start begins a run of the program from its first instruction (a step,
// or a forward): nothing temporary is live yet.
func (m *PeakMeter) Start() { m.live = 0 }

// Issue counts what instruction i brings to life, as it is issued.
func (m *PeakMeter) Issue(i int) {
	if m.born[i] {
		m.live += m.prog.Buffers[m.prog.Instrs[i].Out].Bytes
	}
	for _, b := range m.prog.Instrs[i].Scratch {
		m.live += m.prog.Buffers[b].Bytes
	}
	m.high = max(m.high, m.live)
}

// Retire drops the buffers instruction i was the last to use.
func (m *PeakMeter) Retire(i int) {
	for _, b := range m.prog.Instrs[i].Frees {
		m.live -= m.prog.Buffers[b].Bytes
	}
}

// PeakBytes is the high-water mark of live bytes over every run so far,
// persistent buffers included.
func (m *PeakMeter) PeakBytes() int64 { return m.prog.PersistentBytes + m.high }
