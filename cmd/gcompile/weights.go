package main

import (
	"fmt"
	"strconv"

	"gcompile/ir"
	"gcompile/lower"
	"gcompile/runtime/checkpoint"
)

// weightStore is how checkpoints reach a backend's params: whole tensors
// in and out, split and assembled by the cluster (cpu.Cluster and
// cuda.Cluster alike).
type weightStore interface {
	Global(name string) ([]float64, error)
	SetGlobal(name string, x []float64) error
}

var safetensorsDType = map[ir.DType]string{ir.F32: "F32", ir.F64: "F64", ir.F16: "F16", ir.BF16: "BF16", ir.I32: "I32", ir.I64: "I64", ir.Bool: "BOOL"}

// saveWeights writes the params under their model names (HF GPT-2 names
// for the reference model), so other tools can read them.
func saveWeights(dev weightStore, prog *lower.Program, path string, step int) error {
	var ts []checkpoint.Tensor
	for _, b := range prog.Buffers {
		if b.Kind != lower.Param {
			continue
		}
		if b.Global.DType != ir.F32 {
			return fmt.Errorf("--save: param %q is %v; only f32 params are saved yet", b.Name, b.Global)
		}
		whole, err := dev.Global(b.Name)
		if err != nil {
			return err
		}
		x := make([]float32, len(whole))
		for i, v := range whole {
			x[i] = float32(v)
		}
		ts = append(ts, checkpoint.Tensor{Name: b.Name, DType: "F32", Shape: []int(b.Global.Shape.Clone()), Data: checkpoint.Float32Bytes(x)})
	}
	return checkpoint.Save(path, ts, map[string]string{"format": "pt", "producer": "gcompile", "step": strconv.Itoa(step)})
}

// loadWeights overwrites params from a safetensors file; every param of the
// model must be present with its exact dtype and shape.
func loadWeights(dev weightStore, prog *lower.Program, path string) error {
	ts, _, err := checkpoint.Load(path)
	if err != nil {
		return err
	}
	byName := map[string]checkpoint.Tensor{}
	for _, t := range ts {
		byName[t.Name] = t
	}
	for _, b := range prog.Buffers {
		if b.Kind != lower.Param {
			continue
		}
		t, ok := byName[b.Name]
		if !ok {
			return fmt.Errorf("--load %s: no tensor %q for param %s", path, b.Name, b.Value.Where())
		}
		if t.DType != safetensorsDType[b.Global.DType] || t.DType != "F32" || !ir.Shape(t.Shape).Equal(b.Global.Shape) {
			return fmt.Errorf("--load %s: tensor %q is %s%v, the model's param is %v", path, b.Name, t.DType, t.Shape, b.Global)
		}
		x := checkpoint.BytesFloat32(t.Data)
		whole := make([]float64, len(x))
		for i, v := range x {
			whole[i] = float64(v)
		}
		if err := dev.SetGlobal(b.Name, whole); err != nil {
			return err
		}
	}
	return nil
}
