// Package jsonerr words the errors of decoding a JSON file the user
// wrote or edited (a hardware description, calibration points, a
// checkpoint's manifest, a safetensors header) by what is wrong in the
// file, where encoding/json names Go types and struct fields: the key and
// the kind of value wanted, the line and column of a syntax error, a file
// that is empty, cut short or starts with a byte-order mark.
package jsonerr

import (
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"reflect"
	"strings"
	"unicode"
)

// jsonError is a JSON decoding error said in the user's terms, the
// decoder's own error kept beneath it (errors.As finds a
// *json.SyntaxError, errors.Is io.ErrUnexpectedEOF).
type jsonError struct {
	msg string
	err error
}

func (e *jsonError) Error() string { return e.msg }
func (e *jsonError) Unwrap() error { return e.err }

func jsonErr(err error, format string, args ...any) error {
	return &jsonError{msg: fmt.Sprintf(format, args...), err: err}
}

// Value says a value of the wrong JSON type by the key the user
// wrote ("tp is a JSON string, want a whole number"), where encoding/json
// names the Go struct field it was decoding into (and an embedded
// struct's Go name before the key); any other error is returned as it is.
func Value(err error) error {
	var te *json.UnmarshalTypeError
	if !errors.As(err, &te) {
		return err
	}
	if te.Field == "" {
		// The whole document: a list where an object belongs.
		want := map[reflect.Kind]string{reflect.Struct: "a JSON object", reflect.Map: "a JSON object", reflect.Slice: "a JSON list"}[te.Type.Kind()]
		return jsonErr(err, "the file is a JSON %s, want %s", te.Value, cmp.Or(want, te.Type.String()))
	}
	var keys []string
	for _, k := range strings.Split(te.Field, ".") {
		if k != "" && !unicode.IsUpper(rune(k[0])) { // JSON keys here are lower case; Go names are not
			keys = append(keys, k)
		}
	}
	key := cmp.Or(strings.Join(keys, "."), te.Field)
	want := map[reflect.Kind]string{reflect.Float64: "a number", reflect.Int: "a whole number", reflect.Int64: "a whole number", reflect.Bool: "true or false",
		reflect.String: "a string", reflect.Pointer: "a number", reflect.Map: "a JSON object", reflect.Struct: "a JSON object", reflect.Slice: "a JSON list"}[te.Type.Kind()]
	want = cmp.Or(want, te.Type.String())
	if n, ok := strings.CutPrefix(te.Value, "number "); ok {
		if te.Type.Kind() == reflect.Int && strings.ContainsAny(n, ".eE") {
			return jsonErr(err, "%s is %s, want a whole number", key, n)
		}
		return jsonErr(err, "%s: %s is out of range of %s", key, n, want)
	}
	return jsonErr(err, "%s is a JSON %s, want %s", key, te.Value, want)
}

// Decode is Value for a document's decoding errors, and says
// too where the document is not JSON, by line and column of data (a
// syntax error's offset alone is a byte count), that it ends early (a
// file cut short, where encoding/json says "unexpected EOF"), or that it
// starts with a byte-order mark, which JSON does not allow.
func Decode(data []byte, err error) error {
	if bytes.HasPrefix(data, []byte("\xef\xbb\xbf")) {
		return jsonErr(err, "the file starts with a UTF-8 byte-order mark, which JSON does not allow: save it without one")
	}
	var se *json.SyntaxError
	switch {
	case len(bytes.TrimSpace(data)) == 0:
		return jsonErr(err, "the file is empty")
	case errors.As(err, &se) && se.Offset >= int64(len(bytes.TrimRight(data, " \t\r\n"))):
		return jsonErr(err, "the JSON ends before it is complete (is the file cut short?)")
	case errors.As(err, &se):
		before := data[:min(max(se.Offset-1, 0), int64(len(data)))]
		line := bytes.Count(before, []byte("\n")) + 1
		col := len(before) - bytes.LastIndexByte(before, '\n')
		if strings.Contains(se.Error(), "after top-level value") {
			return jsonErr(err, "data after the JSON value, at line %d, column %d", line, col)
		}
		return jsonErr(err, "not JSON at line %d, column %d: %v", line, col, se)
	case errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, io.EOF):
		return jsonErr(err, "the JSON ends before it is complete (is the file cut short?)")
	}
	return Value(err)
}
