package nvrtc

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
)

// CacheEnv names the variable that sets the cache folder.
const CacheEnv = "GCOMPILE_CACHE"

// DefaultDir is $GCOMPILE_CACHE if set, else gcompile/cubin under the user
// cache folder (~/.cache on Linux).
func DefaultDir() (string, error) {
	if d := os.Getenv(CacheEnv); d != "" {
		return d, nil
	}
	base, err := os.UserCacheDir()
	if err != nil {
		return "", fmt.Errorf("nvrtc: no cache folder (set %s): %w", CacheEnv, err)
	}
	return filepath.Join(base, "gcompile", "cubin"), nil
}

// Request is one kernel to compile.
type Request struct {
	Name    string   // shown in compiler messages, e.g. "layernorm_fwd.cu"
	Source  string   // CUDA C++ source
	Arch    string   // real architecture, e.g. "sm_90"
	Options []string // further NVRTC options, e.g. "--std=c++17", "-default-device"
}

// archPattern accepts real (CUBIN-capable) architectures such as sm_80,
// sm_90a or sm_100f; compute_XY names a virtual one, which yields no CUBIN.
var archPattern = regexp.MustCompile(`^sm_[0-9]+[a-z]?$`)

// options is the full option list passed to the compiler.
func (r Request) options() []string {
	return append([]string{"--gpu-architecture=" + r.Arch}, r.Options...)
}

// Cache compiles through Compiler and keeps the CUBINs in Dir.
type Cache struct {
	Dir           string
	Compiler      Compiler
	DriverVersion int // from driver.Version; a new driver may want new code

	// OnWriteError, if set, receives failures to store a CUBIN, and Compile
	// still returns the freshly compiled CUBIN. If nil such a failure is
	// returned as Compile's error: a cache that silently never fills would
	// make every start slow without saying why.
	OnWriteError func(error)
}

// NewCache returns a cache in DefaultDir.
func NewCache(c Compiler, driverVersion int) (*Cache, error) {
	dir, err := DefaultDir()
	if err != nil {
		return nil, err
	}
	return &Cache{Dir: dir, Compiler: c, DriverVersion: driverVersion}, nil
}

// Key is the hex SHA-256 naming req's CUBIN. Every input is length-prefixed
// so that no two different requests hash the same bytes.
func (c *Cache) Key(req Request) (string, error) {
	major, minor, err := c.Compiler.Version()
	if err != nil {
		return "", fmt.Errorf("nvrtc: cache key for %s: %w", req.Name, err)
	}
	h := sha256.New()
	field := func(s string) {
		var n [8]byte
		binary.LittleEndian.PutUint64(n[:], uint64(len(s)))
		h.Write(n[:])
		h.Write([]byte(s))
	}
	field("gcompile cubin v1")
	field(req.Source)
	field(req.Name)
	field(req.Arch)
	field(fmt.Sprint(len(req.Options)))
	for _, o := range req.Options {
		field(o)
	}
	field(fmt.Sprintf("nvrtc %d.%d", major, minor))
	field(fmt.Sprintf("driver %d", c.DriverVersion))
	return hex.EncodeToString(h.Sum(nil)), nil
}

// Path is where req's CUBIN is stored.
func (c *Cache) Path(req Request) (string, error) {
	key, err := c.Key(req)
	if err != nil {
		return "", err
	}
	return filepath.Join(c.Dir, key+".cubin"), nil
}

// Compile returns req's CUBIN from the cache, or compiles and stores it.
func (c *Cache) Compile(req Request) ([]byte, error) {
	if !archPattern.MatchString(req.Arch) {
		return nil, fmt.Errorf("nvrtc: %s: architecture %q is not a real GPU architecture like sm_90", req.Name, req.Arch)
	}
	if c.Dir == "" || c.Compiler == nil {
		return nil, fmt.Errorf("nvrtc: %s: cache needs a folder and a compiler", req.Name)
	}
	path, err := c.Path(req)
	if err != nil {
		return nil, err
	}
	if cubin, ok := readEntry(path); ok {
		return cubin, nil
	}
	cubin, err := c.Compiler.Compile(req.Source, req.Name, req.options())
	if err != nil {
		return nil, err
	}
	if err := writeEntry(c.Dir, path, cubin); err != nil {
		err = fmt.Errorf("nvrtc: storing the CUBIN of %s in %s (set %s to a writable folder): %w", req.Name, c.Dir, CacheEnv, err)
		if c.OnWriteError == nil {
			return nil, err
		}
		c.OnWriteError(err)
	}
	return cubin, nil
}

// An entry is a magic string, the SHA-256 of the CUBIN, then the CUBIN.
var entryMagic = []byte("GCCUBIN1")

const entryHeader = 8 + sha256.Size

// readEntry returns the stored CUBIN if the file exists and is intact.
// Anything else (missing, truncated, damaged) is a miss: the CUBIN is
// compiled again and the entry rewritten.
func readEntry(path string) ([]byte, bool) {
	b, err := os.ReadFile(path)
	if err != nil || len(b) <= entryHeader || !bytes.Equal(b[:8], entryMagic) {
		return nil, false
	}
	sum := sha256.Sum256(b[entryHeader:])
	if !bytes.Equal(sum[:], b[8:entryHeader]) {
		return nil, false
	}
	return b[entryHeader:], true
}

// writeEntry stores cubin at path through a temporary file in the same
// folder and a rename, which is atomic: readers see the old entry, no entry,
// or the whole new one.
func writeEntry(dir, path string, cubin []byte) (err error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	f, err := os.CreateTemp(dir, ".cubin-*.tmp")
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			f.Close()
			if rerr := os.Remove(f.Name()); rerr != nil && !errors.Is(rerr, fs.ErrNotExist) {
				err = errors.Join(err, rerr)
			}
		}
	}()
	sum := sha256.Sum256(cubin)
	for _, part := range [][]byte{entryMagic, sum[:], cubin} {
		if _, err := f.Write(part); err != nil {
			return err
		}
	}
	if err := f.Sync(); err != nil {
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(f.Name(), path)
}
