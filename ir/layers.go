package ir

import "fmt"

// CheckLayerMarks refuses layer marks (Meta.Layer, the frontend's
// b.Layer) that no pipeline could cut, whatever the plan: ids with a gap
// (the ids are layers 0..L−1, so b.Layer(2*i) makes a model of more
// layers than it has, and b.Layer(i+1<<40) one whose every layer is
// last), and an op of a layer that reads a later layer's value, or one
// computed after the layers (blocks marked in reverse, a block marked
// again after the next). Checked on one device too, the mistake is named
// where it is made, not first when the model is split over pp. A module
// that marks no layers passes.
func (m *Module) CheckLayerMarks() error {
	layers := 0
	marked := map[int]bool{}
	for _, x := range m.Values {
		layers = max(layers, x.Meta.Layer+1)
		if x.Meta.Layer >= 0 {
			marked[x.Meta.Layer] = true
		}
	}
	if len(marked) != layers {
		missing := 0
		for missing < layers && marked[missing] {
			missing++
		}
		last := ""
		for _, x := range m.Values {
			if x.Meta.Layer == layers-1 {
				last = x.Where()
				break
			}
		}
		return fmt.Errorf("the model marks layers up to %d (%s) but none %d: b.Layer(i) takes the block's index, counting from 0 without gaps (a pipeline cuts layers 0..L-1 by their ids)", layers-1, last, missing)
	}
	after := map[*Value]bool{} // values computed from the layers' outputs, outside every layer
	for _, x := range m.Values {
		if x.Meta.Layer < 0 {
			for _, a := range x.Args {
				if a.Meta.Layer >= 0 || after[a] {
					after[x] = true
				}
			}
			continue
		}
		for _, a := range x.Args {
			if a.Meta.Layer > x.Meta.Layer || after[a] {
				from := fmt.Sprintf("layer %d", a.Meta.Layer)
				if after[a] {
					from = "after the layers"
				}
				return fmt.Errorf("%s, marked layer %d, reads %s, marked %s: a layer's ops read the values of earlier layers only, so b.Layer(i) must follow the data flow (blocks in order, the head after the last)",
					x.Where(), x.Meta.Layer, a.Where(), from)
			}
		}
	}
	return nil
}
