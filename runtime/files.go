package runtime

import "os"

// WriteFileAtomic writes b to path through path+".tmp", renamed over path
// once complete (as the checkpoint writer does): a reader never sees half
// a file, and a write that fails (a full disk) leaves the file that was
// there.
func WriteFileAtomic(path string, b []byte) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		return err
	}
	return nil
}
