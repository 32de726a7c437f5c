package prepare

import (
	"bytes"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"gcompile/internal/filekind"
)

// format is how a file's contents become documents.
type format uint8

const (
	formatText  format = iota // the whole file is one document
	formatJSONL               // one JSON object per line
)

// input is one file to read, found and checked before any work.
type input struct {
	path string
	size int64 // on disk, so compressed for .gz
	fmt  format
	gz   bool
	// folder is the folder INPUT the file was found in; "" for a file
	// named on the command line.
	folder string
}

// sniffSize is how much of a text file is looked at to tell it from a
// binary one, as package data does for its corpora.
const sniffSize = 8 << 10

// unsupported are compressed or archive suffixes Run cannot read, with what
// to do instead.
var unsupported = map[string]string{
	".zst": "decompress it first (zstd -d)", ".zstd": "decompress it first (zstd -d)",
	".xz": "decompress it first (xz -d)", ".lzma": "decompress it first (xz -d)",
	".bz2": "decompress it first (bunzip2)", ".lz4": "decompress it first (lz4 -d)",
	".br": "decompress it first (brotli -d)", ".7z": "extract it first",
	".zip": "extract it first (unzip)", ".tar": "extract it first (tar -xf)",
	".tgz": "extract it first (tar -xzf)", ".rar": "extract it first",
	".parquet": "convert it to JSON Lines first",
	".arrow":   "convert it to JSON Lines first",
}

// classify says how to read the file name.
func classify(name string) (f format, gz bool, err error) {
	lower := strings.ToLower(name)
	if base, ok := strings.CutSuffix(lower, ".gz"); ok {
		lower, gz = base, true
	}
	ext := filepath.Ext(lower)
	if fix, ok := unsupported[ext]; ok {
		return 0, false, fmt.Errorf("%s: %w: %s files cannot be read: %s", name, ErrInput, ext, fix)
	}
	switch ext {
	case ".jsonl", ".ndjson", ".json":
		return formatJSONL, gz, nil
	}
	return formatText, gz, nil
}

// collected is what collectInputs found.
type collected struct {
	files   []input
	skipped int // folder files skipped as binary
	// archives are folder files skipped as archives or compressed in a
	// format that is not read (.tar, .zip, .xz, …).
	archives int
	// duplicates are files skipped because an earlier input is the same
	// file (a symbolic link to it, or a hard link).
	duplicates int
	bytes      int64 // total size on disk
	read       map[fileID]bool
}

// readBefore says whether the file at path (info, which follows links)
// is one an earlier input already read, and if not, records it as read:
// a link in a folder to a file read through another path would put its
// documents in the dataset twice.
func (c *collected) readBefore(path string, info fs.FileInfo) bool {
	id, ok := idOf(path, info)
	if !ok {
		return false
	}
	if c.read[id] {
		return true
	}
	if c.read == nil {
		c.read = map[fileID]bool{}
	}
	c.read[id] = true
	return false
}

// collectInputs expands the inputs to files in reading order and checks
// that each exists, is readable and is what its name says, so that a bad
// input fails the run before any work. The outputs (outPrefix.bin, .idx,
// .json, .lock and their temporary files) are never inputs.
func collectInputs(paths []string, outPrefix string) (collected, error) {
	var c collected
	head := make([]byte, sniffSize)
	outAbs, err := filepath.Abs(outPrefix)
	if err != nil {
		return c, fmt.Errorf("output prefix %s: %w", outPrefix, err)
	}
	// PREFIX.jsonl is an input like any other; PREFIX.json and
	// PREFIX.json.tmp-… are not, nor the lock and a stale one set aside.
	isOutput := func(p string) bool {
		abs, err := filepath.Abs(p)
		if err != nil {
			return false
		}
		for _, ext := range []string{".bin", ".idx", ".json"} {
			if abs == outAbs+ext || strings.HasPrefix(abs, outAbs+ext+".tmp-") {
				return true
			}
		}
		return abs == outAbs+".lock" || strings.HasPrefix(abs, outAbs+".lock.stale-")
	}
	for _, p := range paths {
		info, err := os.Stat(p)
		if err != nil {
			return c, fmt.Errorf("input %s: %w: %w", p, ErrInput, bare(err))
		}
		if !info.IsDir() {
			if isOutput(p) {
				return c, fmt.Errorf("input %s: %w: it is one of the outputs (%s.bin, .idx or .json), which the run writes over: choose another output prefix", p, ErrInput, outPrefix)
			}
			in, binary, err := checkFile(p, info, head)
			if err != nil {
				return c, err
			}
			if binary {
				return c, fmt.Errorf("input %s: %w: it looks binary (a NUL byte in its first 8 KiB), not text", p, ErrInput)
			}
			if c.readBefore(p, info) {
				c.duplicates++
				continue
			}
			c.files = append(c.files, in)
			c.bytes += in.size
			continue
		}
		err = filepath.WalkDir(p, func(path string, d fs.DirEntry, err error) error {
			if err != nil {
				return fmt.Errorf("input %s: %w: %w", path, ErrInput, bare(err))
			}
			if path != p && strings.HasPrefix(d.Name(), ".") {
				if d.IsDir() {
					return filepath.SkipDir
				}
				return nil
			}
			if d.IsDir() || isOutput(path) {
				return nil
			}
			info, err := os.Stat(path) // follows a link to a file
			if err != nil {
				return fmt.Errorf("input %s: %w: %w", path, ErrInput, bare(err))
			}
			if !info.Mode().IsRegular() {
				return nil // a link to a folder, a socket, a device
			}
			if _, _, err := classify(path); err != nil {
				// An archive among a folder's files (Go's own source
				// tree holds test .tar and .zip files) is left out and
				// counted, as a binary file is; named on its own, it is
				// refused with what to do.
				c.archives++
				return nil
			}
			in, binary, err := checkFile(path, info, head)
			if err != nil {
				return err
			}
			if binary {
				c.skipped++
				return nil
			}
			if c.readBefore(path, info) {
				c.duplicates++
				return nil
			}
			in.folder = p
			c.files = append(c.files, in)
			c.bytes += in.size
			return nil
		})
		if err != nil {
			return c, err
		}
	}
	return c, nil
}

// checkFile opens path and reads its start: the gzip header of a .gz, the
// first 8 KiB of a text file (into head) to tell whether it is binary.
func checkFile(path string, info fs.FileInfo, head []byte) (in input, binary bool, err error) {
	in.path, in.size = path, info.Size()
	if !info.Mode().IsRegular() {
		return in, false, fmt.Errorf("input %s: %w: not a regular file (%s)", path, ErrInput, filekind.Of(info.Mode()))
	}
	if in.fmt, in.gz, err = classify(path); err != nil {
		return in, false, err
	}
	f, err := os.Open(path)
	if err != nil {
		return in, false, fmt.Errorf("input %s: %w: %w", path, ErrInput, bare(err))
	}
	defer f.Close()
	var r io.Reader = f
	if in.gz {
		zr, err := gzip.NewReader(f)
		if err != nil {
			return in, false, gzipErr(path, err)
		}
		r = zr
	}
	if in.fmt != formatText {
		return in, false, nil
	}
	n := 0
	for n < len(head) {
		m, err := r.Read(head[n:])
		n += m
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return in, false, readErr(path, in.gz, err)
		}
	}
	return in, bytes.IndexByte(head[:n], 0) >= 0, nil
}

// bare is err without the operation and path an *fs.PathError adds, for
// messages that name the path already; errors.Is still sees the cause.
func bare(err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}
