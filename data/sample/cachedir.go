package sample

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
)

// DefaultCacheDir is where the index of the dataset at dataPrefix lives
// when the user names no folder: beside the data, in
// <folder of the prefix>/gcompile-index, so every process and every run on
// that data shares one index; or, when that folder cannot be written (data
// on a read-only mount), in the user's cache folder
// (os.UserCacheDir()/gcompile/index), and in the system's temporary folder
// when there is no user cache folder either. Finding out may create and
// remove a probe file, but never creates the folder itself.
func DefaultCacheDir(dataPrefix string) string {
	beside := besideDir(dataPrefix)
	if writable(beside) {
		return beside
	}
	if dir, err := os.UserCacheDir(); err == nil {
		return filepath.Join(dir, "gcompile", "index")
	}
	return filepath.Join(os.TempDir(), "gcompile-index")
}

// besideDir is the index folder beside the data.
func besideDir(dataPrefix string) string {
	return filepath.Join(filepath.Dir(dataPrefix), "gcompile-index")
}

// SharedCacheDirs are the folders whose index files a run on the data at
// dataPrefix reads before building its own in cacheDir: the one beside
// the data when it exists and is not cacheDir. Whoever prepared a shared,
// read-only dataset may have built its index there, which every user
// then reads rather than build again in their own cache.
func SharedCacheDirs(dataPrefix, cacheDir string) []string {
	beside := besideDir(dataPrefix)
	if filepath.Clean(beside) == filepath.Clean(cacheDir) {
		return nil
	}
	if st, err := os.Stat(beside); err != nil || !st.IsDir() {
		return nil
	}
	return []string{beside}
}

// writable says whether files can be created in dir, or, when dir does not
// exist yet, in the nearest folder above it that does (which MkdirAll
// will then create it in).
func writable(dir string) bool {
	for {
		st, err := os.Stat(dir)
		if err == nil {
			if !st.IsDir() {
				return false
			}
			f, err := os.CreateTemp(dir, ".gcompile-probe-*")
			if err != nil {
				return false
			}
			_ = f.Close()
			_ = os.Remove(f.Name())
			return true
		}
		if !errors.Is(err, fs.ErrNotExist) {
			return false
		}
		up := filepath.Dir(dir)
		if up == dir {
			return false
		}
		dir = up
	}
}
