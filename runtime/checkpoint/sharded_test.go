package checkpoint

import (
	"encoding/json"
	"fmt"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"gcompile/lower"
	"gcompile/runtime"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Cutting a tensor into the boxes of a grid and putting them back gives
// the tensor, for every rank and element size; a box is the sub-array
// at its corner.
func TestCopyBoxRoundTrips(t *testing.T) {
	for _, tc := range []struct {
		shape, parts []int
		es           int
	}{
		{nil, nil, 4},
		{[]int{12}, []int{3}, 2},
		{[]int{4, 6}, []int{2, 3}, 4},
		{[]int{2, 3, 4}, []int{1, 3, 2}, 8},
		{[]int{4, 3, 2, 6}, []int{2, 1, 2, 3}, 1},
	} {
		n := 1
		for _, d := range tc.shape {
			n *= d
		}
		x := make([]byte, n*tc.es)
		for i := range x {
			x[i] = byte(i*7 + 3)
		}
		back := make([]byte, len(x))
		size := make([]int, len(tc.shape))
		for d := range size {
			size[d] = tc.shape[d] / tc.parts[d]
		}
		cells := 1
		for _, p := range tc.parts {
			cells *= p
		}
		for c := range cells {
			lo := make([]int, len(tc.shape))
			rest := c
			for d := len(tc.shape) - 1; d >= 0; d-- {
				lo[d] = rest % tc.parts[d] * size[d]
				rest /= tc.parts[d]
			}
			m := 1
			for _, s := range size {
				m *= s
			}
			blk := make([]byte, m*tc.es)
			copyBox(x, tc.es, tc.shape, lo, size, blk, false)
			if len(tc.shape) > 0 {
				// The box's first element is the array's at the corner.
				off := 0
				for d := range tc.shape {
					off = off*tc.shape[d] + lo[d]
				}
				assert.Equal(t, x[off*tc.es:(off+1)*tc.es], blk[:tc.es], "%v at %v", tc.shape, lo)
			}
			copyBox(back, tc.es, tc.shape, lo, size, blk, true)
		}
		assert.Equal(t, x, back, "%v in %v parts", tc.shape, tc.parts)
	}
}

// validManifest is a checkpoint of one tensor of 4×6 f32 in two blocks.
func validManifest() *Manifest {
	return &Manifest{Format: Format, Version: ManifestVersion,
		Files: map[string]Sum{"rank-00000.safetensors": {}, "rank-00001.safetensors": {}},
		Tensors: map[string]*TensorBlocks{"w": {Kind: "param", DType: "F32", Shape: []int{4, 6}, View: []int{4, 6}, Blocks: []Block{
			{File: "rank-00000.safetensors", Lo: []int{0, 0}, Size: []int{4, 3}},
			{File: "rank-00001.safetensors", Lo: []int{0, 3}, Size: []int{4, 3}},
		}}}}
}

// A manifest whose blocks do not make the tensor whole is refused,
// naming the tensor and what is wrong.
func TestManifestMustDescribeWholeTensors(t *testing.T) {
	require.NoError(t, checkManifest(validManifest()))
	for _, tc := range []struct {
		name   string
		break_ func(m *Manifest)
		want   string
	}{
		{"a block is missing", func(m *Manifest) { m.Tensors["w"].Blocks = m.Tensors["w"].Blocks[:1] }, "hold 12 of its 24 elements"},
		{"a block twice", func(m *Manifest) { m.Tensors["w"].Blocks[1].Lo = []int{0, 0} }, "two blocks at [0 0]"},
		{"a block outside", func(m *Manifest) { m.Tensors["w"].Blocks[1].Lo = []int{0, 4} }, "lies outside [4 6]"},
		{"a size that overflows past the view", func(m *Manifest) { m.Tensors["w"].Blocks[1].Size = []int{4, math.MaxInt} }, "lies outside [4 6]"},
		{"overlapping blocks", func(m *Manifest) { m.Tensors["w"].Blocks[1].Lo = []int{0, 1} },
			"the block at [0 0] of size [4 3] in rank-00000.safetensors overlaps the block at [0 1] of size [4 3] in rank-00001.safetensors"},
		{"an unlisted file", func(m *Manifest) { delete(m.Files, "rank-00001.safetensors") }, `block in "rank-00001.safetensors", which the manifest does not list`},
		{"a view of another size", func(m *Manifest) { m.Tensors["w"].View = []int{4, 7} }, "view [4 7] does not hold shape [4 6]"},
		{"an unknown dtype", func(m *Manifest) { m.Tensors["w"].DType = "F8" }, `dtype "F8"`},
		{"a negative dim", func(m *Manifest) { m.Tensors["w"].Shape = []int{-4, -6} }, "dimension -4"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := validManifest()
			tc.break_(m)
			err := checkManifest(m)
			require.ErrorIs(t, err, ErrCorrupt)
			assert.ErrorContains(t, err, `tensor "w"`)
			assert.ErrorContains(t, err, tc.want)
		})
	}
	// A vocabulary table's classes must be rows of a param of rank 2.
	for rows, want := range map[int]string{-1: "gives \"w\" -1 classes; its table has 4 rows", 0: "gives \"w\" 0 classes", 5: "gives \"w\" 5 classes"} {
		m := validManifest()
		m.Plan.VocabTables = map[string]int{"w": rows}
		err := checkManifest(m)
		require.ErrorIs(t, err, ErrCorrupt, "%d rows", rows)
		assert.ErrorContains(t, err, want)
	}
	m := validManifest()
	m.Plan.VocabTables = map[string]int{"w": 3}
	require.NoError(t, checkManifest(m))
	m.Plan.VocabTables = map[string]int{"wte.weight": 3}
	assert.ErrorContains(t, checkManifest(m), `plan.vocab_tables names "wte.weight", which is not a param of rank 2 in it`)
	// A file too small for the blocks the manifest places in it.
	m = validManifest()
	m.Files["rank-00000.safetensors"] = Sum{Bytes: 40}
	err := checkManifest(m)
	require.ErrorIs(t, err, ErrCorrupt)
	assert.ErrorContains(t, err, `lists file "rank-00000.safetensors" of 40 bytes, but the blocks in it hold 48`)
}

// A manifest naming a tensor of 2⁴⁰ elements with no file behind it is
// refused as corrupt before the tensor's bytes are allocated: export
// died allocating 4 TiB ("fatal error: out of memory").
func TestConsolidateChecksBlocksBeforeAllocating(t *testing.T) {
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, ManifestName), []byte(`{"format":"gcompile-checkpoint","version":1,"model":"m","plan":{"precision":"fp32","optimizer":"adamw","batch":1,"seq":1},"state":{"step":1,"opt_step":1,"seed":1},"files":{"f":{}},`+
		`"tensors":{"w":{"kind":"param","dtype":"F32","shape":[1099511627776],"view":[1099511627776],"blocks":[{"file":"f","lo":[0],"size":[1099511627776]}]}}}`), 0o644))
	_, _, err := Consolidate(dir, lower.Param)
	require.ErrorIs(t, err, ErrCorrupt)
	assert.ErrorContains(t, err, "is missing")
}

// Find takes a checkpoint folder or the newest complete one under a
// root, never a partial one.
func TestFindSkipsPartialCheckpoints(t *testing.T) {
	root := t.TempDir()
	_, err := Find(root)
	require.ErrorIs(t, err, ErrNoCheckpoint)
	for _, d := range []string{"step-00000002", "step-00000004", "step-00000006.partial", "step-00000008"} {
		require.NoError(t, os.MkdirAll(filepath.Join(root, d), 0o755))
	}
	raw, err := json.Marshal(validManifest())
	require.NoError(t, err)
	for _, d := range []string{"step-00000002", "step-00000004", "step-00000006.partial"} {
		require.NoError(t, os.WriteFile(filepath.Join(root, d, ManifestName), raw, 0o644))
	}
	_, err = Find(root)
	require.ErrorIs(t, err, ErrUnrecognised, "step 8 has no manifest: the newest step is not passed over in silence")
	assert.ErrorContains(t, err, StepDir(root, 8)+" has no manifest.json (it is empty)")
	require.NoError(t, os.Remove(StepDir(root, 8)))
	got, err := Find(root)
	require.NoError(t, err)
	assert.Equal(t, StepDir(root, 4), got, "step 6 is partial")
	got, err = Find(StepDir(root, 2))
	require.NoError(t, err)
	assert.Equal(t, StepDir(root, 2), got)
	// A weights file is not a checkpoint: the flag that loads it is named.
	weights := filepath.Join(root, "w.safetensors")
	require.NoError(t, os.WriteFile(weights, []byte("{}"), 0o644))
	_, err = Find(weights)
	assert.ErrorContains(t, err, "checkpoint "+weights+" is a file; name a checkpoint folder or the --checkpoint-dir that holds them (weights such a file holds load with --load)")
}

// A step folder is found under any zero padding; a checkpoint that does
// not exist is an fs.ErrNotExist that lists the complete ones beside it,
// newest first, five at most.
func TestFindStepByNumber(t *testing.T) {
	dir := t.TempDir()
	root := filepath.Join(dir, "ck")
	raw, err := json.Marshal(validManifest())
	require.NoError(t, err)
	for s := 10; s <= 70; s += 10 {
		require.NoError(t, os.MkdirAll(StepDir(root, s), 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(StepDir(root, s), ManifestName), raw, 0o644))
	}
	require.NoError(t, os.MkdirAll(StepDir(root, 80)+partialSuffix, 0o755))
	require.NoError(t, os.MkdirAll(filepath.Join(dir, "empty"), 0o755))
	newest := strings.Join([]string{StepDir(root, 70), StepDir(root, 60), StepDir(root, 50), StepDir(root, 40), StepDir(root, 30), "2 older"}, ", ")
	tests := []struct {
		name, path string
		want       string // the folder found; "" for an error
		errHas     []string
	}{
		{"no padding", filepath.Join(root, "step-20"), StepDir(root, 20), nil},
		{"other padding", filepath.Join(root, "step-0020"), StepDir(root, 20), nil},
		{"the folder's own name", StepDir(root, 30), StepDir(root, 30), nil},
		{"the root", root, StepDir(root, 70), nil},
		{"a step never saved", filepath.Join(root, "step-25"), "", []string{
			"checkpoint " + filepath.Join(root, "step-25") + " does not exist", root + " holds " + newest + " (newest first)", "or " + root + " for the newest"}},
		{"a partial save", filepath.Join(root, "step-80"), "", []string{"the checkpoint of step 80 is incomplete", StepDir(root, 80) + partialSuffix, newest}},
		{"not a step name", filepath.Join(root, "latest"), "", []string{"checkpoint " + filepath.Join(root, "latest") + " does not exist", newest}},
		{"signed step", filepath.Join(root, "step-+20"), "", []string{"does not exist", newest}},
		{"an empty root", filepath.Join(dir, "empty", "step-3"), "", []string{"and " + filepath.Join(dir, "empty") + " holds no complete checkpoint"}},
		{"a missing root", filepath.Join(dir, "nope", "step-3"), "", []string{"checkpoint " + filepath.Join(dir, "nope", "step-3") + ": stat", "no such file or directory"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Find(tc.path)
			if tc.want != "" {
				require.NoError(t, err)
				assert.Equal(t, tc.want, got)
				return
			}
			require.Error(t, err)
			assert.ErrorIs(t, err, fs.ErrNotExist)
			for _, w := range tc.errHas {
				assert.ErrorContains(t, err, w)
			}
		})
	}
}

// Above the shard size tensors go to Hugging Face shards with an index,
// which LoadIndexed reads back whole; an index naming a file elsewhere is
// refused.
func TestShardedFilesAndIndex(t *testing.T) {
	dir := t.TempDir()
	var ts []Tensor
	for _, name := range []string{"a", "b", "c", "d"} {
		ts = append(ts, Tensor{Name: name, DType: "F32", Shape: []int{4}, Data: Float32Bytes([]float32{1, 2, 3, float32(len(name))})})
	}
	files, err := SaveSharded(filepath.Join(dir, "model.safetensors"), ts, nil, 40)
	require.NoError(t, err)
	assert.Equal(t, []string{"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors", "model.safetensors.index.json"},
		func() []string {
			var out []string
			for _, f := range files {
				out = append(out, filepath.Base(f))
			}
			return out
		}())
	back, err := LoadIndexed(filepath.Join(dir, "model.safetensors.index.json"))
	require.NoError(t, err)
	slices.SortFunc(back, func(a, b Tensor) int { return strings.Compare(a.Name, b.Name) })
	assert.Equal(t, ts, back)

	bad := filepath.Join(dir, "bad.index.json")
	require.NoError(t, os.WriteFile(bad, []byte(`{"weight_map": {"a": "../model-00001-of-00002.safetensors"}}`), 0o644))
	_, err = LoadIndexed(bad)
	assert.ErrorContains(t, err, "outside its folder")

	// A shard the index lists that is not there is named as such; a
	// tensor the index places in a shard that does not hold it is left to
	// the caller (published indexes hold such entries).
	require.NoError(t, os.WriteFile(bad, []byte(`{"weight_map": {"a": "model-00003-of-00003.safetensors"}}`), 0o644))
	_, err = LoadIndexed(bad)
	assert.ErrorContains(t, err, bad+" lists the shard model-00003-of-00003.safetensors, which is not beside it")
	idx, err := os.ReadFile(filepath.Join(dir, "model.safetensors.index.json"))
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(bad, []byte(strings.Replace(string(idx), `"weight_map": {`, `"weight_map": {"mtp.fc.weight": "model-00001-of-00002.safetensors", `, 1)), 0o644))
	back, err = LoadIndexed(bad)
	require.NoError(t, err)
	assert.Len(t, back, len(ts))
	// A tensor a shard holds that the index leaves out is said so.
	var index struct {
		WeightMap map[string]string `json:"weight_map"`
	}
	require.NoError(t, json.Unmarshal(idx, &index))
	left := ts[0].Name
	delete(index.WeightMap, left)
	raw, err := json.Marshal(index)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(bad, raw, 0o644))
	_, err = LoadIndexed(bad)
	assert.ErrorContains(t, err, fmt.Sprintf("holds %q, which %s does not list", left, bad))
}

// Every cell of a grid moved by one along any dim onto its neighbour is
// an overlap, whichever dim the check sweeps; the grid itself is not.
func TestOverlapFindsAnyMovedCell(t *testing.T) {
	parts, size := []int{3, 4, 2}, []int{2, 3, 5}
	var grid []Block
	for i := range parts[0] {
		for j := range parts[1] {
			for k := range parts[2] {
				grid = append(grid, Block{Lo: []int{i * size[0], j * size[1], k * size[2]}, Size: slices.Clone(size)})
			}
		}
	}
	_, _, ok := overlap(grid)
	require.False(t, ok, "a grid's cells share no element")
	for c := range grid {
		for d := range parts {
			for _, by := range []int{-1, 1} {
				moved := slices.Clone(grid)
				moved[c] = Block{Lo: slices.Clone(grid[c].Lo), Size: size}
				moved[c].Lo[d] += by
				if moved[c].Lo[d] < 0 || moved[c].Lo[d]+size[d] > parts[d]*size[d] {
					continue
				}
				i, j, ok := overlap(moved)
				require.True(t, ok, "cell %d moved by %d along dim %d", c, by, d)
				assert.True(t, i == c || j == c, "cell %d moved: the overlap found is %d and %d", c, i, j)
			}
		}
	}
	// Empty blocks hold no element to share; scalars' blocks always do.
	_, _, ok = overlap([]Block{{Lo: []int{0, 0}, Size: []int{0, 3}}, {Lo: []int{0, 0}, Size: []int{4, 3}}})
	assert.False(t, ok)
	_, _, ok = overlap([]Block{{Lo: []int{}, Size: []int{}}, {Lo: []int{}, Size: []int{}}})
	assert.True(t, ok)
}

// writeBlocks writes validManifest's checkpoint into dir: tensor w's two
// blocks, each in its shard with metadata as SaveState writes it (legacy:
// as shards written before they recorded where their blocks lie), and
// returns w's elements.
func writeBlocks(t *testing.T, dir string, legacy bool) []float32 {
	t.Helper()
	m := validManifest()
	w := make([]float32, 24)
	for i := range w {
		w[i] = float32(i)
	}
	whole := Float32Bytes(w)
	for r, b := range m.Tensors["w"].Blocks {
		blk := make([]byte, 4*3*4)
		copyBox(whole, 4, m.Tensors["w"].View, b.Lo, b.Size, blk, false)
		meta := map[string]string{"format": Format, "rank": fmt.Sprint(r)}
		if !legacy {
			meta[blockKey+"w"] = blockPlace(b.Lo, b.Size)
		}
		sum, err := save(filepath.Join(dir, b.File), []Tensor{{Name: "w", DType: "F32", Shape: []int{4, 3}, Data: blk}}, meta)
		require.NoError(t, err)
		m.Files[b.File] = sum
	}
	require.NoError(t, writeJSON(filepath.Join(dir, ManifestName), m))
	return w
}

// editManifest rewrites the manifest in dir, with the checksum of the
// edited manifest: what the checks after the checksum's see.
func editManifest(t *testing.T, dir string, edit func(m *Manifest)) {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(dir, ManifestName))
	require.NoError(t, err)
	var m Manifest
	require.NoError(t, json.Unmarshal(raw, &m))
	edit(&m)
	require.NoError(t, m.seal())
	require.NoError(t, writeJSON(filepath.Join(dir, ManifestName), m))
}

// Two blocks of the same size whose corners or files are swapped in the
// manifest keep every count and checksum; the place each shard records
// of its block refuses them, where inspect verifies and where a load
// reads. Shards that record no place still load.
func TestShardsRecordWhereTheirBlocksLie(t *testing.T) {
	for _, tc := range []struct {
		name string
		edit func(m *Manifest)
	}{
		{"corners swapped", func(m *Manifest) {
			b := m.Tensors["w"].Blocks
			b[0].Lo, b[1].Lo = b[1].Lo, b[0].Lo
		}},
		{"files swapped", func(m *Manifest) {
			b := m.Tensors["w"].Blocks
			b[0].File, b[1].File = b[1].File, b[0].File
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			w := writeBlocks(t, dir, false)
			m, err := ReadManifest(dir)
			require.NoError(t, err)
			require.NoError(t, Verify(dir, m))
			_, ts, err := Consolidate(dir, lower.Param)
			require.NoError(t, err)
			require.Len(t, ts, 1)
			assert.Equal(t, Float32Bytes(w), ts[0].Data)

			editManifest(t, dir, tc.edit)
			m, err = ReadManifest(dir)
			require.NoError(t, err, "the edited manifest still describes whole tensors")
			err = Verify(dir, m)
			require.ErrorIs(t, err, ErrCorrupt)
			assert.ErrorContains(t, err, `holds tensor "w"'s block at [0 3] of size [4 3], the manifest places it at [0 0]`)
			_, _, err = Consolidate(dir, lower.Param)
			require.ErrorIs(t, err, ErrCorrupt)
			assert.ErrorContains(t, err, `tensor "w"'s block at`)

			legacy := t.TempDir()
			w = writeBlocks(t, legacy, true)
			m, err = ReadManifest(legacy)
			require.NoError(t, err)
			require.NoError(t, Verify(legacy, m), "a checkpoint written before shards recorded their blocks' places")
			_, ts, err = Consolidate(legacy, lower.Param)
			require.NoError(t, err)
			assert.Equal(t, Float32Bytes(w), ts[0].Data)
		})
	}
}

// completeCheckpoint writes validManifest's checkpoint into dir.
func completeCheckpoint(t *testing.T, dir string) {
	t.Helper()
	require.NoError(t, os.MkdirAll(dir, 0o755))
	writeBlocks(t, dir, false)
}

// An entry named like a step's checkpoint that gcompile did not complete
// (a folder without a manifest, a link, a file, a checkpoint under
// another name than StepDir's) is listed as such, and a newer one than
// the newest checkpoint stops Find from taking an older step in silence.
func TestListReportsStepFoldersItDidNotComplete(t *testing.T) {
	root := t.TempDir()
	elsewhere := filepath.Join(t.TempDir(), "other-run", "step-00000006")
	completeCheckpoint(t, elsewhere)
	completeCheckpoint(t, StepDir(root, 2))
	completeCheckpoint(t, filepath.Join(root, "step-9"))
	require.NoError(t, os.MkdirAll(StepDir(root, 4), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(StepDir(root, 4), "user-notes.txt"), []byte("mine"), 0o644))
	require.NoError(t, os.Symlink(elsewhere, StepDir(root, 6)))
	require.NoError(t, os.WriteFile(StepDir(root, 7), nil, 0o644))
	require.NoError(t, os.MkdirAll(StepDir(root, 10)+partialSuffix, 0o755))
	require.NoError(t, os.MkdirAll(filepath.Join(root, "step-notes"), 0o755))

	l, err := List(root)
	require.NoError(t, err)
	assert.Equal(t, []int{2}, l.Steps)
	assert.Equal(t, []Unrecognised{
		{4, StepDir(root, 4), "has no manifest.json (it holds user-notes.txt)"},
		{6, StepDir(root, 6), "is a symbolic link (to " + elsewhere + ")"},
		{7, StepDir(root, 7), "is not a folder"},
		{9, filepath.Join(root, "step-9"), "is a checkpoint, but not named step-00000009 as gcompile names step 9's"},
	}, l.Unrecognised)
	steps, err := Steps(root)
	require.NoError(t, err)
	assert.Equal(t, []int{2}, steps)

	_, err = Find(root)
	require.ErrorIs(t, err, ErrUnrecognised)
	for _, u := range l.Unrecognised {
		assert.ErrorContains(t, err, u.String())
	}
	assert.ErrorContains(t, err, "its newest complete checkpoint is "+StepDir(root, 2))
	got, err := Find(StepDir(root, 2))
	require.NoError(t, err, "a checkpoint named is taken")
	assert.Equal(t, StepDir(root, 2), got)
	_, err = Find(filepath.Join(root, "step-4"))
	require.ErrorIs(t, err, fs.ErrNotExist)
	assert.ErrorContains(t, err, "there is no checkpoint of step 4 ("+StepDir(root, 4)+" has no manifest.json")

	// Older ones are listed but do not stop Find.
	completeCheckpoint(t, StepDir(root, 12))
	got, err = Find(root)
	require.NoError(t, err)
	assert.Equal(t, StepDir(root, 12), got)

	only := t.TempDir()
	require.NoError(t, os.MkdirAll(StepDir(only, 4), 0o755))
	_, err = Find(only)
	require.ErrorIs(t, err, ErrNoCheckpoint)
	require.ErrorIs(t, err, ErrUnrecognised)
	assert.ErrorContains(t, err, StepDir(only, 4)+" has no manifest.json (it is empty)")
}

// stagePart writes a save's partial folder for step under root, as every
// process's part leaves it before the commit, and returns it and the part.
func stagePart(t *testing.T, root string, step int) (string, part) {
	t.Helper()
	tmp := StepDir(root, step) + partialSuffix
	require.NoError(t, prepare(root, tmp))
	writeBlocks(t, tmp, false)
	m, err := ReadManifest(tmp)
	require.NoError(t, err)
	require.NoError(t, os.Remove(filepath.Join(tmp, ManifestName)))
	return tmp, part{Files: m.Files, Tensors: m.Tensors}
}

// A save replaces the checkpoint of its step, but refuses, before any
// shard is written and again at the commit, to remove anything else in
// its place: a user's folder, a link, a file. --keep-last prunes only
// checkpoints.
func TestSaveReplacesOnlyCheckpoints(t *testing.T) {
	root := t.TempDir()
	opts := SaveOptions{Root: root, KeepLast: 2}
	for _, step := range []int{2, 4} {
		opts.State.Step = step
		tmp, mine := stagePart(t, root, step)
		require.NoError(t, commit(nil, opts, tmp, StepDir(root, step), mine, 1))
	}
	// The same step again (a resumed run) replaces it.
	opts.State.Step = 4
	tmp, mine := stagePart(t, root, 4)
	require.NoError(t, commit(nil, opts, tmp, StepDir(root, 4), mine, 1))
	m, err := ReadManifest(StepDir(root, 4))
	require.NoError(t, err)
	assert.Equal(t, 4, m.State.Step)

	elsewhere := filepath.Join(t.TempDir(), "step-00000008")
	completeCheckpoint(t, elsewhere)
	notes := filepath.Join(StepDir(root, 6), "user-notes.txt")
	require.NoError(t, os.MkdirAll(StepDir(root, 6), 0o755))
	require.NoError(t, os.WriteFile(notes, []byte("mine"), 0o644))
	require.NoError(t, os.Symlink(elsewhere, StepDir(root, 8)))
	require.NoError(t, os.WriteFile(StepDir(root, 10), []byte("mine"), 0o644))
	for _, tc := range []struct {
		step int
		why  string
	}{
		{6, "has no manifest.json (it holds user-notes.txt)"},
		{8, "is a symbolic link (to " + elsewhere + ")"},
		{10, "is not a folder"},
	} {
		final := StepDir(root, tc.step)
		err := prepare(root, final+partialSuffix)
		require.ErrorIs(t, err, ErrUnrecognised)
		assert.ErrorContains(t, err, final+" "+tc.why+": a save replaces only a checkpoint gcompile completed; move it out of "+root)
		assert.NoDirExists(t, final+partialSuffix, "refused before any shard is written")

		// Put in place while the save was writing its shards.
		opts.State.Step = tc.step
		tmp, mine := stagePart(t, root, 12)
		err = commit(nil, opts, tmp, final, mine, 1)
		require.ErrorIs(t, err, ErrUnrecognised)
		assert.ErrorContains(t, err, final+" "+tc.why)
	}
	raw, err := os.ReadFile(notes)
	require.NoError(t, err)
	assert.Equal(t, "mine", string(raw))
	target, err := os.Readlink(StepDir(root, 8))
	require.NoError(t, err)
	assert.Equal(t, elsewhere, target)
	assert.FileExists(t, filepath.Join(elsewhere, ManifestName))
	assert.FileExists(t, StepDir(root, 10))

	// --keep-last 2 keeps the two newest checkpoints and nothing else goes.
	opts.State.Step = 12
	tmp, mine = stagePart(t, root, 12)
	require.NoError(t, commit(nil, opts, tmp, StepDir(root, 12), mine, 1))
	l, err := List(root)
	require.NoError(t, err)
	assert.Equal(t, []int{4, 12}, l.Steps)
	assert.Len(t, l.Unrecognised, 3)
	entries, err := os.ReadDir(root)
	require.NoError(t, err)
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	assert.Equal(t, []string{"step-00000004", "step-00000006", "step-00000008", "step-00000010", "step-00000012"}, names, "no .partial folder is left")
}

// A manifest whose state no run reaches, or that lists a file no block
// uses, is refused where it is read, naming it, so inspect, resume and
// export agree.
func TestManifestStateAndFilesAreChecked(t *testing.T) {
	assert.ErrorContains(t, checkState(runtime.State{LossScale: &runtime.ScalerState{Scale: math.Inf(1)}}), "loss scale +Inf", "JSON holds no infinity; a caller's state may")
	for _, tc := range []struct {
		name   string
		break_ func(m *Manifest)
		want   string
	}{
		{"a negative step", func(m *Manifest) { m.State.Step = -1 }, "state: step -1, optimizer step 3, 16 samples: none may be negative"},
		{"negative samples", func(m *Manifest) { m.State.Samples = -4 }, "none may be negative"},
		{"an optimizer step past the step", func(m *Manifest) { m.State.Step, m.State.OptStep = 4, 5 }, "optimizer step 5 is past step 4"},
		{"a zero loss scale", func(m *Manifest) { m.State.LossScale = &runtime.ScalerState{Scale: 0, Dynamic: true} }, "loss scale 0 after 0 clean steps"},
		{"a negative clean count", func(m *Manifest) { m.State.LossScale = &runtime.ScalerState{Scale: 1024, Clean: -1} }, "after -1 clean steps"},
		{"a null tensor", func(m *Manifest) { m.Tensors["adam.m/w"] = nil }, `lists tensor "adam.m/w" as null, not a tensor's record`},
		{"a file no block uses", func(m *Manifest) { m.Files["rank-00002.safetensors"] = Sum{Bytes: 8, CRC32C: "00000000"} },
			`lists file "rank-00002.safetensors", which holds no block of any tensor`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			writeBlocks(t, dir, false)
			editManifest(t, dir, func(m *Manifest) {
				m.State = runtime.State{Step: 4, OptStep: 3, Samples: 16, LossScale: &runtime.ScalerState{Scale: 1024, Dynamic: true, Clean: 2}}
			})
			_, err := ReadManifest(dir)
			require.NoError(t, err, "a step skipped by the loss scaler leaves the optimizer step behind")
			editManifest(t, dir, tc.break_)
			_, err = ReadManifest(dir)
			require.ErrorIs(t, err, ErrCorrupt)
			assert.ErrorContains(t, err, dir+": "+ManifestName+" ")
			assert.ErrorContains(t, err, tc.want)
			_, _, err = Consolidate(dir, lower.Param)
			assert.ErrorIs(t, err, ErrCorrupt, "export refuses it too")
		})
	}
}

// A step folder's manifest must say the step the folder is named for: an
// edited step resumed would skip or repeat steps without a word.
func TestManifestStepMatchesItsFolder(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "step-00000004")
	require.NoError(t, os.MkdirAll(dir, 0o755))
	writeBlocks(t, dir, false)
	editManifest(t, dir, func(m *Manifest) { m.State = runtime.State{Step: 4, OptStep: 4, Samples: 16} })
	_, err := ReadManifest(dir)
	require.NoError(t, err)
	editManifest(t, dir, func(m *Manifest) { m.State.Step = 5 })
	_, err = ReadManifest(dir)
	require.ErrorIs(t, err, ErrCorrupt)
	assert.ErrorContains(t, err, "the folder is named for step 4 and its manifest.json says step 5")
}

// A manifest's checksum covers what only it says: a step, seed or loss
// scale edited in the file is refused as corrupt, naming how to accept an
// edit made on purpose; a manifest without one (written before it
// existed, or with it removed) is read as before. The sum survives the
// indented file and members that do not survive a float64.
func TestManifestChecksumCoversItsState(t *testing.T) {
	for _, tc := range []struct{ name, old, new string }{
		{"the seed", `"seed": 7`, `"seed": 8`},
		{"the step", `"step": 4`, `"step": 5`},
		{"the loss scale", `"scale": 1024`, `"scale": 2048`},
		{"a flag", `"lr": 0.001`, `"lr": 0.01`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			writeBlocks(t, dir, false)
			editManifest(t, dir, func(m *Manifest) {
				m.State = runtime.State{Step: 4, OptStep: 4, Samples: 16, Seed: 7, LossScale: &runtime.ScalerState{Scale: 1024, Dynamic: true}}
				m.Plan.Flags = map[string]any{"lr": 0.001, "big": int64(1)<<62 + 1}
				m.Plan.ExportConfig = json.RawMessage(`{"n_layer": 2, "eps": 1e-05}`)
			})
			m, err := ReadManifest(dir)
			require.NoError(t, err, "the file as written matches its checksum")
			require.NotEmpty(t, m.Checksum)
			path := filepath.Join(dir, ManifestName)
			raw, err := os.ReadFile(path)
			require.NoError(t, err)
			require.Contains(t, string(raw), tc.old)
			require.NoError(t, os.WriteFile(path, []byte(strings.Replace(string(raw), tc.old, tc.new, 1)), 0o644))
			_, err = ReadManifest(dir)
			require.ErrorIs(t, err, ErrCorrupt)
			assert.ErrorContains(t, err, dir+": manifest.json does not match its checksum")
			assert.ErrorContains(t, err, `once its "checksum" member is removed`)

			var members map[string]json.RawMessage
			raw, err = os.ReadFile(path)
			require.NoError(t, err)
			require.NoError(t, json.Unmarshal(raw, &members))
			delete(members, "checksum")
			raw, err = json.Marshal(members)
			require.NoError(t, err)
			require.NoError(t, os.WriteFile(path, raw, 0o644))
			_, err = ReadManifest(dir)
			require.NoError(t, err, "no checksum: taken as written")
		})
	}
}

// Every state tensor is a param's (PREFIX/NAME, PREFIX.row:NAME): a
// param whose kind was edited to state is refused by export rather than
// left out of the weights.
func TestConsolidateRefusesStateOfNoParam(t *testing.T) {
	dir := t.TempDir()
	writeBlocks(t, dir, false)
	editManifest(t, dir, func(m *Manifest) { m.Tensors["w"].Kind = "state" })
	_, ts, err := Consolidate(dir, lower.Param)
	require.ErrorIs(t, err, ErrCorrupt)
	assert.ErrorContains(t, err, `tensor "w" is optimizer state of no param in the checkpoint`)
	assert.Empty(t, ts)
	m0, err := ReadManifest(dir)
	require.NoError(t, err)
	assert.ErrorContains(t, Verify(dir, m0), `tensor "w" is optimizer state of no param`, "inspect names what export refuses")

	m := validManifest()
	m.Tensors["adam.m/w"] = &TensorBlocks{Kind: "state"}
	m.Tensors["w"].Kind = "state"
	assert.ErrorContains(t, checkDerived(m), `tensor "w" is of kind state, yet optimizer state "adam.m/w" is named after it as after a param`)
	m.Tensors["w"].Kind = "param"
	for _, name := range []string{"adam.m/w", "adafactor.v.row:w", "sgd.momentum/w"} {
		m.Tensors[name] = &TensorBlocks{Kind: "state"}
	}
	require.NoError(t, checkDerived(m))
	m.Tensors["adam.m/v"] = &TensorBlocks{Kind: "state"}
	assert.ErrorContains(t, checkDerived(m), `tensor "adam.m/v" is optimizer state of no param`)
}

// A refusal to resume on other token data names the parts that differ.
func TestDataDifference(t *testing.T) {
	for _, tc := range []struct{ was, is, want string }{
		{"1 aa;split 98,2;tokenizer f1", "1 aa;split 98,2;tokenizer f2", ": they differ in the tokenizer (fingerprint f1, this run's f2)"},
		{"1 aa;split 98,2;tokenizer f1", "1 aa;split 98,2", ": they differ in the tokenizer: the run had --tokenizer (fingerprint f1), this one none"},
		{"1 aa;split 98,2", "1 aa;split 98,2;tokenizer f1", ": they differ in the tokenizer: the run had no --tokenizer, this one has"},
		{"0.3 aa;0.7 bb;split 98,2", "0.5 aa;0.5 bb;split 90,10", ": they differ in the datasets or their blend, and the split (98,2, this run's 90,10)"},
		{"byte-level text of 1 + 2 bytes, sha256 aa", "1 aa;split 98,2", ""},
	} {
		assert.Equal(t, tc.want, dataDifference(tc.was, tc.is), "%s vs %s", tc.was, tc.is)
	}
}

// A checkpoint whose params hold NaN or ±Inf (a diverged run's, saved
// before it was caught) is refused where its params are read, naming
// the param and where: it trained or evaluated to NaN a step later, and
// exported without a word.
func TestNonFiniteParamsAreRefused(t *testing.T) {
	dir := t.TempDir()
	m := validManifest()
	w := make([]float32, 24)
	for i := range w {
		w[i] = float32(i)
	}
	w[4] = float32(math.NaN())
	whole := Float32Bytes(w)
	for r, b := range m.Tensors["w"].Blocks {
		blk := make([]byte, 4*3*4)
		copyBox(whole, 4, m.Tensors["w"].View, b.Lo, b.Size, blk, false)
		sum, err := save(filepath.Join(dir, b.File), []Tensor{{Name: "w", DType: "F32", Shape: []int{4, 3}, Data: blk}},
			map[string]string{"format": Format, "rank": fmt.Sprint(r), blockKey + "w": blockPlace(b.Lo, b.Size)})
		require.NoError(t, err)
		m.Files[b.File] = sum
	}
	require.NoError(t, writeJSON(filepath.Join(dir, ManifestName), m))
	_, _, err := Consolidate(dir, lower.Param)
	require.Error(t, err)
	assert.Contains(t, err.Error(), `param "w" holds 1 non-finite value(s) of 24, the first NaN at index 4: a diverged run's checkpoint?`)

	assert.Empty(t, NonFinite("F32", Float32Bytes([]float32{1, 2})))
	assert.Equal(t, "holds 2 non-finite value(s) of 3, the first +Inf at index 1", NonFinite("F32", Float32Bytes([]float32{1, float32(math.Inf(1)), float32(math.NaN())})))
	assert.Empty(t, NonFinite("I32", []byte{0xff, 0xff, 0xff, 0x7f}), "not a float dtype")
	assert.Equal(t, "holds 1 non-finite value(s) of 2, the first +Inf at index 1", NonFinite("F16", []byte{0x00, 0x3c, 0x00, 0x7c}))
	assert.Equal(t, "holds 1 non-finite value(s) of 2, the first NaN at index 0", NonFinite("BF16", []byte{0xc0, 0x7f, 0x80, 0x3f}))
	assert.Empty(t, NonFinite("BF16", []byte{0x80, 0x3f, 0x80, 0xbf}), "1 and -1")
}

// A step's own folder named without its manifest (a save cut short) is
// said to be one, not taken for a --checkpoint-dir holding no steps.
func TestFindNamesAStepFolderWithoutItsManifest(t *testing.T) {
	root := t.TempDir()
	step := StepDir(root, 2)
	require.NoError(t, os.MkdirAll(step, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(step, "rank-00000.safetensors"), []byte("x"), 0o644))
	_, err := Find(step)
	require.ErrorIs(t, err, ErrNoCheckpoint)
	assert.ErrorContains(t, err, "the folder of step 2 has no manifest.json (a save that did not complete, or files moved out of it)")
}

// A manifest lacking a member every save writes (edited, its checksum
// removed) is refused naming it: read as its zero, a missing precision
// was said as "--precision " with nothing after, a missing seed resumed
// at seed 0.
func TestManifestLackingAMemberIsNamed(t *testing.T) {
	for _, tc := range []struct{ drop, want string }{
		{`"precision":"fp32",`, "plan.precision"},
		{`"seed":7,`, "state.seed"},
		{`"model":"m",`, "model"},
	} {
		dir := t.TempDir()
		text := `{"format":"gcompile-checkpoint","version":1,"model":"m","plan":{"precision":"fp32","optimizer":"adamw","batch":1,"seq":1},"state":{"step":1,"opt_step":1,"seed":7,"samples":1},"files":{},"tensors":{}}`
		require.Contains(t, text, tc.drop)
		require.NoError(t, os.WriteFile(filepath.Join(dir, ManifestName), []byte(strings.Replace(text, tc.drop, "", 1)), 0o644))
		_, err := ReadManifest(dir)
		require.ErrorIs(t, err, ErrCorrupt, tc.want)
		assert.ErrorContains(t, err, "manifest.json lacks "+tc.want+", which every save writes", tc.want)
	}
}

// A checkpoint whose run reduced its gradients in 16 bits says so, with
// the flag that keeps them on a resume; an fp32 run's says nothing.
func TestDescribeSaysTheReductionFormat(t *testing.T) {
	m := &Manifest{Plan: Plan{Flags: map[string]any{"grad_reduce_dtype": "bf16"}}}
	assert.Contains(t, Describe("ck", m), "gradient reductions: over the data axes in bf16, each add rounded (resume with --grad-reduce-dtype bf16 to keep them)")
	m.Plan.Flags["grad_reduce_dtype"] = "fp32"
	assert.NotContains(t, Describe("ck", m), "gradient reductions")
}

// A shard gone with its manifest is a checkpoint removed while it was
// read (a job's --keep-last beside an inspect or export), not a corrupt
// one; a shard gone alone is corruption.
func TestAShardGoneWithItsFolderIsARemovedCheckpoint(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "step-00000007")
	require.NoError(t, os.MkdirAll(dir, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(dir, ManifestName), []byte("{}"), 0o644))
	m := &Manifest{Files: map[string]Sum{"rank-00000.safetensors": {Bytes: 8}}}
	err := CheckFiles(dir, m)
	require.ErrorIs(t, err, ErrCorrupt)
	assert.Contains(t, err.Error(), "rank-00000.safetensors is missing")
	require.NoError(t, os.RemoveAll(dir))
	err = CheckFiles(dir, m)
	require.ErrorIs(t, err, ErrRemoved)
	assert.NotErrorIs(t, err, ErrCorrupt)
	assert.Contains(t, err.Error(), "checkpoint "+dir+" went while it was read")
	err = verify(filepath.Join(dir, "rank-00000.safetensors"), Sum{Bytes: 8})
	assert.ErrorIs(t, err, ErrRemoved)
}
