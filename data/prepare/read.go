package prepare

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"sync/atomic"
)

// bom is the UTF-8 byte order mark some editors put at the start of a file;
// it is not text and is dropped.
var bom = []byte{0xEF, 0xBB, 0xBF}

// errStopped unwinds the reader when the run is cancelled; the writer
// reports the context's error instead.
var errStopped = errors.New("stopped")

// reader fills batches in document order; it runs on one goroutine.
type reader struct {
	p     *pipeline
	ctx   context.Context
	free  <-chan *batch
	work  chan<- *batch
	b     *batch
	seq   int
	lines *bufio.Reader
}

// readAll reads every input into batches and sends them to work, the last
// one marked; a read error ends the input there and travels in that last
// batch, so that it is reported in reading order after everything before
// it, whatever the workers' timing.
func (p *pipeline) readAll(ctx context.Context, free <-chan *batch, work chan<- *batch) {
	r := &reader{p: p, ctx: ctx, free: free, work: work}
	if !r.next() {
		return
	}
	var err error
	for i, f := range p.files {
		if err = r.file(i, f); err != nil {
			break
		}
	}
	if errors.Is(err, errStopped) {
		return
	}
	r.b.err, r.b.last = err, true
	r.send()
}

// next takes a free batch, waiting for the writer to return one: this is
// what bounds the batches in flight.
func (r *reader) next() bool {
	select {
	case r.b = <-r.free:
		r.b.reset(r.seq)
		r.seq++
		return true
	case <-r.ctx.Done():
		return false
	}
}

func (r *reader) send() bool {
	select {
	case r.work <- r.b:
		r.b = nil
		return true
	case <-r.ctx.Done():
		return false
	}
}

// added hands the batch on once it is full.
func (r *reader) added() error {
	if len(r.b.text) < batchBytes && len(r.b.docs) < batchDocs {
		return nil
	}
	if !r.send() || !r.next() {
		return errStopped
	}
	return nil
}

// countingReader adds what it reads to a counter shared with Progress.
type countingReader struct {
	r io.Reader
	n *atomic.Int64
}

func (c countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n.Add(int64(n))
	return n, err
}

// file reads input i into documents.
func (r *reader) file(i int, in input) error {
	f, err := os.Open(in.path)
	if err != nil {
		return fmt.Errorf("input %s: %w: %w", in.path, ErrInput, bare(err))
	}
	defer f.Close()
	var src io.Reader = countingReader{f, &r.p.read}
	if in.gz {
		zr, err := gzip.NewReader(src)
		if err != nil {
			return gzipErr(in.path, err)
		}
		defer zr.Close()
		src = zr
	}
	src = countingReader{src, &r.p.text}
	if in.fmt == formatJSONL {
		err = r.jsonLines(i, in, src)
	} else {
		err = r.textFile(i, in, src)
	}
	if err == nil {
		r.p.filesRead.Add(1)
	}
	return err
}

// textFile makes the whole file one document.
func (r *reader) textFile(i int, in input, src io.Reader) error {
	b := r.b
	start := len(b.text)
	hint := 0
	if !in.gz {
		hint = int(in.size)
	}
	text, err := appendAll(b.text, src, hint)
	b.text = text
	if err != nil {
		return readErr(in.path, in.gz, err)
	}
	if bytes.HasPrefix(b.text[start:], bom) {
		start += len(bom)
	}
	b.docs = append(b.docs, docRef{file: i, start: start, end: len(b.text)})
	return r.added()
}

// appendAll appends all of src to dst, growing it once to hint bytes when
// the size is known.
func appendAll(dst []byte, src io.Reader, hint int) ([]byte, error) {
	if hint > 0 {
		dst = slices.Grow(dst, hint+1) // geometric, so many small files cost linear time
	}
	for {
		if len(dst) == cap(dst) {
			dst = append(dst, 0)[:len(dst)]
		}
		n, err := src.Read(dst[len(dst):cap(dst)])
		dst = dst[:len(dst)+n]
		if errors.Is(err, io.EOF) {
			return dst, nil
		}
		if err != nil {
			return dst, err
		}
	}
}

// jsonLines makes each non-blank line a document; its JSON is parsed by
// the workers.
func (r *reader) jsonLines(i int, in input, src io.Reader) error {
	if r.lines == nil {
		r.lines = bufio.NewReaderSize(src, 1<<20)
	} else {
		r.lines.Reset(src)
	}
	defer r.lines.Reset(nil)
	for line := int64(1); ; line++ {
		b := r.b
		start := len(b.text)
		eof := false
		for {
			chunk, err := r.lines.ReadSlice('\n')
			b.text = append(b.text, chunk...)
			if errors.Is(err, bufio.ErrBufferFull) {
				continue
			}
			if errors.Is(err, io.EOF) {
				eof = true
			} else if err != nil {
				return readErr(in.path, in.gz, err)
			}
			break
		}
		end := len(b.text)
		if eof && end == start {
			return nil // past the last line's newline: no line
		}
		for end > start && (b.text[end-1] == '\n' || b.text[end-1] == '\r') {
			end--
		}
		if line == 1 && bytes.HasPrefix(b.text[start:end], bom) {
			start += len(bom)
		}
		if len(bytes.TrimSpace(b.text[start:end])) == 0 {
			b.text = b.text[:start]
			r.p.blank.Add(1)
		} else {
			b.docs = append(b.docs, docRef{file: i, line: line, start: start, end: end})
			if err := r.added(); err != nil {
				return err
			}
		}
		if eof {
			return nil
		}
	}
}
