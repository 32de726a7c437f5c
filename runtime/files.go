package runtime

import (
	"fmt"
	"os"
	"path/filepath"
)

// createTemp makes the temporary file WriteFileAtomic writes; a variable
// so a test can make the write fail as a full disk does.
var createTemp = os.CreateTemp

// WriteFileAtomic writes b to path through a temporary file of its own in
// path's folder, renamed over path once complete and synced (as the
// checkpoint writer does): a reader never sees half a file, a write that
// fails (a full disk) leaves the file that was there and no temporary
// file, and no other file beside path is touched (a fixed temporary name
// would overwrite a user's file of that name).
func WriteFileAtomic(path string, b []byte) (err error) {
	f, err := createTemp(filepath.Dir(path), "."+filepath.Base(path)+".*.tmp")
	if err != nil {
		return fmt.Errorf("write %s: temporary file: %w", path, err)
	}
	tmp := f.Name()
	defer func() {
		if err != nil {
			_ = f.Close() // already failing; the first error says why
			_ = os.Remove(tmp)
		}
	}()
	// CreateTemp makes the file private; outputs are read by others as
	// os.WriteFile's would be.
	if err := f.Chmod(0o644); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if _, err := f.Write(b); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := f.Sync(); err != nil {
		return fmt.Errorf("write %s: sync: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("write %s: close: %w", path, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}
