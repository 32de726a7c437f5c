package checkpoint

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"gcompile/internal/filekind"
	"gcompile/internal/jsonerr"
	"gcompile/ir"
	"gcompile/lower"
	"gcompile/runtime"
)

// A sharded checkpoint is a folder ROOT/step-NNNNNNNN holding one
// safetensors file per rank that has blocks to write (rank-NNNNN.safetensors)
// and manifest.json. Every rank writes the blocks of its params and
// optimizer state that no lower rank also holds, so replicas are written
// once. The manifest, written last, says where each block of each tensor
// lies in the tensor (its corner and size in global coordinates), so a
// checkpoint loads under any plan: a block the new plan holds whole is
// read as it is, any other is cut from the tensor assembled from its
// blocks.
//
// Saving is atomic: the folder is built as step-NNNNNNNN.partial and
// renamed once every file and the manifest are synced, so a crash at any
// moment leaves every earlier checkpoint intact, and a folder without a
// manifest is never loaded.

// Format names a manifest; ManifestVersion is the newest version this
// build reads.
const (
	Format          = "gcompile-checkpoint"
	ManifestVersion = 1
	ManifestName    = "manifest.json"
	partialSuffix   = ".partial"
	stepPrefix      = "step-"
)

// Sentinel errors of sharded checkpoints, for errors.Is.
var (
	// ErrNoCheckpoint: a folder holds no complete checkpoint.
	ErrNoCheckpoint = errors.New("no complete checkpoint")
	// ErrCorrupt: a file is missing, truncated or fails its checksum, or
	// the manifest does not describe a whole tensor.
	ErrCorrupt = errors.New("corrupt checkpoint")
	// ErrMismatch: the checkpoint is of another model, optimizer,
	// precision or batch than the run that loads it.
	ErrMismatch = errors.New("checkpoint does not match the run")
	// ErrVersion: the manifest is of a newer format than this build reads.
	ErrVersion = errors.New("checkpoint format too new")
	// ErrUnrecognised: an entry named like a step's checkpoint (step-N)
	// is not one gcompile completed, so it is neither loaded nor deleted.
	ErrUnrecognised = errors.New("step folder gcompile did not complete")
	// ErrRemoved: the checkpoint's folder went while it was read (a
	// running job's --keep-last pruned it), which is not corruption.
	ErrRemoved = errors.New("checkpoint removed while it was read")
)

// Manifest describes one checkpoint.
type Manifest struct {
	Format  string `json:"format"`
	Version int    `json:"version"`
	// Model is the model's name; ModelFingerprint identifies the model
	// before any pass (ir.Module.Fingerprint), the same under every plan;
	// PlanFingerprint the compiled programs that saved it.
	Model            string        `json:"model"`
	ModelFingerprint string        `json:"model_fingerprint"`
	PlanFingerprint  string        `json:"plan_fingerprint"`
	Plan             Plan          `json:"plan"`
	State            runtime.State `json:"state"`
	Created          string        `json:"created"`
	// Files are the shard files, by name, with their sizes and checksums.
	Files map[string]Sum `json:"files"`
	// Tensors are the params and optimizer state, by name.
	Tensors map[string]*TensorBlocks `json:"tensors"`
	// Checksum is manifestSum of the manifest as written. The shards have
	// checksums of their own; this one covers what only the manifest
	// says, the step, seed and loss scale above all, which an edit or a
	// flipped bit would otherwise change in silence. Manifests written
	// before it existed have none and are read as before.
	Checksum string `json:"checksum,omitempty"`
}

// seal sets m's checksum for m as it is.
func (m *Manifest) seal() error {
	m.Checksum = ""
	raw, err := json.Marshal(m)
	if err != nil {
		return err
	}
	m.Checksum, err = manifestSum(raw)
	return err
}

// manifestSum is the SHA-256 of a manifest's JSON object with its
// checksum member left out, its members in name order and no spaces: the
// same for the file as written (indented) and as the writer marshalled
// it, whatever types its members decode to (a seed past 2⁵³ in the flags
// would not survive a float64).
func manifestSum(raw []byte) (string, error) {
	var members map[string]json.RawMessage
	if err := json.Unmarshal(raw, &members); err != nil {
		return "", err
	}
	delete(members, "checksum")
	canon, err := json.Marshal(members)
	if err != nil {
		return "", err
	}
	h := sha256.Sum256(canon)
	return hex.EncodeToString(h[:]), nil
}

// ID names one save of a checkpoint: its creation time and its files'
// sizes and checksums, so a folder of the same path and step written by
// another run (or again) has another. A run's metrics record it beside
// each checkpoint they list, to tell the checkpoint they saved from one
// that took its place.
func (m *Manifest) ID() string {
	h := sha256.New()
	fmt.Fprintf(h, "%s\n", m.Created)
	for _, name := range sortedKeys(m.Files) {
		f := m.Files[name]
		fmt.Fprintf(h, "%s %d %s\n", name, f.Bytes, f.CRC32C)
	}
	return hex.EncodeToString(h.Sum(nil))[:16]
}

// Plan is what a manifest records of the plan that saved it. Precision,
// Optimizer, Batch and Seq must be the same for a run that resumes; the
// rest may change (the blocks are resharded).
type Plan struct {
	Mesh      string `json:"mesh"` // ir.Mesh.String(); "" for one device
	Devices   int    `json:"devices"`
	Precision string `json:"precision"`
	Optimizer string `json:"optimizer"`
	Batch     int    `json:"batch"`
	Seq       int    `json:"seq"`
	DPSync    string `json:"dp_sync"` // sync or async data parallelism
	// Data identifies a run's token datasets, blend, split and tokenizer
	// ("" for byte-level text): which tokens a step sees follows from it,
	// so a resumed run must have the same.
	Data string `json:"data,omitempty"`
	// Tokenizer are the files the run's tokenizer was read from (its
	// --tokenizer, then any --merges), absolute: generate, eval and export
	// read the model with them when given none. Data holds the
	// tokenizer's identity, which those files must still have.
	Tokenizer []string `json:"tokenizer,omitempty"`
	// VocabTables are the params whose rows past the data's classes are
	// vocabulary padding, with the classes: export writes only those rows.
	VocabTables map[string]int `json:"vocab_tables,omitempty"`
	// SaveEach are the stacked params that weight files hold as pieces of
	// their own (ir.SaveEach: a MoE layer's experts under Hugging Face's
	// names): export writes them so.
	SaveEach map[string]ir.SaveEach `json:"save_each,omitempty"`
	// Flags are the run's settings as the metrics report them.
	Flags map[string]any `json:"flags,omitempty"`
	// ExportConfig is the model's ir.Module.ExportConfig, a JSON object
	// export writes beside the weights as config.json.
	ExportConfig json.RawMessage `json:"export_config,omitempty"`
}

// TensorBlocks is one tensor: its global type, how the saving plan placed
// it, and its blocks. View is the global shape with each fused dim split
// into its parts (ir.BlockBox); blocks' corners and sizes are in it. A
// view has the global shape's row-major layout, so the tensor's bytes are
// the same in either.
type TensorBlocks struct {
	Kind   string  `json:"kind"`  // param or state
	DType  string  `json:"dtype"` // safetensors dtype
	Shape  []int   `json:"shape"`
	Place  string  `json:"place,omitempty"`
	View   []int   `json:"view"`
	Blocks []Block `json:"blocks"`
}

// Block is one stored block of a tensor: in File under the tensor's name.
type Block struct {
	File string `json:"file"`
	Lo   []int  `json:"lo"`
	Size []int  `json:"size"`
}

// Cluster is what a checkpoint needs of the devices of one process
// (runtime.MeshCluster provides it).
type Cluster interface {
	Local() ([]int, []runtime.BlockDevice)
	Process() (proc, procs int)
	// AnyOf is collective: true everywhere when flag is true anywhere.
	AnyOf(flag bool) (bool, error)
}

// SaveOptions are a checkpoint's identity and place.
type SaveOptions struct {
	Root                              string
	Model, ModelFingerprint, PlanHash string
	Plan                              Plan
	State                             runtime.State
	// KeepLast, when positive, removes the oldest complete checkpoints
	// once a new one is committed, keeping this many.
	KeepLast int
}

// StepOf is the step of a folder named step-N, whatever N's zero padding,
// and whether name is one.
func StepOf(name string) (int, bool) {
	digits, ok := strings.CutPrefix(name, stepPrefix)
	if !ok || digits == "" || strings.Trim(digits, "0123456789") != "" {
		return 0, false
	}
	n, err := strconv.Atoi(digits)
	return n, err == nil
}

// StepDir is the folder of the checkpoint at step under root.
func StepDir(root string, step int) string {
	return filepath.Join(root, fmt.Sprintf("%s%08d", stepPrefix, step))
}

// persistent reports whether buffer b is part of the training state.
func persistent(b lower.Buffer) bool { return b.Kind == lower.Param || b.Kind == lower.State }

// boxOf is the block of b that the device at rank holds, in b's view.
func boxOf(b lower.Buffer, mesh *ir.Mesh, rank int) ir.Box {
	if mesh == nil || b.Place == nil {
		s := []int(b.Global.Shape.Clone())
		return ir.Box{Shape: s, Lo: make([]int, len(s)), Size: slices.Clone(s)}
	}
	return ir.BlockBox(mesh, b.Place, b.Global.Shape, mesh.Coords(rank))
}

// writers picks, for every block of every persistent buffer, the lowest
// rank that holds it: the ranks of a replicated block write it once.
// The result maps rank → buffer names that rank writes.
func writers(progs []*lower.Program) (map[int][]string, error) {
	n, err := lower.MeshDevices(progs)
	if err != nil {
		return nil, err
	}
	mesh := progs[0].Mesh
	seen := map[string]bool{}
	out := map[int][]string{}
	for r := range n {
		p := lower.ProgramOf(progs, r)
		for _, b := range p.Buffers {
			if !persistent(b) {
				continue
			}
			for _, pl := range b.Place {
				if pl.Kind == ir.Partial {
					return nil, fmt.Errorf("%s %q is a partial sum on the mesh; it has no block to save", b.Kind, b.Name)
				}
			}
			key := b.Name + fmt.Sprint(boxOf(b, mesh, r).Lo)
			if !seen[key] {
				seen[key] = true
				out[r] = append(out[r], b.Name)
			}
		}
	}
	return out, nil
}

// part is what one process wrote: its files and blocks.
type part struct {
	Files   map[string]Sum           `json:"files"`
	Tensors map[string]*TensorBlocks `json:"tensors"`
}

// blockKey begins the shard metadata entry that records where the block
// a shard holds of a tensor lies in its view (blockPlace), so the
// manifest's corner for it is checked against the shard itself: two
// blocks of the same size whose corners or files were swapped in the
// manifest have the right counts and checksums but would load each into
// the other's place. Shards written before the entry existed have none
// and are taken as the manifest places them.
const blockKey = "block:"

// blockPlace is a block's corner and size as blockKey records them.
func blockPlace(lo, size []int) string {
	raw, _ := json.Marshal(struct {
		Lo   []int `json:"lo"`
		Size []int `json:"size"`
	}{lo, size})
	return string(raw)
}

// checkBlock checks the header of the shard f that holds tensor name's
// block b against the manifest: its dtype, its element count and, where
// the shard records it, its place in the view.
func checkBlock(f *File, name string, tb *TensorBlocks, b Block) error {
	e, ok := f.entries[name]
	if !ok {
		return fmt.Errorf("%s has no tensor %q, which the manifest places in it: %w", b.File, name, ErrCorrupt)
	}
	n, _ := product(b.Size)
	if have, _ := product(e.shape); e.dtype != tb.DType || have != n {
		return fmt.Errorf("%s: tensor %q is %s%v, the manifest's block is %s of %d elements: %w", b.File, name, e.dtype, e.shape, tb.DType, n, ErrCorrupt)
	}
	recorded, ok := f.Metadata[blockKey+name]
	if !ok {
		for k := range f.Metadata {
			if strings.HasPrefix(k, blockKey) {
				return fmt.Errorf("%s records where its blocks lie but not tensor %q's: %w", b.File, name, ErrCorrupt)
			}
		}
		return nil
	}
	var at struct {
		Lo   []int `json:"lo"`
		Size []int `json:"size"`
	}
	if err := json.Unmarshal([]byte(recorded), &at); err != nil {
		return fmt.Errorf("%s: metadata %s%s is %q, not a block's corner and size (%v): %w", b.File, blockKey, name, recorded, err, ErrCorrupt)
	}
	if !slices.Equal(at.Lo, b.Lo) || !slices.Equal(at.Size, b.Size) {
		return fmt.Errorf("%s holds tensor %q's block at %v of size %v, the manifest places it at %v of size %v (corners or files swapped or edited): %w",
			b.File, name, at.Lo, at.Size, b.Lo, b.Size, ErrCorrupt)
	}
	return nil
}

// ErrPeerFailed is a save or load that another process of the job failed:
// this process knows only that it did (AnyOf carries no reason); that
// process's own report names why.
var ErrPeerFailed = errors.New("another process failed its share")

type peerFailed string

func (p peerFailed) Error() string        { return string(p) }
func (p peerFailed) Is(target error) bool { return target == ErrPeerFailed }

func rankFile(rank int) string { return fmt.Sprintf("rank-%05d.safetensors", rank) }
func partFile(proc int) string { return fmt.Sprintf("part-%05d.json", proc) }

// SaveState writes a checkpoint of the params and optimizer state of the
// cluster's devices, which run progs (one program per pipeline rank), and
// of opts.State. Every process of a job calls it at the same step; each
// writes its own devices' blocks and process 0 commits. It returns the
// checkpoint's folder.
func SaveState(cl Cluster, progs []*lower.Program, opts SaveOptions) (string, error) {
	proc, procs := cl.Process()
	final := StepDir(opts.Root, opts.State.Step)
	tmp := final + partialSuffix
	// agree ends a phase: every process learns whether any failed, so all
	// stop together and none waits for a process that gave up.
	agree := func(err error) error {
		bad, aerr := cl.AnyOf(err != nil)
		switch {
		case err != nil:
			return fmt.Errorf("checkpoint %s: %w", final, err)
		case aerr != nil:
			return fmt.Errorf("checkpoint %s: %w", final, aerr)
		case bad:
			return fmt.Errorf("checkpoint %s: %w", final, peerFailed("another process failed to write its part"))
		}
		return nil
	}
	var err error
	if proc == 0 {
		err = prepare(opts.Root, tmp)
	}
	if err := agree(err); err != nil {
		return "", err
	}
	mine, err := writePart(cl, progs, tmp)
	if err == nil && proc > 0 {
		// Process 0 merges its own part from memory (commit).
		err = writeJSON(filepath.Join(tmp, partFile(proc)), mine)
	}
	if err := agree(err); err != nil {
		return "", err
	}
	if proc == 0 {
		err = commit(progs, opts, tmp, final, mine, procs)
	}
	if err := agree(err); err != nil {
		return "", err
	}
	return final, nil
}

// prepare makes the partial folder afresh, removing what crashed saves
// left behind.
func prepare(root, tmp string) error {
	if err := os.MkdirAll(root, 0o755); err != nil {
		return err
	}
	// Refused before any shard is written, as well as where the commit
	// replaces the folder.
	if err := replaceable(strings.TrimSuffix(tmp, partialSuffix)); err != nil {
		return err
	}
	if err := RemovePartials(root); err != nil {
		return err
	}
	return os.Mkdir(tmp, 0o755)
}

// RemovePartials removes the step-N.partial folders that saves cut short
// left in root. Only the one run writing root may call it (the next save
// does, and a run that has just locked the folder).
func RemovePartials(root string) error {
	entries, err := os.ReadDir(root)
	if err != nil {
		return err
	}
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), stepPrefix) && strings.HasSuffix(e.Name(), partialSuffix) {
			if err := os.RemoveAll(filepath.Join(root, e.Name())); err != nil {
				return err
			}
		}
	}
	return nil
}

// writePart writes one file per local rank with the blocks that rank
// writes.
func writePart(cl Cluster, progs []*lower.Program, dir string) (part, error) {
	out := part{Files: map[string]Sum{}, Tensors: map[string]*TensorBlocks{}}
	who, err := writers(progs)
	if err != nil {
		return out, err
	}
	ranks, devs := cl.Local()
	for i, r := range ranks {
		names := who[r]
		if len(names) == 0 {
			continue
		}
		dev := devs[i]
		prog := dev.Program()
		file := rankFile(r)
		var ts []Tensor
		meta := map[string]string{"format": Format, "rank": strconv.Itoa(r)}
		for _, name := range names {
			b := prog.Buffers[prog.Sources[name]]
			raw, t, err := dev.Bytes(name)
			if err != nil {
				return out, fmt.Errorf("device %d: %w", r, err)
			}
			dt, ok := safetensorsDTypes[t.DType]
			if !ok {
				return out, fmt.Errorf("%s %q is %v, which safetensors cannot hold", b.Kind, name, t)
			}
			ts = append(ts, Tensor{Name: name, DType: dt, Shape: []int(t.Shape.Clone()), Data: raw})
			box := boxOf(b, prog.Mesh, r)
			tb := out.Tensors[name]
			if tb == nil {
				tb = &TensorBlocks{Kind: b.Kind.String(), DType: dt, Shape: []int(b.Global.Shape.Clone()), View: box.Shape}
				if b.Place != nil && prog.Mesh != nil {
					tb.Place = placeString(b.Place)
				}
				out.Tensors[name] = tb
			}
			tb.Blocks = append(tb.Blocks, Block{File: file, Lo: box.Lo, Size: box.Size})
			meta[blockKey+name] = blockPlace(box.Lo, box.Size)
		}
		sum, err := save(filepath.Join(dir, file), ts, meta)
		if err != nil {
			return out, fmt.Errorf("device %d: %w", r, err)
		}
		out.Files[file] = sum
	}
	return out, nil
}

func placeString(place []ir.Placement) string {
	ps := make([]string, len(place))
	for i, p := range place {
		ps[i] = p.String()
	}
	return "[" + strings.Join(ps, ",") + "]"
}

// commit merges the processes' parts into the manifest, writes it, and
// renames the folder into place; then it prunes old checkpoints.
func commit(progs []*lower.Program, opts SaveOptions, tmp, final string, mine part, procs int) error {
	m := Manifest{Format: Format, Version: ManifestVersion, Model: opts.Model, ModelFingerprint: opts.ModelFingerprint,
		PlanFingerprint: opts.PlanHash, Plan: opts.Plan, State: opts.State, Created: time.Now().UTC().Format(time.RFC3339),
		Files: mine.Files, Tensors: mine.Tensors}
	for p := 1; p < procs; p++ {
		var theirs part
		path := filepath.Join(tmp, partFile(p))
		raw, err := os.ReadFile(path)
		if err == nil {
			err = json.Unmarshal(raw, &theirs)
		}
		if err != nil {
			return fmt.Errorf("process %d's part: %w", p, err)
		}
		for f, s := range theirs.Files {
			m.Files[f] = s
		}
		for name, tb := range theirs.Tensors {
			if have := m.Tensors[name]; have != nil {
				have.Blocks = append(have.Blocks, tb.Blocks...)
			} else {
				m.Tensors[name] = tb
			}
		}
		if err := os.Remove(path); err != nil {
			return err
		}
	}
	for _, tb := range m.Tensors {
		sort.Slice(tb.Blocks, func(i, j int) bool { return tb.Blocks[i].File < tb.Blocks[j].File })
	}
	if err := checkManifest(&m); err != nil {
		return fmt.Errorf("the blocks written do not make whole tensors (a bug): %w", err)
	}
	faultPoint("shards written, no manifest")
	if err := m.seal(); err != nil {
		return err
	}
	if err := writeJSON(filepath.Join(tmp, ManifestName), m); err != nil {
		return err
	}
	syncDir(tmp)
	faultPoint("manifest written, folder still partial")
	if err := replaceable(final); err != nil {
		return err
	}
	var old string
	if _, err := os.Lstat(final); err == nil {
		// The same step saved before (a resumed run passing it again):
		// the new save replaces it. It is renamed out of the way before
		// it is removed, so a crash while removing it leaves a .partial
		// folder, which the next save removes, and never a step folder
		// without a manifest, which no save may remove.
		old = final + ".replaced" + partialSuffix
		if err := os.RemoveAll(old); err != nil {
			return err
		}
		if err := os.Rename(final, old); err != nil {
			return err
		}
		faultPoint("old checkpoint of the step removed")
	}
	if err := os.Rename(tmp, final); err != nil {
		return err
	}
	syncDir(opts.Root)
	faultPoint("committed")
	if old != "" {
		if err := os.RemoveAll(old); err != nil {
			return err
		}
	}
	return Prune(opts.Root, opts.KeepLast)
}

// Prune removes the oldest complete checkpoints under root until keep
// remain (keep ≤ 0: none is removed). A save prunes after it commits; a
// resumed run that finds its last step already saved prunes too, since
// a crash between the commit and the pruning left one too many.
func Prune(root string, keep int) error {
	if keep <= 0 {
		return nil
	}
	steps, err := Steps(root)
	if err != nil {
		return err
	}
	for len(steps) > keep {
		// Renamed to a .partial folder first, like a replaced step: a
		// crash while removing leaves what the next save removes.
		dir := StepDir(root, steps[0])
		gone := dir + ".pruned" + partialSuffix
		if err := os.RemoveAll(gone); err != nil {
			return err
		}
		if err := os.Rename(dir, gone); err != nil {
			return err
		}
		if err := os.RemoveAll(gone); err != nil {
			return err
		}
		steps = steps[1:]
	}
	syncDir(root)
	return nil
}

// writeJSON writes v as indented JSON, atomically.
func writeJSON(path string, v any) (err error) {
	raw, err := json.MarshalIndent(v, "", " ")
	if err != nil {
		return err
	}
	f, err := runtime.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*.tmp")
	if err != nil {
		return err
	}
	tmp := f.Name()
	defer func() {
		if err != nil {
			_ = f.Close()
			_ = os.Remove(tmp)
		}
	}()
	if _, err = f.Write(append(raw, '\n')); err != nil {
		return err
	}
	if err = f.Sync(); err != nil {
		return err
	}
	if err = f.Close(); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// Steps are the steps of the complete checkpoints in root, ascending
// (folders step-N with a manifest); an error when root cannot be read.
// List says what else is there.
func Steps(root string) ([]int, error) {
	l, err := List(root)
	return l.Steps, err
}

// Listing is what a folder of checkpoints holds.
type Listing struct {
	// Steps are the steps of the complete checkpoints, ascending.
	Steps []int
	// Unrecognised are the entries named like a step's checkpoint that
	// are not one gcompile completed, by step: gcompile neither loads
	// nor deletes them, so a caller that picks a checkpoint by step
	// must not pass over a newer one in silence. step-N.partial folders,
	// which saves leave and remove, are not among them.
	Unrecognised []Unrecognised
}

// Unrecognised is an entry named like the checkpoint of Step that is not
// one: Why says what it is instead.
type Unrecognised struct {
	Step int
	Path string
	Why  string
}

func (u Unrecognised) String() string { return u.Path + " " + u.Why }

// List lists the checkpoints in root; an error when root cannot be read.
func List(root string) (Listing, error) {
	var l Listing
	entries, err := os.ReadDir(root)
	if err != nil {
		return l, err
	}
	for _, e := range entries {
		n, ok := StepOf(e.Name())
		if !ok {
			continue // another name, a .partial folder, too many digits
		}
		path := filepath.Join(root, e.Name())
		why := unrecognised(path)
		if want := filepath.Base(StepDir(root, n)); why == "" && e.Name() != want {
			// StepDir names step n's checkpoint otherwise: taken as step
			// n, this folder would be looked for (and pruned) there.
			why = fmt.Sprintf("is a checkpoint, but not named %s as gcompile names step %d's", want, n)
		}
		if why != "" {
			l.Unrecognised = append(l.Unrecognised, Unrecognised{Step: n, Path: path, Why: why})
			continue
		}
		l.Steps = append(l.Steps, n)
	}
	slices.Sort(l.Steps)
	slices.SortFunc(l.Unrecognised, func(a, b Unrecognised) int { return a.Step - b.Step })
	return l, nil
}

// unrecognised says why the entry at path, named like a step's checkpoint,
// is not a checkpoint gcompile completed, or "" when it is one: a real
// folder (not a link, which may lead to another run's checkpoint) with a
// manifest, which a save writes last before it renames the folder into
// place.
func unrecognised(path string) string {
	fi, err := os.Lstat(path)
	switch {
	case err != nil:
		return fmt.Sprintf("cannot be read (%v)", err)
	case fi.Mode()&fs.ModeSymlink != 0:
		target, err := os.Readlink(path)
		if err != nil {
			return "is a symbolic link"
		}
		return fmt.Sprintf("is a symbolic link (to %s)", target)
	case !fi.IsDir():
		return "is not a folder"
	}
	if _, err := os.Stat(filepath.Join(path, ManifestName)); err == nil {
		return ""
	} else if !errors.Is(err, fs.ErrNotExist) {
		return fmt.Sprintf("has a %s that cannot be read (%v)", ManifestName, err)
	}
	entries, err := os.ReadDir(path)
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	switch {
	case err != nil:
		return fmt.Sprintf("has no %s and cannot be listed (%v)", ManifestName, err)
	case len(names) == 0:
		return fmt.Sprintf("has no %s (it is empty)", ManifestName)
	}
	return fmt.Sprintf("has no %s (it holds %s)", ManifestName, list(names))
}

// replaceable refuses a save into final, a step's folder, when something
// gcompile did not complete is there: a save replaces the checkpoint of
// its step, but never removes what a user put in its place.
func replaceable(final string) error {
	if _, err := os.Lstat(final); errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	why := unrecognised(final)
	if why == "" {
		return nil
	}
	return fmt.Errorf("%s %s: a save replaces only a checkpoint gcompile completed; move it out of %s or save to another --checkpoint-dir: %w",
		final, why, filepath.Dir(final), ErrUnrecognised)
}

// Find resolves what a user names to resume from: a checkpoint folder
// (one holding a manifest), or a root of them, whose latest complete
// checkpoint it picks. A step folder may be named with any zero padding
// (ck/step-20 is ck/step-00000020). A path that does not exist is an
// error that lists the complete checkpoints beside it, newest first.
func Find(path string) (string, error) {
	if _, err := os.Stat(filepath.Join(path, ManifestName)); err == nil {
		return path, nil
	}
	fi, err := os.Stat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return findStep(path, err)
	}
	if err != nil {
		return "", fmt.Errorf("checkpoint %s: %w", path, err)
	}
	if !fi.IsDir() {
		hint := ""
		if strings.HasSuffix(path, ".safetensors") {
			hint = " (weights such a file holds load with --load)"
		}
		return "", fmt.Errorf("checkpoint %s is a file; name a checkpoint folder or the --checkpoint-dir that holds them%s", path, hint)
	}
	l, err := List(path)
	if err != nil {
		return "", fmt.Errorf("checkpoint %s: %w", path, err)
	}
	steps := l.Steps
	if step, ok := StepOf(filepath.Base(filepath.Clean(path))); ok && len(steps) == 0 {
		// A step's own folder, not a --checkpoint-dir of them: it lacks
		// its manifest (a save cut short, or files moved).
		return "", fmt.Errorf("%s: %w: the folder of step %d has no %s (a save that did not complete, or files moved out of it); name the --checkpoint-dir to resume its newest complete checkpoint", path, ErrNoCheckpoint, step, ManifestName)
	}
	if len(steps) == 0 {
		if len(l.Unrecognised) > 0 {
			return "", fmt.Errorf("%s: %w (no %sN folder with a %s in it); %s: %w", path, ErrNoCheckpoint, stepPrefix, ManifestName, describe(l.Unrecognised), ErrUnrecognised)
		}
		return "", fmt.Errorf("%s: %w (no %sN folder with a %s in it)", path, ErrNoCheckpoint, stepPrefix, ManifestName)
	}
	newest := steps[len(steps)-1]
	var newer []Unrecognised
	for _, u := range l.Unrecognised {
		if u.Step >= newest {
			newer = append(newer, u)
		}
	}
	if len(newer) > 0 {
		// The newest step may be what a user moved or broke: resuming
		// from an older one in silence would train those steps again.
		return "", fmt.Errorf("%s: its newest complete checkpoint is %s, but %s: gcompile neither loads nor deletes it; move it out of %s, or name the checkpoint to take: %w",
			path, StepDir(path, newest), describe(newer), path, ErrUnrecognised)
	}
	return StepDir(path, newest), nil
}

// describe says what entries are, for an error.
func describe(us []Unrecognised) string {
	s := make([]string, len(us))
	for i, u := range us {
		s[i] = u.String()
	}
	return list(s)
}

// listedSteps is how many checkpoints an error about a missing one lists.
const listedSteps = 5

// findStep resolves a path that does not exist: ROOT/step-N with another
// zero padding than StepDir's names the complete checkpoint of step N
// under ROOT. Anything else is an error that lists the complete
// checkpoints in the path's folder, newest first, or says there are none;
// when that folder is missing too, notExist (the failed stat) says it.
// Every one of them is an fs.ErrNotExist.
func findStep(path string, notExist error) (string, error) {
	root, base := filepath.Dir(path), filepath.Base(path)
	step, isStep := StepOf(base)
	l, err := List(root)
	if err != nil {
		// The folder above is missing too: the stat's error says it all.
		return "", fmt.Errorf("checkpoint %s: %w", path, notExist)
	}
	steps := l.Steps
	if isStep && slices.Contains(steps, step) {
		return StepDir(root, step), nil
	}
	why := fmt.Sprintf("checkpoint %s does not exist", path)
	if isStep {
		if _, err := os.Stat(StepDir(root, step) + partialSuffix); err == nil {
			why = fmt.Sprintf("the checkpoint of step %d is incomplete (%s: a save that did not finish is never loaded)", step, StepDir(root, step)+partialSuffix)
		}
		for _, u := range l.Unrecognised {
			if u.Step == step {
				why = fmt.Sprintf("there is no checkpoint of step %d (%s)", step, u)
			}
		}
	}
	if len(steps) == 0 {
		return "", notFound(fmt.Sprintf("%s, and %s holds no complete checkpoint (no %sN folder with a %s in it)", why, root, stepPrefix, ManifestName))
	}
	var names []string
	for i := len(steps) - 1; i >= 0 && len(names) < listedSteps; i-- {
		names = append(names, StepDir(root, steps[i]))
	}
	if more := len(steps) - len(names); more > 0 {
		names = append(names, fmt.Sprintf("%d older", more))
	}
	return "", notFound(fmt.Sprintf("%s; %s holds %s (newest first): name one of them, or %s for the newest",
		why, root, strings.Join(names, ", "), root))
}

// notFound is a checkpoint that does not exist, for errors.Is(err,
// fs.ErrNotExist), with a message that says what does.
type notFound string

func (e notFound) Error() string { return string(e) }

func (e notFound) Unwrap() error { return fs.ErrNotExist }

// manifestMembers are the members every save has written since the
// first version, by the object that holds them ("" the manifest itself).
var manifestMembers = map[string][]string{
	"":      {"model", "plan", "state", "files", "tensors"},
	"plan":  {"precision", "optimizer", "batch", "seq"},
	"state": {"step", "opt_step", "seed"},
}

// missingMember is the first of manifestMembers raw lacks ("plan.batch"),
// or "".
func missingMember(raw []byte) string {
	var top map[string]json.RawMessage
	if json.Unmarshal(raw, &top) != nil {
		return ""
	}
	for _, obj := range []string{"", "plan", "state"} {
		members := top
		if obj != "" {
			if json.Unmarshal(top[obj], &members) != nil {
				return obj
			}
		}
		for _, k := range manifestMembers[obj] {
			if _, ok := members[k]; !ok {
				return strings.TrimPrefix(obj+"."+k, ".")
			}
		}
	}
	return ""
}

// ReadManifest reads and checks the manifest of the checkpoint in dir.
func ReadManifest(dir string) (*Manifest, error) {
	path := filepath.Join(dir, ManifestName)
	if fi, err := os.Stat(path); err == nil && !fi.Mode().IsRegular() {
		// A pipe would hang the read; a folder fails it in Go's words.
		return nil, fmt.Errorf("%s: its %s is %s, not a file: %w", dir, ManifestName, filekind.Of(fi.Mode()), ErrCorrupt)
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("%s: %w (it has no %s)", dir, ErrNoCheckpoint, ManifestName)
		}
		return nil, err
	}
	var head struct {
		Format  string `json:"format"`
		Version int    `json:"version"`
	}
	if err := json.Unmarshal(raw, &head); err != nil {
		return nil, fmt.Errorf("%s: %s: %w: %w", dir, ManifestName, jsonerr.Decode(raw, err), ErrCorrupt)
	}
	if head.Format != Format {
		return nil, fmt.Errorf("%s: %s is of format %q, not %q: %w", dir, ManifestName, head.Format, Format, ErrCorrupt)
	}
	if head.Version > ManifestVersion || head.Version < 1 {
		return nil, fmt.Errorf("%s: manifest version %d; this build reads version %d and older: %w", dir, head.Version, ManifestVersion, ErrVersion)
	}
	var m Manifest
	if err := json.Unmarshal(raw, &m); err != nil {
		return nil, fmt.Errorf("%s: %s: %w: %w", dir, ManifestName, jsonerr.Decode(raw, err), ErrCorrupt)
	}
	if key := missingMember(raw); key != "" {
		// Read as its zero, it named "--precision " with nothing after,
		// or resumed at seed 0.
		return nil, fmt.Errorf("%s: %s lacks %s, which every save writes (an edited manifest?): %w", dir, ManifestName, key, ErrCorrupt)
	}
	if m.Checksum != "" {
		sum, err := manifestSum(raw)
		if err != nil {
			return nil, fmt.Errorf("%s: %s: %v: %w", dir, ManifestName, err, ErrCorrupt)
		}
		if sum != m.Checksum {
			return nil, fmt.Errorf("%s: %s does not match its checksum: it was damaged or edited after the save (an edit made on purpose is taken once its \"checksum\" member is removed): %w", dir, ManifestName, ErrCorrupt)
		}
	}
	if err := checkManifest(&m); err != nil {
		return nil, fmt.Errorf("%s: %w", dir, err)
	}
	// The folder's name is the step its save wrote; a manifest that says
	// another was edited (or the folder renamed), and resuming it would
	// skip or repeat steps of data and learning rate without a word.
	if step, ok := StepOf(filepath.Base(filepath.Clean(dir))); ok && step != m.State.Step {
		return nil, fmt.Errorf("%s: the folder is named for step %d and its %s says step %d (the manifest was edited, or the folder renamed): %w", dir, step, ManifestName, m.State.Step, ErrCorrupt)
	}
	return &m, nil
}

// checkManifest checks that the state is one a run reaches, that every
// tensor's blocks lie in its view, are held by listed files, and cover the
// view exactly once, and that every listed file holds a block.
func checkManifest(m *Manifest) error {
	if err := checkState(m.State); err != nil {
		return fmt.Errorf("%s %w: %w", ManifestName, err, ErrCorrupt)
	}
	// A vocabulary table's classes are rows of a param of rank 2 it has:
	// -1 panicked export's trim, 0 exported an empty table and 100000 a
	// config.json of 100000 classes for a table of 256 rows.
	for _, name := range sortedKeys(m.Plan.VocabTables) {
		rows := m.Plan.VocabTables[name]
		tb := m.Tensors[name]
		switch {
		case tb == nil || tb.Kind != lower.Param.String() || len(tb.Shape) != 2:
			return fmt.Errorf("%s: plan.vocab_tables names %q, which is not a param of rank 2 in it: %w", ManifestName, name, ErrCorrupt)
		case rows < 1 || rows > tb.Shape[0]:
			return fmt.Errorf("%s: plan.vocab_tables gives %q %d classes; its table has %d rows: %w", ManifestName, name, rows, tb.Shape[0], ErrCorrupt)
		}
	}
	// A checkpoint's files are in its folder: a name with a path in it
	// read (and checksummed) a file elsewhere.
	for _, f := range sortedKeys(m.Files) {
		if f == "" || filepath.Base(f) != f || f == "." || f == ".." {
			return fmt.Errorf("%s: file %q is not a name in the checkpoint's folder: %w", ManifestName, f, ErrCorrupt)
		}
	}
	need := map[string]float64{} // the bytes of the blocks in each file
	for _, name := range sortedKeys(m.Tensors) {
		tb := m.Tensors[name]
		if tb == nil {
			return fmt.Errorf("%s lists tensor %q as null, not a tensor's record: %w", ManifestName, name, ErrCorrupt)
		}
		if _, ok := dtypeSizes[tb.DType]; !ok || tb.Kind != lower.Param.String() && tb.Kind != lower.State.String() {
			return fmt.Errorf("tensor %q: dtype %q, kind %q: %w", name, tb.DType, tb.Kind, ErrCorrupt)
		}
		total, err := product(tb.Shape)
		if err != nil {
			return fmt.Errorf("tensor %q: %w: %w", name, err, ErrCorrupt)
		}
		if view, err := product(tb.View); err != nil || view != total {
			return fmt.Errorf("tensor %q: view %v does not hold shape %v: %w", name, tb.View, tb.Shape, ErrCorrupt)
		}
		var covered int64
		seen := map[string]bool{}
		for _, b := range tb.Blocks {
			if _, ok := m.Files[b.File]; !ok {
				return fmt.Errorf("tensor %q: a block in %q, which the manifest does not list: %w", name, b.File, ErrCorrupt)
			}
			if n, err := product(b.Size); err == nil {
				// Bytes, in a float64 so that no count can wrap round.
				need[b.File] += float64(n) * float64(dtypeSizes[tb.DType])
			}
			if len(b.Lo) != len(tb.View) || len(b.Size) != len(tb.View) {
				return fmt.Errorf("tensor %q: a block of rank %d in a view of rank %d: %w", name, len(b.Lo), len(tb.View), ErrCorrupt)
			}
			for d := range b.Lo {
				// Written as a difference so that a huge corner or size
				// cannot overflow past the check.
				if b.Lo[d] < 0 || b.Size[d] < 0 || b.Lo[d] > tb.View[d]-b.Size[d] {
					return fmt.Errorf("tensor %q: block at %v of size %v lies outside %v: %w", name, b.Lo, b.Size, tb.View, ErrCorrupt)
				}
			}
			key := fmt.Sprint(b.Lo)
			if seen[key] {
				return fmt.Errorf("tensor %q: two blocks at %v: %w", name, b.Lo, ErrCorrupt)
			}
			seen[key] = true
			n, _ := product(b.Size)
			covered += n
		}
		// Blocks inside the view that share no element and whose sizes
		// add up to it cover it exactly. Distinct corners are not enough:
		// a corner moved onto another block keeps the count and leaves a
		// hole that would load as zeros.
		if i, j, ok := overlap(tb.Blocks); ok {
			a, b := tb.Blocks[i], tb.Blocks[j]
			return fmt.Errorf("tensor %q: the block at %v of size %v in %s overlaps the block at %v of size %v in %s; the blocks must cover the view %v once: %w",
				name, a.Lo, a.Size, a.File, b.Lo, b.Size, b.File, tb.View, ErrCorrupt)
		}
		if covered != total {
			return fmt.Errorf("tensor %q: its blocks hold %d of its %d elements: %w", name, covered, total, ErrCorrupt)
		}
	}
	for _, f := range sortedKeys(need) {
		if n := m.Files[f].Bytes; n > 0 && need[f] > float64(n) {
			return fmt.Errorf("%s lists file %q of %d bytes, but the blocks in it hold %.0f: %w", ManifestName, f, m.Files[f].Bytes, need[f], ErrCorrupt)
		}
	}
	used := map[string]bool{}
	for _, tb := range m.Tensors {
		for _, b := range tb.Blocks {
			used[b.File] = true
		}
	}
	for _, f := range sortedKeys(m.Files) {
		// A save lists only the files it wrote blocks to. An entry no
		// block uses is refused here, where every command reads the
		// manifest (after the tensors: a missing block says more),
		// rather than by inspect alone, which verifies every listed
		// file, while a load, which reads only the blocks' files,
		// accepts it.
		if !used[f] {
			return fmt.Errorf("%s lists file %q, which holds no block of any tensor: %w", ManifestName, f, ErrCorrupt)
		}
	}
	return nil
}

// checkState checks what runtime.Train and the loss scaler refuse to
// start from, so a manifest that says it is refused where it is read,
// naming it, rather than when a resumed run starts.
func checkState(st runtime.State) error {
	switch {
	case st.Step < 0 || st.OptStep < 0 || st.Samples < 0:
		return fmt.Errorf("has state: step %d, optimizer step %d, %d samples: none may be negative", st.Step, st.OptStep, st.Samples)
	case st.OptStep > st.Step:
		return fmt.Errorf("has state: optimizer step %d is past step %d (a step applies at most one update)", st.OptStep, st.Step)
	case st.LossScale != nil && (!(st.LossScale.Scale > 0) || math.IsInf(st.LossScale.Scale, 0) || st.LossScale.Clean < 0):
		return fmt.Errorf("has state: loss scale %v after %d clean steps: the scale must be positive and finite, the count not negative", st.LossScale.Scale, st.LossScale.Clean)
	}
	return nil
}

// overlap finds two blocks that share an element; the blocks lie inside
// their view. They are swept in the order of their corners along the dim
// whose corners differ most, comparing each only with the blocks that
// start before it ends there, so the cells of a plan's grid cost far
// fewer than n² comparisons.
func overlap(blocks []Block) (int, int, bool) {
	if len(blocks) < 2 {
		return 0, 0, false
	}
	sweep, most := -1, 0
	for d := range blocks[0].Lo {
		distinct := map[int]bool{}
		for _, b := range blocks {
			distinct[b.Lo[d]] = true
		}
		if len(distinct) > most {
			sweep, most = d, len(distinct)
		}
	}
	order := make([]int, len(blocks))
	for i := range order {
		order[i] = i
	}
	if sweep >= 0 {
		sort.SliceStable(order, func(x, y int) bool { return blocks[order[x]].Lo[sweep] < blocks[order[y]].Lo[sweep] })
	}
	for x, i := range order {
		a := blocks[i]
		for _, j := range order[x+1:] {
			b := blocks[j]
			if sweep >= 0 && b.Lo[sweep] >= a.Lo[sweep]+a.Size[sweep] {
				break
			}
			if intersect(a, b) {
				return min(i, j), max(i, j), true
			}
		}
	}
	return 0, 0, false
}

// intersect reports whether two blocks of the same rank share an element:
// both hold one and their ranges meet in every dim (a scalar's blocks
// always meet).
func intersect(a, b Block) bool {
	for d := range a.Lo {
		if a.Size[d] == 0 || b.Size[d] == 0 || max(a.Lo[d], b.Lo[d]) >= min(a.Lo[d]+a.Size[d], b.Lo[d]+b.Size[d]) {
			return false
		}
	}
	return true
}

// product is the element count of shape, overflow-checked.
func product(shape []int) (int64, error) {
	n := int64(1)
	for _, d := range shape {
		if d < 0 {
			return 0, fmt.Errorf("dimension %d: %w", d, ErrShape)
		}
		if d != 0 && n > (1<<62)/int64(d) {
			return 0, fmt.Errorf("shape %v is too large: %w", shape, ErrShape)
		}
		n *= int64(d)
	}
	return n, nil
}

func sortedKeys[V any](m map[string]V) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return ks
}

// Expect is what the run that loads a checkpoint requires of it.
type Expect struct {
	// Model is the run's model's name (its folder's), which the error for
	// another model names when it is not the checkpoint's.
	Model            string
	ModelFingerprint string
	Plan             Plan
	// DataAlso are other spellings of Plan.Data a checkpoint of the same
	// data may carry (the form an earlier identity took).
	DataAlso []string
	// Set is the run's --set, which the error for another model names
	// beside the checkpoint's (its Plan.Flags["set"]).
	Set string
}

// reader opens each shard file once, verifying its size and checksum
// before the first tensor is read from it.
type reader struct {
	dir   string
	m     *Manifest
	files map[string]*File
}

func (r *reader) open(name string) (*File, error) {
	if f := r.files[name]; f != nil {
		return f, nil
	}
	path := filepath.Join(r.dir, name)
	if err := verify(path, r.m.Files[name]); err != nil {
		return nil, err
	}
	f, err := Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, missingShard(path) // gone since verify read it
	}
	if err != nil {
		return nil, fmt.Errorf("%w: %w", err, ErrCorrupt)
	}
	r.files[name] = f
	return f, nil
}

func (r *reader) close() {
	for _, f := range r.files {
		f.Close()
	}
}

// Verify checks every shard file of the checkpoint in dir against the
// size and CRC-32C its manifest records, as a resume does before it reads
// a block, and the header of each intact one against the blocks the
// manifest places in it, as a resume does when it reads them; every
// damaged or missing file is named, and so is a state tensor that belongs
// to no param, which Consolidate refuses.
func Verify(dir string, m *Manifest) error {
	var errs []error
	// What Consolidate (export) refuses, inspect names too.
	if err := checkDerived(m); err != nil {
		errs = append(errs, err)
	}
	placed := map[string][]string{}
	for _, name := range sortedKeys(m.Tensors) {
		for _, b := range m.Tensors[name].Blocks {
			if names := placed[b.File]; len(names) == 0 || names[len(names)-1] != name {
				placed[b.File] = append(names, name)
			}
		}
	}
	for _, file := range sortedKeys(m.Files) {
		path := filepath.Join(dir, file)
		if err := verify(path, m.Files[file]); err != nil {
			errs = append(errs, err)
			continue
		}
		f, err := Open(path)
		if err != nil {
			errs = append(errs, fmt.Errorf("%w: %w", err, ErrCorrupt))
			continue
		}
		for _, name := range placed[file] {
			tb := m.Tensors[name]
			for _, b := range tb.Blocks {
				if b.File == file {
					if err := checkBlock(f, name, tb, b); err != nil {
						errs = append(errs, err)
					}
				}
			}
		}
		f.Close()
	}
	return errors.Join(errs...)
}

// CheckFiles is Verify's cheap part: every shard file the manifest lists
// is there, at its size. It reads no file, so a resume can run it before
// the compile and name a truncated or missing shard then, leaving the
// checksums to the load.
func CheckFiles(dir string, m *Manifest) error {
	var errs []error
	for _, file := range sortedKeys(m.Files) {
		path := filepath.Join(dir, file)
		fi, err := os.Stat(path)
		switch {
		case errors.Is(err, os.ErrNotExist):
			errs = append(errs, missingShard(path))
		case err != nil:
			errs = append(errs, err)
		case !fi.Mode().IsRegular():
			errs = append(errs, fmt.Errorf("shard %s is %s, not a file: %w", path, filekind.Of(fi.Mode()), ErrCorrupt))
		case fi.Size() != m.Files[file].Bytes:
			errs = append(errs, fmt.Errorf("shard %s is %d bytes, the manifest says %d (truncated or overwritten): %w", path, fi.Size(), m.Files[file].Bytes, ErrCorrupt))
		}
	}
	return errors.Join(errs...)
}

// missingShard is the error of a shard file that is not there: a corrupt
// checkpoint's, or, where the manifest read before has gone too, a
// checkpoint removed while it was read (a training job beside the reader
// pruned it), which reading the newest again gets past.
func missingShard(path string) error {
	dir := filepath.Dir(path)
	if _, err := os.Stat(filepath.Join(dir, ManifestName)); errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("checkpoint %s went while it was read (a run's --keep-last pruned it, as likely as not): read the newest again: %w", dir, ErrRemoved)
	}
	return fmt.Errorf("shard %s is missing: %w", path, ErrCorrupt)
}

// verify checks a file's size and CRC-32C against the manifest's.
func verify(path string, want Sum) error {
	f, err := os.Open(path)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return missingShard(path)
		}
		return err
	}
	defer f.Close()
	crc := crc32.New(castagnoli)
	n, err := io.Copy(crc, f)
	if err != nil {
		return fmt.Errorf("read %s: %w", path, err)
	}
	if n != want.Bytes {
		return fmt.Errorf("shard %s is %d bytes, the manifest says %d (truncated or overwritten): %w", path, n, want.Bytes, ErrCorrupt)
	}
	if got := fmt.Sprintf("%08x", crc.Sum32()); got != want.CRC32C {
		return fmt.Errorf("shard %s has CRC-32C %s, the manifest says %s: %w", path, got, want.CRC32C, ErrCorrupt)
	}
	return nil
}

// block reads one stored block, checking it against the manifest.
func (r *reader) block(name string, tb *TensorBlocks, b Block) ([]byte, error) {
	f, err := r.open(b.File)
	if err != nil {
		return nil, err
	}
	if err := checkBlock(f, name, tb, b); err != nil {
		return nil, err
	}
	t, err := f.Tensor(name)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", err, ErrCorrupt)
	}
	return t.Data, nil
}

// whole assembles a tensor from all its blocks.
func (r *reader) whole(name string, tb *TensorBlocks) ([]byte, error) {
	// Every block is checked in its file before the tensor's bytes are
	// allocated: a manifest naming a tensor of 2⁴⁰ elements, with no file
	// behind it, made the process die allocating 4 TiB.
	for _, b := range tb.Blocks {
		f, err := r.open(b.File)
		if err != nil {
			return nil, err
		}
		if err := checkBlock(f, name, tb, b); err != nil {
			return nil, err
		}
	}
	es := dtypeSizes[tb.DType]
	total, _ := product(tb.Shape)
	out := make([]byte, total*int64(es))
	for _, b := range tb.Blocks {
		data, err := r.block(name, tb, b)
		if err != nil {
			return nil, err
		}
		copyBox(out, es, tb.View, b.Lo, b.Size, data, true)
	}
	return out, nil
}

// copyBox copies between a row-major array of shape (element size es)
// and the box at lo of the given size: into the array when in, out of
// it otherwise. Runs along the last dim are copied whole.
func copyBox(x []byte, es int, shape, lo, size []int, blk []byte, in bool) {
	if len(shape) == 0 {
		if in {
			copy(x, blk)
		} else {
			copy(blk, x)
		}
		return
	}
	last := len(shape) - 1
	run := size[last] * es
	if run == 0 {
		return
	}
	idx := make([]int, last) // position within the box of the leading dims
	for pos := 0; pos < len(blk); pos += run {
		off := 0
		for d := range last {
			off = off*shape[d] + lo[d] + idx[d]
		}
		off = (off*shape[last] + lo[last]) * es
		if in {
			copy(x[off:off+run], blk[pos:pos+run])
		} else {
			copy(blk[pos:pos+run], x[off:off+run])
		}
		for d := last - 1; d >= 0; d-- {
			idx[d]++
			if idx[d] < size[d] {
				break
			}
			idx[d] = 0
		}
	}
}

// RestoreState loads the checkpoint in dir into the cluster's devices,
// which run progs, whatever plan saved it, and returns its manifest.
// Every param and optimizer state of every program must be in the
// checkpoint with its global shape and dtype, and every tensor of the
// checkpoint must be one of them; everything is checked, on every
// process, before any device is written. It is collective.
func RestoreState(cl Cluster, progs []*lower.Program, dir string, ex Expect) (*Manifest, error) {
	m, err := ReadManifest(dir)
	if err == nil {
		err = match(m, progs, ex)
	}
	var r *reader
	if err == nil {
		r = &reader{dir: dir, m: m, files: map[string]*File{}}
		defer r.close()
		err = r.verifyNeeded(cl, progs)
	}
	bad, aerr := cl.AnyOf(err != nil)
	switch {
	case err != nil:
		return nil, err
	case aerr != nil:
		return nil, aerr
	case bad:
		return nil, fmt.Errorf("checkpoint %s: %w", dir, peerFailed("another process could not load it"))
	}
	if err := r.restore(cl); err != nil {
		return nil, err
	}
	return m, nil
}

// orText names byte-level text, whose Plan.Data is empty in a checkpoint
// saved before text was identified by TextIdentity.
func orText(data string) string {
	if data == "" {
		return textData
	}
	return data
}

// textData begins every TextIdentity.
const textData = "byte-level text"

// IsTextIdentity says whether a Plan.Data names byte-level text
// (TextIdentity) rather than token datasets.
func IsTextIdentity(data string) bool { return strings.HasPrefix(data, textData) }

// TextIdentity is Plan.Data for byte-level text: a digest of the bytes of
// its training and held-out splits (their contents, not the path, which
// may differ between machines), so a run resumed on other text, or a job
// whose processes read different text, is refused.
func TextIdentity(train, eval []byte) string {
	h := sha256.New()
	var n [8]byte
	binary.LittleEndian.PutUint64(n[:], uint64(len(train)))
	h.Write(n[:])
	h.Write(train)
	h.Write(eval)
	return fmt.Sprintf("%s of %d + %d bytes, sha256 %.16x", textData, len(train), len(eval), h.Sum(nil))
}

// dataDifference says which parts of two token-data identities differ
// ("W FP;…;split S;tokenizer T", as the CLI writes them): the datasets or
// their weights, the split, the tokenizer (or its absence). "" when either
// is not such an identity (text's), whose hashes say it all.
func dataDifference(was, is string) string {
	parts := func(id string) (sets []string, split, tok string, ok bool) {
		for _, p := range strings.Split(id, ";") {
			switch {
			case strings.HasPrefix(p, "split "):
				split, ok = strings.TrimPrefix(p, "split "), true
			case strings.HasPrefix(p, "tokenizer "):
				tok = strings.TrimPrefix(p, "tokenizer ")
			default:
				sets = append(sets, p)
			}
		}
		return sets, split, tok, ok
	}
	ws, wsplit, wtok, ok1 := parts(was)
	is2, isplit, itok, ok2 := parts(is)
	if !ok1 || !ok2 {
		return ""
	}
	short := func(fp string) string {
		if fp == "" {
			return "none"
		}
		return fmt.Sprintf("%.16s", fp)
	}
	var diff []string
	if !slices.Equal(ws, is2) {
		diff = append(diff, "the datasets or their blend")
	}
	if wsplit != isplit {
		diff = append(diff, fmt.Sprintf("the split (%s, this run's %s)", wsplit, isplit))
	}
	switch {
	case wtok == itok:
	case itok == "":
		diff = append(diff, fmt.Sprintf("the tokenizer: the run had --tokenizer (fingerprint %s), this one none", short(wtok)))
	case wtok == "":
		diff = append(diff, "the tokenizer: the run had no --tokenizer, this one has")
	default:
		diff = append(diff, fmt.Sprintf("the tokenizer (fingerprint %s, this run's %s)", short(wtok), short(itok)))
	}
	if len(diff) == 0 {
		return ""
	}
	return ": they differ in " + strings.Join(diff, ", and ")
}

// TrainingDiffers is the error of a setting of the training (flag: the
// flag, or what it is) the checkpoint was saved with (saved) that this
// run has otherwise (is); nil when they agree.
func TrainingDiffers(flag string, saved, is any) error {
	if saved == is {
		return nil
	}
	return fmt.Errorf("the checkpoint was saved with %s %v and this run has %v; resume with the same (the plan may change, the training may not): %w", flag, saved, is, ErrMismatch)
}

// match checks that the checkpoint belongs to this model and run, and
// holds exactly the params and state the programs have.
func match(m *Manifest, progs []*lower.Program, ex Expect) error {
	type rule struct {
		flag      string
		saved, is any
	}
	for _, c := range []rule{{"--precision", m.Plan.Precision, ex.Plan.Precision}, {"--optimizer", m.Plan.Optimizer, ex.Plan.Optimizer},
		{"--batch", m.Plan.Batch, ex.Plan.Batch}, {"the sequence length", m.Plan.Seq, ex.Plan.Seq}, {"--dp-sync", m.Plan.DPSync, ex.Plan.DPSync}} {
		if err := TrainingDiffers(c.flag, c.saved, c.is); err != nil {
			return err
		}
	}
	// Text without an identity ("": a checkpoint saved before text had
	// one, or a caller that does not say) is taken on trust.
	legacy := func(a, b string) bool { return a == "" && strings.HasPrefix(b, textData) }
	if m.Plan.Data != ex.Plan.Data && !legacy(m.Plan.Data, ex.Plan.Data) && !legacy(ex.Plan.Data, m.Plan.Data) && !slices.Contains(ex.DataAlso, m.Plan.Data) {
		diff := dataDifference(m.Plan.Data, ex.Plan.Data)
		if strings.Contains(diff, "tokenizer") && len(m.Plan.Tokenizer) > 0 {
			// The files the run read, which the resume is to give.
			diff += fmt.Sprintf(" (the run read --tokenizer %s)", strings.Join(m.Plan.Tokenizer, " --merges "))
		}
		return fmt.Errorf("the checkpoint was trained on other data (%s) than this run's (%s)%s: a step's tokens follow from the datasets, blend, --split and tokenizer; resume with the same --data, --split and --tokenizer: %w",
			orText(m.Plan.Data), orText(ex.Plan.Data), diff, ErrMismatch)
	}
	if ex.ModelFingerprint != "" && m.ModelFingerprint != ex.ModelFingerprint {
		if ex.Model != "" && m.Model != "" && ex.Model != m.Model {
			// The name is part of the model: a model.go copied to another
			// folder builds another model, whatever its code. Whether
			// that is all is not known here, so both are said.
			return fmt.Errorf("the checkpoint is of model %q (fingerprint %.12s), this run's is model %q (fingerprint %.12s): another model, or the checkpoint's model file in a folder of another name (a model.go's model is named by its folder, and the name is part of what a checkpoint holds: run it from a folder named %q): %w",
				m.Model, m.ModelFingerprint, ex.Model, ex.ModelFingerprint, m.Model, ErrMismatch)
		}
		if set, ok := m.Plan.Flags["set"].(string); ok && set != ex.Set {
			return fmt.Errorf("the checkpoint is of model %q built with --set %q (fingerprint %.12s), this run's with --set %q (fingerprint %.12s): another model, or other sizes; resume with the checkpoint's --set: %w",
				m.Model, set, m.ModelFingerprint, ex.Set, ex.ModelFingerprint, ErrMismatch)
		}
		return fmt.Errorf("the checkpoint is of model %q (fingerprint %.12s), this run's model has fingerprint %.12s (another model, or other --set sizes): %w",
			m.Model, m.ModelFingerprint, ex.ModelFingerprint, ErrMismatch)
	}
	have := map[string]lower.Buffer{}
	for _, p := range progs {
		for _, b := range p.Buffers {
			if persistent(b) {
				have[b.Name] = b
			}
		}
	}
	var missing, extra, wrong []string
	for _, name := range sortedKeys(have) {
		b := have[name]
		tb := m.Tensors[name]
		switch {
		case tb == nil:
			missing = append(missing, name)
		case tb.DType != safetensorsDTypes[b.Global.DType] || !ir.Shape(tb.Shape).Equal(b.Global.Shape) || tb.Kind != b.Kind.String():
			wrong = append(wrong, fmt.Sprintf("%s is %s %s%v, the run's is %s %v", name, tb.Kind, tb.DType, tb.Shape, b.Kind, b.Global))
		}
	}
	for _, name := range sortedKeys(m.Tensors) {
		if _, ok := have[name]; !ok {
			extra = append(extra, name)
		}
	}
	var errs []error
	if len(wrong) > 0 {
		errs = append(errs, fmt.Errorf("%d tensor(s) differ: %s", len(wrong), list(wrong)))
	}
	if len(missing) > 0 {
		errs = append(errs, fmt.Errorf("the checkpoint lacks %d tensor(s) this run has: %s", len(missing), list(missing)))
	}
	if len(extra) > 0 {
		errs = append(errs, fmt.Errorf("the checkpoint has %d tensor(s) this run does not (state of another schedule or optimizer?): %s", len(extra), list(extra)))
	}
	if len(errs) > 0 {
		return fmt.Errorf("%w: %w", errors.Join(errs...), ErrMismatch)
	}
	return nil
}

// list names up to eight items.
func list(xs []string) string {
	shown := xs[:min(len(xs), 8)]
	s := strings.Join(shown, ", ")
	if len(xs) > len(shown) {
		s += fmt.Sprintf(" and %d more", len(xs)-len(shown))
	}
	return s
}

// verifyNeeded checks the size and checksum of every file this process
// will read, before anything is loaded.
func (r *reader) verifyNeeded(cl Cluster, progs []*lower.Program) error {
	ranks, devs := cl.Local()
	need := map[string]bool{}
	for i, rank := range ranks {
		prog := devs[i].Program()
		for _, b := range prog.Buffers {
			if !persistent(b) {
				continue
			}
			tb := r.m.Tensors[b.Name]
			if blk, ok := exact(tb, boxOf(b, prog.Mesh, rank)); ok {
				need[blk.File] = true
				continue
			}
			for _, blk := range tb.Blocks {
				need[blk.File] = true
			}
		}
	}
	for _, name := range sortedKeys(need) {
		if _, err := r.open(name); err != nil {
			return fmt.Errorf("checkpoint %s: %w", r.dir, err)
		}
	}
	return nil
}

// exact finds the stored block that is the box itself.
func exact(tb *TensorBlocks, box ir.Box) (Block, bool) {
	if !slices.Equal(tb.View, box.Shape) {
		return Block{}, false
	}
	for _, b := range tb.Blocks {
		if slices.Equal(b.Lo, box.Lo) && slices.Equal(b.Size, box.Size) {
			return b, true
		}
	}
	return Block{}, false
}

// restore writes every local device's blocks, tensor by tensor, so at
// most one assembled tensor is held at a time.
func (r *reader) restore(cl Cluster) error {
	ranks, devs := cl.Local()
	for _, name := range sortedKeys(r.m.Tensors) {
		tb := r.m.Tensors[name]
		var whole []byte
		for i, rank := range ranks {
			prog := devs[i].Program()
			id, ok := prog.Sources[name]
			if !ok {
				continue
			}
			b := prog.Buffers[id]
			box := boxOf(b, prog.Mesh, rank)
			var data []byte
			if blk, ok := exact(tb, box); ok {
				var err error
				if data, err = r.block(name, tb, blk); err != nil {
					return fmt.Errorf("checkpoint %s: %w", r.dir, err)
				}
			} else {
				if whole == nil {
					var err error
					if whole, err = r.whole(name, tb); err != nil {
						return fmt.Errorf("checkpoint %s: %w", r.dir, err)
					}
				}
				es := dtypeSizes[tb.DType]
				n, _ := product(box.Size)
				data = make([]byte, n*int64(es))
				copyBox(whole, es, box.Shape, box.Lo, box.Size, data, false)
			}
			if tb.Kind == lower.Param.String() {
				if msg := NonFinite(tb.DType, data); msg != "" {
					return fmt.Errorf("checkpoint %s: param %q (device %d's share) %s: a diverged run's checkpoint? resume from one before it", r.dir, name, rank, msg)
				}
			}
			if err := devs[i].SetBytes(name, data); err != nil {
				return fmt.Errorf("device %d: %w", rank, err)
			}
		}
	}
	return nil
}

// Consolidate assembles the checkpoint's tensors of the given kind
// (lower.Param for exported weights) whole, in name order.
func Consolidate(dir string, kind lower.BufferKind) (*Manifest, []Tensor, error) {
	m, err := ReadManifest(dir)
	if err != nil {
		return nil, nil, err
	}
	if err := checkDerived(m); err != nil {
		return nil, nil, fmt.Errorf("%s: %w", dir, err)
	}
	r := &reader{dir: dir, m: m, files: map[string]*File{}}
	defer r.close()
	var out []Tensor
	for _, name := range sortedKeys(m.Tensors) {
		tb := m.Tensors[name]
		if tb.Kind != kind.String() {
			continue
		}
		data, err := r.whole(name, tb)
		if err != nil {
			return nil, nil, fmt.Errorf("checkpoint %s: %w", dir, err)
		}
		if kind == lower.Param {
			if msg := NonFinite(tb.DType, data); msg != "" {
				return nil, nil, fmt.Errorf("checkpoint %s: param %q %s: a diverged run's checkpoint? take one from before it", dir, name, msg)
			}
		}
		out = append(out, Tensor{Name: name, DType: tb.DType, Shape: slices.Clone(tb.Shape), Data: data})
	}
	return m, out, nil
}

// checkDerived checks that every state tensor is a param's: the
// optimizers name their state PREFIX/NAME or PREFIX.row:NAME after param
// NAME. A param whose kind was edited to state would otherwise be left
// out of the exported weights without a word (a resume refuses it, as
// the run's param is not the checkpoint's state).
func checkDerived(m *Manifest) error {
	// base is the tensor a state's name derives from, when the
	// checkpoint has it: the name after one of its '/' or ':'.
	base := func(name string) (string, bool) {
		for i, c := range name {
			if c == '/' || c == ':' {
				if _, ok := m.Tensors[name[i+1:]]; ok {
					return name[i+1:], true
				}
			}
		}
		return "", false
	}
	var orphans []string
	stateOf := map[string]string{} // a tensor → a state named after it
	for _, name := range sortedKeys(m.Tensors) {
		if m.Tensors[name].Kind != lower.State.String() {
			continue
		}
		b, ok := base(name)
		if ok {
			stateOf[b] = name
		}
		if !ok || m.Tensors[b].Kind != lower.Param.String() {
			orphans = append(orphans, name)
		}
	}
	if len(orphans) == 0 {
		return nil
	}
	// A param whose kind was edited leaves its own state orphaned too;
	// the param is what to name.
	for _, name := range orphans {
		if s, ok := stateOf[name]; ok {
			return fmt.Errorf("%s: tensor %q is of kind state, yet optimizer state %q is named after it as after a param: %w", ManifestName, name, s, ErrCorrupt)
		}
	}
	return fmt.Errorf("%s: tensor %q is optimizer state of no param in the checkpoint (state is named PREFIX/PARAM after its param): %w", ManifestName, orphans[0], ErrCorrupt)
}

// safetensorsDTypes are the safetensors names of the IR's dtypes.
var safetensorsDTypes = map[ir.DType]string{ir.F32: "F32", ir.F64: "F64", ir.F16: "F16", ir.BF16: "BF16", ir.I32: "I32", ir.I64: "I64", ir.Bool: "BOOL"}

// NonFinite says where data, a tensor (or a block of one) of safetensors
// dtype dtype, holds NaN or ±Inf ("holds 3 non-finite value(s) of 1024,
// the first NaN at index 7"), or "" when it holds none or is not of a
// float dtype. A diverged run's weights are refused on load with it: they
// would train or evaluate to NaN, found only a step later.
func NonFinite(dtype string, data []byte) string {
	// The exponent bits, all ones for NaN and ±Inf, read in place: a
	// decoded copy of a 4 GB embedding held 8 GB more.
	var size int
	var dt ir.DType
	var special func(b []byte) bool
	switch dtype {
	case "F32":
		size, dt, special = 4, ir.F32, func(b []byte) bool { return binary.LittleEndian.Uint32(b)&0x7f800000 == 0x7f800000 }
	case "F64":
		size, dt, special = 8, ir.F64, func(b []byte) bool { return binary.LittleEndian.Uint64(b)&0x7ff0000000000000 == 0x7ff0000000000000 }
	case "F16":
		size, dt, special = 2, ir.F16, func(b []byte) bool { return binary.LittleEndian.Uint16(b)&0x7c00 == 0x7c00 }
	case "BF16":
		size, dt, special = 2, ir.BF16, func(b []byte) bool { return binary.LittleEndian.Uint16(b)&0x7f80 == 0x7f80 }
	default:
		return ""
	}
	if len(data)%size != 0 {
		return ""
	}
	first, n := -1, 0
	for i := 0; i < len(data); i += size {
		if special(data[i : i+size]) {
			if n == 0 {
				first = i / size
			}
			n++
		}
	}
	if n == 0 {
		return ""
	}
	v, err := runtime.Decode(ir.T(dt, 1), data[first*size:(first+1)*size])
	if err != nil {
		return ""
	}
	return fmt.Sprintf("holds %d non-finite value(s) of %d, the first %v at index %d", n, len(data)/size, v[0], first)
}

// SaveSharded writes tensors to path as one safetensors file, or, when
// they hold more than maxShard bytes, as Hugging Face shards beside it:
// BASE-00001-of-0000N.safetensors and BASE.safetensors.index.json, the
// index mapping each tensor to its shard. It returns the files written.
func SaveSharded(path string, tensors []Tensor, metadata map[string]string, maxShard int64) ([]string, error) {
	var total int64
	for _, t := range tensors {
		total += int64(len(t.Data))
	}
	if maxShard <= 0 || total <= maxShard {
		if err := Save(path, tensors, metadata); err != nil {
			return nil, err
		}
		return []string{path}, removeStale(path, []string{path})
	}
	var shards [][]Tensor
	var size int64
	for _, t := range tensors {
		if len(shards) == 0 || size > 0 && size+int64(len(t.Data)) > maxShard {
			shards = append(shards, nil)
			size = 0
		}
		shards[len(shards)-1] = append(shards[len(shards)-1], t)
		size += int64(len(t.Data))
	}
	base := strings.TrimSuffix(path, ".safetensors")
	index := struct {
		Metadata  map[string]any    `json:"metadata"`
		WeightMap map[string]string `json:"weight_map"`
	}{map[string]any{"total_size": total}, map[string]string{}}
	var files []string
	for i, sh := range shards {
		name := fmt.Sprintf("%s-%05d-of-%05d.safetensors", filepath.Base(base), i+1, len(shards))
		file := filepath.Join(filepath.Dir(path), name)
		if err := Save(file, sh, metadata); err != nil {
			return files, err
		}
		for _, t := range sh {
			index.WeightMap[t.Name] = name
		}
		files = append(files, file)
	}
	idx := base + ".safetensors.index.json"
	if err := writeJSON(idx, index); err != nil {
		return files, fmt.Errorf("checkpoint: %s: %w", idx, err)
	}
	files = append(files, idx)
	return files, removeStale(path, files)
}

// removeStale removes, once the new files are written, what an earlier
// save under path left that the new one does not replace: the shards of
// another count and the index beside a single file, or the single file
// beside an index (a loader given the folder takes NAME.safetensors
// before the index, so a stale one would shadow the new shards).
func removeStale(path string, keep []string) error {
	base := strings.TrimSuffix(path, ".safetensors")
	// The name's own glob characters are escaped (a backslash, as
	// filepath.Match reads it on Unix).
	quoted := strings.NewReplacer(`\`, `\\`, "*", `\*`, "?", `\?`, "[", `\[`).Replace(base)
	stale, _ := filepath.Glob(quoted + "-*-of-*.safetensors")
	stale = append(stale, base+".safetensors.index.json", path)
	var errs []error
	for _, f := range stale {
		if slices.Contains(keep, f) {
			continue
		}
		if err := os.Remove(f); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, fmt.Errorf("checkpoint: removing the earlier save's %s: %w", f, err))
		}
	}
	return errors.Join(errs...)
}

// LoadIndexed reads a Hugging Face shard index (NAME.safetensors.index.json)
// and every shard it names, or one safetensors file.
func LoadIndexed(path string) ([]Tensor, error) {
	if !strings.HasSuffix(path, ".index.json") {
		ts, _, err := Load(path)
		return ts, err
	}
	weightMap, shards, err := readShardIndex(path)
	if err != nil {
		return nil, err
	}
	var out []Tensor
	for _, f := range shards {
		ts, _, err := Load(filepath.Join(filepath.Dir(path), f))
		if errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("checkpoint: %s lists the shard %s, which is not beside it: %w", path, f, ErrHeader)
		}
		if err != nil {
			return nil, err
		}
		for _, t := range ts {
			switch placed, listed := weightMap[t.Name]; {
			case !listed:
				return nil, fmt.Errorf("checkpoint: shard %s holds %q, which %s does not list (its weight_map names every tensor's file): %w", f, t.Name, path, ErrHeader)
			case placed != f:
				return nil, fmt.Errorf("checkpoint: shard %s holds %q, which %s places in %q: %w", f, t.Name, path, placed, ErrHeader)
			}
		}
		out = append(out, ts...)
	}
	// A tensor the index maps to a shard that does not hold it is not
	// refused here: published repositories hold such entries (an index
	// naming a layer its shards left out), and a param the model needs
	// is named when it is missing (the caller's check).
	return out, nil
}

// readShardIndex reads a shard index: its weight map and the shard files
// it names, sorted.
func readShardIndex(path string) (weightMap map[string]string, shards []string, err error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, nil, fmt.Errorf("checkpoint: %w", err)
	}
	var index struct {
		WeightMap map[string]string `json:"weight_map"`
	}
	if err := json.Unmarshal(raw, &index); err != nil {
		return nil, nil, fmt.Errorf("checkpoint: %s is not a shard index (a JSON object with a weight_map): %w: %w", path, jsonerr.Decode(raw, err), ErrHeader)
	}
	if index.WeightMap == nil {
		return nil, nil, fmt.Errorf("checkpoint: %s is not a shard index: it has no weight_map (the tensors' files): %w", path, ErrHeader)
	}
	seen := map[string]bool{}
	for _, f := range index.WeightMap {
		if filepath.Base(f) != f {
			return nil, nil, fmt.Errorf("checkpoint: %s names shard %q outside its folder: %w", path, f, ErrHeader)
		}
		seen[f] = true
	}
	return index.WeightMap, sortedKeys(seen), nil
}

// IndexedFiles are the files LoadIndexed(path) reads: the index and its
// shards, or the one file; an index it cannot read names only itself
// (its load fails anyway, naming why).
func IndexedFiles(path string) []string {
	if !strings.HasSuffix(path, ".index.json") {
		return []string{path}
	}
	files := []string{path}
	// Only a regular file is read here: a FIFO would wait for a writer.
	if fi, err := os.Stat(path); err != nil || !fi.Mode().IsRegular() {
		return files
	}
	if _, shards, err := readShardIndex(path); err == nil {
		for _, f := range shards {
			files = append(files, filepath.Join(filepath.Dir(path), f))
		}
	}
	return files
}

// Describe is a checkpoint's manifest for people: the run, its state,
// the plan and what each rank wrote.
func Describe(dir string, m *Manifest) string {
	var b strings.Builder
	fmt.Fprintf(&b, "checkpoint %s (%s v%d, written %s)\n", dir, m.Format, m.Version, m.Created)
	fmt.Fprintf(&b, "model %s, fingerprint %.16s\n", m.Model, m.ModelFingerprint)
	st := m.State
	fmt.Fprintf(&b, "state: step %d, optimizer step %d, %d samples consumed, seed %d", st.Step, st.OptStep, st.Samples, st.Seed)
	if st.LossScale != nil {
		fmt.Fprintf(&b, ", loss scale %g (dynamic %v, %d clean steps)", st.LossScale.Scale, st.LossScale.Dynamic, st.LossScale.Clean)
	}
	b.WriteString("\n")
	mesh := m.Plan.Mesh
	if mesh == "" {
		mesh = "one device"
	}
	fmt.Fprintf(&b, "plan: %d device(s), mesh %s, precision %s, optimizer %s, batch %d × seq %d, plan fingerprint %.16s\n",
		m.Plan.Devices, mesh, m.Plan.Precision, m.Plan.Optimizer, m.Plan.Batch, m.Plan.Seq, m.PlanFingerprint)
	// What a resume must keep that the mesh does not show: asynchronous
	// replicas (their count and staleness) and PipeDream-2BW's second
	// weight version.
	if m.Plan.DPSync == "async" {
		fmt.Fprintf(&b, "data parallelism: asynchronous over %v replicas, staleness %v (resume with --dp-sync async and the same --dp)\n", m.Plan.Flags["dp"], flagOr(m.Plan.Flags, "staleness", "unrecorded"))
	}
	if r, ok := m.Plan.Flags["grad_reduce_dtype"].(string); ok && r != "" && r != "fp32" {
		fmt.Fprintf(&b, "gradient reductions: over the data axes in %s, each add rounded (resume with --grad-reduce-dtype %s to keep them)\n", r, r)
	}
	if m.Plan.Flags["schedule"] == "2bw" {
		b.WriteString("schedule: PipeDream-2BW, its previous weight version (2bw.prev/…) kept with the optimizer state (resume with --schedule 2bw)\n")
	}
	fmt.Fprintf(&b, "data: %s\n", orText(m.Plan.Data))
	for _, name := range sortedKeys(m.Plan.VocabTables) {
		fmt.Fprintf(&b, "vocabulary table %s: rows past %d are padding (export writes %d)\n", name, m.Plan.VocabTables[name], m.Plan.VocabTables[name])
	}
	for _, name := range sortedKeys(m.Plan.SaveEach) {
		s := m.Plan.SaveEach[name]
		layout := ""
		if s.Layout != ir.PieceAsHeld {
			layout = ", " + s.Layout
		}
		fmt.Fprintf(&b, "stacked param %s: export writes each slice as %s%s\n", name, s.Template, layout)
	}
	var params, state, pn, sn int64
	perFile := map[string]int{}
	for _, tb := range m.Tensors {
		n, _ := product(tb.Shape)
		bytes := n * int64(dtypeSizes[tb.DType])
		if tb.Kind == lower.Param.String() {
			params, pn = params+bytes, pn+n
		} else {
			state, sn = state+bytes, sn+n
		}
		for _, blk := range tb.Blocks {
			perFile[blk.File]++
		}
	}
	fmt.Fprintf(&b, "tensors: %d; params %d elements (%d bytes), optimizer state %d elements (%d bytes)\n", len(m.Tensors), pn, params, sn, state)
	var total int64
	for _, f := range sortedKeys(m.Files) {
		s := m.Files[f]
		total += s.Bytes
		fmt.Fprintf(&b, "  %-24s %12d bytes  %3d blocks  crc32c %s\n", f, s.Bytes, perFile[f], s.CRC32C)
	}
	fmt.Fprintf(&b, "  %-24s %12d bytes\n", "total", total)
	return b.String()
}

// flagOr is a recorded flag's value, or or when the run recorded none.
func flagOr(flags map[string]any, key string, or any) any {
	if v, ok := flags[key]; ok {
		return v
	}
	return or
}
