//go:build !linux

package main

// freeBytes cannot tell the free space here.
func freeBytes(string) (int64, bool) { return 0, false }

// sameFileSystem cannot tell here: the outputs' room is checked one by one.
func sameFileSystem(string, string) bool { return false }
