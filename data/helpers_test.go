package data

import (
	"errors"
	"reflect"
	"strings"
	"testing"
)

// These helpers stand in for testify: testify v1.12.1 imports
// go.yaml.in/yaml/v3, which go.sum does not list yet, so tests importing it
// cannot build in this module.

func mustNoErr(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatalf("unexpected error: %v", err)
	}
}

func expect(t *testing.T, ok bool, format string, args ...any) {
	t.Helper()
	if !ok {
		t.Errorf(format, args...)
	}
}

func expectEqual(t *testing.T, want, got any, what string) {
	t.Helper()
	if !reflect.DeepEqual(want, got) {
		t.Errorf("%s: got %v, want %v", what, got, want)
	}
}

// expectErr checks that err is non-nil, mentions each of msgs, and wraps
// target when target is not nil.
func expectErr(t *testing.T, err, target error, msgs ...string) {
	t.Helper()
	if err == nil {
		t.Fatalf("got no error, want one mentioning %q", msgs)
	}
	for _, m := range msgs {
		if !strings.Contains(err.Error(), m) {
			t.Errorf("error %q does not mention %q", err, m)
		}
	}
	if target != nil && !errors.Is(err, target) {
		t.Errorf("error %q does not wrap %v", err, target)
	}
}
