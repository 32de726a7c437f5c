package generate

import (
	"fmt"
	"sort"

	"gcompile/ir"
	"gcompile/lower"
	"gcompile/runtime"
)

// meshStepper runs one generation program on a backend's cluster.
type meshStepper[D runtime.Member] struct{ c *runtime.MeshCluster[D] }

func (s meshStepper[D]) SetInt32(name string, x []int32) error { return s.c.SetInt32(name, x) }
func (s meshStepper[D]) Step() error                           { return s.c.Step() }
func (s meshStepper[D]) Logits() ([]float64, error)            { return s.c.WholeOutput(ir.OutputLogits) }

// NewMeshEngine is the engine of a prefill and a decode program loaded on
// clusters of one backend, laid out alike (the same plan), with the
// weights in pre: it copies them into dec (ShareWeights), and the caches
// move from one to the other device by device.
func NewMeshEngine[D runtime.Member](pre, dec *runtime.MeshCluster[D], batch, prompt, context int) (*Engine, error) {
	if len(pre.Devices) == 0 || len(dec.Devices) == 0 {
		return nil, fmt.Errorf("generation needs its programs loaded on at least one device")
	}
	if err := ShareWeights(dec, pre); err != nil {
		return nil, err
	}
	id, ok := dec.Devices[0].Program().Outputs[ir.OutputLogits]
	if !ok {
		return nil, fmt.Errorf("the decode program has no %q output: it was not compiled for generation", ir.OutputLogits)
	}
	lt := dec.Devices[0].Program().Buffers[id].Global
	if lt.Rank() != 2 || lt.Shape[0] != batch {
		return nil, fmt.Errorf("the decode program's logits are %v, not [%d, vocab]", lt, batch)
	}
	caches := Sources(dec.Devices[0].Program(), lower.Buffer.KVCache)
	return &Engine{
		Prefill: meshStepper[D]{pre}, Decode: meshStepper[D]{dec},
		MoveCaches: func() error { return runtime.CopySources(dec, pre, caches) },
		Batch:      batch, Prompt: prompt, Context: context, Vocab: lt.Shape[1],
		LastToken:  hasSource(pre, ir.InputLastToken),
		RandomKeys: hasSource(pre, ir.InputRandomKey) || hasSource(dec, ir.InputRandomKey),
	}, nil
}

// ShareWeights copies every param of pre's devices into dec's.
func ShareWeights[D runtime.Member](dec, pre *runtime.MeshCluster[D]) error {
	return runtime.CopySources(dec, pre, Sources(pre.Devices[0].Program(), func(b lower.Buffer) bool { return b.Kind == lower.Param }))
}

// Sources are the names of p's sources that keep says to, sorted.
func Sources(p *lower.Program, keep func(lower.Buffer) bool) []string {
	var out []string
	for name, id := range p.Sources {
		if keep(p.Buffers[id]) {
			out = append(out, name)
		}
	}
	sort.Strings(out)
	return out
}

func hasSource[D runtime.Member](c *runtime.MeshCluster[D], name string) bool {
	_, ok := c.Devices[0].Program().Sources[name]
	return ok
}
