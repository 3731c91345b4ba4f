package cache

import (
	"bytes"
	"errors"
	"fmt"
	"hash/crc32"
	"strconv"
)

// The journal (Dir/journal) is the index: a text file of records, one a
// line, each ending in a CRC-32C of the line, so a record torn by a crash
// or a power loss is recognised and ignored. Every instance appends to it
// with O_APPEND (one write per record) and reads what the others appended
// ("tailing"), which is how a mount and a concurrent `zarrfs warm` share one
// index and one budget. It is rewritten (compacted) only by an instance that
// holds the directory lock for writing, i.e. that is alone.
//
//	zarrfs-cache 3                                       header
//	A <writer> <size> <sum> <ident> "<rel path>" <crc>   entry added (appended before the link)
//	D <writer> 0 0 - "<rel path>" <crc>                  entry deleted (appended before the unlink)
//	M - 0 0 - "" <crc>                                   everything above was verified
//	Q <writer> 0 0 - "" <crc>                            writer closed cleanly
//
// <sum> is the file's checksum (checksum.go): "t" and the segment hash in
// hex, or the xxh64 in hex, as journals before version 3 hold and as an
// instance writes that joined one of them. <ident> is the blob's identity
// (BlobKey.Identity), "-" for none: what the bytes were built from,
// recorded in the same checksummed line as their checksum, so a blob
// verified after a crash is also known to be the version its record names.
// A chunk's <ident> is the tag of the store it came from (storeTag), or
// "-" (chunks kept before stores were recorded); an add record of a chunk
// already indexed records its store (ChunkTier.Put).
// Version 1 journals have no <ident> field; they are read as records
// without one. Journals of versions 1 and 2 are rewritten as version 3 at
// the next compaction, their records keeping their xxh64; a release before
// version 3 cannot read a journal of version 3 (and empties the cache when
// it opens it alone).
//
// Records after the last M whose writer never wrote Q came from an instance
// that was killed: they are "suspicious", and the next exclusive Open checks
// their files against the recorded size and checksum.
const journalHeader = "zarrfs-cache 3\n"

// journalHeaderV2 is the header of journals written before segment hashes:
// every checksum is an xxh64, and releases before version 3 share them.
const journalHeaderV2 = "zarrfs-cache 2\n"

// journalHeaderV1 is the header of journals written before identities.
const journalHeaderV1 = "zarrfs-cache 1\n"

const (
	opAdd    = 'A'
	opDel    = 'D'
	opMarker = 'M'
	opQuit   = 'Q'
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

var errBadRecord = errors.New("bad journal record")

type record struct {
	op     byte
	writer string
	size   int64
	sum    checksum
	ident  string // "" for none
	key    string
}

// appendRecord appends r as one journal line to dst.
func appendRecord(dst []byte, r record) []byte {
	start := len(dst)
	dst = append(dst, r.op, ' ')
	if r.writer == "" {
		dst = append(dst, '-')
	} else {
		dst = append(dst, r.writer...)
	}
	dst = append(dst, ' ')
	dst = strconv.AppendInt(dst, r.size, 10)
	dst = append(dst, ' ')
	if r.sum.tree {
		dst = append(dst, 't')
	}
	dst = strconv.AppendUint(dst, r.sum.v, 16)
	dst = append(dst, ' ')
	if r.ident == "" {
		dst = append(dst, '-')
	} else {
		dst = append(dst, r.ident...)
	}
	dst = append(dst, ' ')
	dst = appendQuoted(dst, r.key)
	crc := crc32.Checksum(dst[start:], castagnoli)
	dst = append(dst, ' ')
	dst = strconv.AppendUint(dst, uint64(crc), 16)
	return append(dst, '\n')
}

// parseRecord parses one line without its newline. intern deduplicates the
// writer ids, which repeat on every line.
func parseRecord(line []byte, intern map[string]string) (record, error) {
	var r record
	sp := bytes.LastIndexByte(line, ' ')
	if sp < 0 {
		return r, errBadRecord
	}
	crc, err := strconv.ParseUint(string(line[sp+1:]), 16, 32)
	if err != nil || uint32(crc) != crc32.Checksum(line[:sp], castagnoli) {
		return r, errBadRecord
	}
	body := line[:sp]
	fields := make([][]byte, 0, 4)
	for len(fields) < 4 {
		i := bytes.IndexByte(body, ' ')
		if i < 0 {
			return r, errBadRecord
		}
		fields = append(fields, body[:i])
		body = body[i+1:]
	}
	if len(fields[0]) != 1 {
		return r, errBadRecord
	}
	r.op = fields[0][0]
	if w := fields[1]; !(len(w) == 1 && w[0] == '-') {
		s, ok := intern[string(w)]
		if !ok {
			s = string(w)
			intern[s] = s
		}
		r.writer = s
	}
	if r.size, err = strconv.ParseInt(string(fields[2]), 10, 64); err != nil || r.size < 0 {
		return r, errBadRecord
	}
	sum := fields[3]
	if r.sum.tree = len(sum) > 0 && sum[0] == 't'; r.sum.tree {
		sum = sum[1:]
	}
	if r.sum.v, err = strconv.ParseUint(string(sum), 16, 64); err != nil {
		return r, errBadRecord
	}
	// An identity field, unless the line is version 1's (the key follows).
	if len(body) > 0 && body[0] != '"' {
		i := bytes.IndexByte(body, ' ')
		if i < 0 {
			return r, errBadRecord
		}
		if id := body[:i]; !(len(id) == 1 && id[0] == '-') {
			if !ValidIdentity(string(id)) {
				return r, errBadRecord
			}
			r.ident = string(id)
		}
		body = body[i+1:]
	}
	if r.key, err = unquote(body); err != nil {
		return r, errBadRecord
	}
	switch r.op {
	case opAdd, opDel:
		if err := checkRel(r.key); err != nil {
			return r, errBadRecord
		}
	case opMarker, opQuit:
	default:
		return r, errBadRecord
	}
	return r, nil
}

// scanRecords calls fn for every well-formed complete line in buf and
// returns how many bytes it consumed: up to the end of the last complete
// line. A line still being appended by another instance (no newline yet) is
// left for the next scan; a complete line that fails its CRC is skipped
// (torn by a crash) and counted in bad.
func scanRecords(buf []byte, intern map[string]string, fn func(record)) (consumed int, bad int) {
	for {
		nl := bytes.IndexByte(buf[consumed:], '\n')
		if nl < 0 {
			return consumed, bad
		}
		line := buf[consumed : consumed+nl]
		consumed += nl + 1
		r, err := parseRecord(line, intern)
		if err != nil {
			bad++
			continue
		}
		fn(r)
	}
}

// checkHeader accepts the current header and those of versions 1 and 2,
// which have the same length.
func checkHeader(buf []byte) error {
	for _, h := range []string{journalHeader, journalHeaderV2, journalHeaderV1} {
		if bytes.HasPrefix(buf, []byte(h)) {
			return nil
		}
	}
	return fmt.Errorf("%w: unknown journal header", errBadRecord)
}

// segmentSums reports whether a journal that begins with buf takes segment
// hashes: version 3. An instance sharing a journal of an earlier version
// writes xxh64, which the releases sharing it read.
func segmentSums(buf []byte) bool { return bytes.HasPrefix(buf, []byte(journalHeader)) }

// ValidIdentity reports whether s can be a BlobKey.Identity: 1 to 128
// characters of letters, digits and "._:=+-", so that it is one field of a
// journal line.
func ValidIdentity(s string) bool {
	if s == "" || len(s) > 128 || s == "-" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		ok := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' ||
			c == '.' || c == '_' || c == ':' || c == '=' || c == '+' || c == '-'
		if !ok {
			return false
		}
	}
	return true
}

// appendQuoted quotes s as strconv.Quote does, without its per-rune work
// for the usual key of plain printable ASCII: a restart reads and a
// compaction writes one key per entry.
func appendQuoted(dst []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c >= 0x7f || c == '"' || c == '\\' {
			return strconv.AppendQuote(dst, s)
		}
	}
	dst = append(dst, '"')
	dst = append(dst, s...)
	return append(dst, '"')
}

func unquote(b []byte) (string, error) {
	if len(b) >= 2 && b[0] == '"' && b[len(b)-1] == '"' && bytes.IndexByte(b, '\\') < 0 {
		inner := b[1 : len(b)-1]
		if bytes.IndexByte(inner, '"') < 0 {
			return string(inner), nil
		}
	}
	return strconv.Unquote(string(b))
}
