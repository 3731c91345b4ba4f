package objectstore

import (
	"strings"
	"testing"
)

func TestParseContentRange(t *testing.T) {
	tests := []struct {
		in                 string
		first, last, total int64
		ok                 bool
	}{
		{"bytes 0-9/10", 0, 9, 10, true},
		{"bytes 100-199/1000", 100, 199, 1000, true},
		{"bytes 5-4/10", 0, 0, 0, false},
		{"bytes 0-10/10", 0, 0, 0, false},
		{"bytes 0-9/*", 0, 0, 0, false},
		{"bytes */10", 0, 0, 0, false},
		{"items 0-9/10", 0, 0, 0, false},
		{"bytes -1-9/10", 0, 0, 0, false},
		{"", 0, 0, 0, false},
	}
	for _, tc := range tests {
		f, l, n, err := parseContentRange(tc.in)
		if (err == nil) != tc.ok || (tc.ok && (f != tc.first || l != tc.last || n != tc.total)) {
			t.Errorf("parseContentRange(%q) = %d, %d, %d, %v", tc.in, f, l, n, err)
		}
	}
}

// FuzzParseContentRange: whatever a server sends, an accepted range is
// consistent (0 <= first <= last < total), so slicing by it cannot panic.
func FuzzParseContentRange(f *testing.F) {
	for _, s := range []string{"bytes 0-9/10", "bytes 100-199/1000", "bytes 0-9/*", "bytes -5-3/2", "bytes 9223372036854775806-9223372036854775807/9223372036854775807"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		first, last, total, err := parseContentRange(s)
		if err == nil && !(0 <= first && first <= last && last < total) {
			t.Fatalf("%q accepted as %d-%d/%d", s, first, last, total)
		}
	})
}

// FuzzParseS3URL: an accepted URL yields a bucket and a clean prefix, and
// whatever precedes an "@" never shows in an error.
func FuzzParseS3URL(f *testing.F) {
	for _, s := range []string{"s3://b/p", "s3://b", "s3://key:secret@b/p", "s3://b/../x", "s3://b//a//b/", "s3:///x"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		bucket, prefix, err := ParseS3URL(s)
		if err != nil {
			if user, _, ok := strings.Cut(strings.TrimPrefix(s, "s3://"), "@"); ok && len(user) > 3 && strings.HasPrefix(s, "s3://") &&
				!strings.Contains(user, "/") && strings.Contains(err.Error(), user) {
				t.Fatalf("error %q repeats the userinfo", err)
			}
			return
		}
		if bucket == "" || strings.Contains(bucket, "/") {
			t.Fatalf("%q: bucket %q", s, bucket)
		}
		if prefix != "" {
			if c, err := CleanKey(prefix, false); err != nil || c != prefix {
				t.Fatalf("%q: prefix %q is not clean", s, prefix)
			}
		}
	})
}
