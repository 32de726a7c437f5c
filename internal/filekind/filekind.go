// Package filekind names a file's kind in words, for the errors that
// refuse an input or output that is not a regular file: "a named pipe"
// tells a user what they gave, where Go's mode string ("p---------",
// "Dc---------") does not.
package filekind

import "io/fs"

// Of is the kind of file m is the mode of, with its article: "a named
// pipe", "a character device", "a folder", "a file".
func Of(m fs.FileMode) string {
	switch {
	case m.IsRegular():
		return "a file"
	case m.IsDir():
		return "a folder"
	case m&fs.ModeSymlink != 0:
		return "a symbolic link"
	case m&fs.ModeNamedPipe != 0:
		return "a named pipe"
	case m&fs.ModeSocket != 0:
		return "a socket"
	case m&fs.ModeCharDevice != 0:
		return "a character device"
	case m&fs.ModeDevice != 0:
		return "a block device"
	}
	return "a special file"
}
