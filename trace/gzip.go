// This file holds GzipReader, the decompressor of gzip input that reads as
// gzip(1) does: every member, then trailing bytes ignored with a warning.

package trace

import (
	"bufio"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
)

// IsGzip reports whether head, the first bytes of an input, opens a gzip
// stream.
func IsGzip(head []byte) bool {
	return len(head) >= 2 && head[0] == gzipMagic[0] && head[1] == gzipMagic[1]
}

// GzipReader decompresses a gzip file as gzip(1) does. It reads every
// member of a file made by concatenating gzip files; after the last
// member, it ignores zero bytes (padding) silently and other bytes with a
// warning, as gzip(1) does ("decompression OK, trailing garbage ignored"),
// instead of failing on them. A file cut short is an error, as is a
// damaged member. Reader and the importers (trace/convert) decompress
// with it.
//
// A GzipReader is not safe for concurrent use.
type GzipReader struct {
	src     *bufio.Reader
	gz      *gzip.Reader
	warning string
	eof     bool
}

// NewGzipReader returns a GzipReader of the gzip data in src, whose first
// member's header it reads.
func NewGzipReader(src *bufio.Reader) (*GzipReader, error) {
	gz, err := gzip.NewReader(src)
	if err != nil {
		return nil, gzipError(err)
	}
	gz.Multistream(false)
	return &GzipReader{src: src, gz: gz}, nil
}

// Read reads decompressed bytes.
func (g *GzipReader) Read(p []byte) (int, error) {
	for !g.eof {
		n, err := g.gz.Read(p)
		if err != io.EOF {
			return n, gzipError(err)
		}
		if err := g.nextMember(); err != nil {
			return n, err
		}
		if n > 0 {
			return n, nil
		}
	}
	return 0, io.EOF
}

// Warning returns what the GzipReader ignored, once it has read to the
// end: "" or a sentence about the trailing garbage.
func (g *GzipReader) Warning() string { return g.warning }

// Close releases the decompressor. It does not close the source.
func (g *GzipReader) Close() error { return g.gz.Close() }

// nextMember moves past the end of a member: into the next member when
// gzip's magic bytes follow, else to the end of the data.
func (g *GzipReader) nextMember() error {
	head, err := g.src.Peek(2)
	switch {
	case len(head) == 0 && err == io.EOF:
		g.eof = true
		return nil
	case IsGzip(head):
		if err := g.gz.Reset(g.src); err != nil {
			return gzipError(err)
		}
		g.gz.Multistream(false)
		return nil
	}
	// Trailing bytes: only zeros may follow silently.
	g.eof = true
	for {
		b, err := g.src.ReadByte()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return fmt.Errorf("gzip: reading after the compressed data: %w", err)
		}
		if b != 0 {
			g.warning = "gzip: decompression OK, trailing garbage ignored"
			return nil
		}
	}
}

// gzipError says what a decompression error means for the file.
func gzipError(err error) error {
	switch {
	case err == nil || err == io.EOF:
		return err
	case errors.Is(err, io.ErrUnexpectedEOF):
		return fmt.Errorf("gzip: the compressed data is cut short: %w", err)
	case errors.Is(err, gzip.ErrHeader), errors.Is(err, gzip.ErrChecksum):
		return err
	}
	return fmt.Errorf("gzip: %w", err)
}
