package kerchunk_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/zarrfs/zarrfs/objectstore"
	"github.com/zarrfs/zarrfs/objectstore/kerchunk"
	"github.com/zarrfs/zarrfs/objectstore/storetest"
	"github.com/zarrfs/zarrfs/objectstore/targets"
)

// writeRefs lays files out as a reference set in dir: every third file
// inline (base64 or plain), the others ranges of one "archive" target file
// or whole target files, and returns the path of refs.json.
func writeRefs(t *testing.T, dir string, files map[string][]byte) string {
	t.Helper()
	keys := make([]string, 0, len(files))
	for k := range files {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	refs := map[string]any{}
	var archive []byte
	archive = append(archive, "header bytes"...)
	for i, k := range keys {
		b := files[k]
		switch {
		case i%3 == 0 && isASCII(b):
			refs[k] = string(b)
		case i%3 == 0:
			refs[k] = "base64:" + base64.StdEncoding.EncodeToString(b)
		case i%3 == 1:
			name := "whole" + string(rune('a'+i)) + ".bin"
			if err := os.WriteFile(filepath.Join(dir, "data", name), b, 0o644); err != nil {
				t.Fatal(err)
			}
			refs[k] = []any{"data/" + name}
		default:
			refs[k] = []any{"{{d}}/archive.nc", len(archive), len(b)}
			archive = append(archive, b...)
			archive = append(archive, "gap"...)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "data", "archive.nc"), archive, 0o644); err != nil {
		t.Fatal(err)
	}
	doc, _ := json.Marshal(map[string]any{"version": 1, "templates": map[string]string{"d": filepath.Join(dir, "data")}, "refs": refs})
	p := filepath.Join(dir, "refs.json")
	if err := os.WriteFile(p, doc, 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func isASCII(b []byte) bool {
	for _, c := range b {
		if c >= 0x80 || c < 0x20 {
			return false
		}
	}
	return true
}

// open opens the reference set at path, local targets confined to its
// folder, relative URLs resolved against it.
func open(t *testing.T, path string) *kerchunk.Store {
	t.Helper()
	dir := filepath.Dir(path)
	tg, err := targets.New(targets.Options{Base: dir, Scope: targets.Scope{Places: []targets.Place{{Prefix: dir, Name: "the reference set's folder"}}}})
	if err != nil {
		t.Fatal(err)
	}
	d, err := objectstore.OpenPosix(dir)
	if err != nil {
		t.Fatal(err)
	}
	s, err := kerchunk.Open(context.Background(), d, filepath.Base(path), kerchunk.Options{Targets: tg})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func TestConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T, files map[string][]byte) objectstore.Store {
		dir := t.TempDir()
		os.Mkdir(filepath.Join(dir, "data"), 0o755)
		return open(t, writeRefs(t, dir, files))
	})
}

func TestTargetFaults(t *testing.T) {
	dir := t.TempDir()
	os.Mkdir(filepath.Join(dir, "data"), 0o755)
	os.WriteFile(filepath.Join(dir, "data", "f.nc"), []byte("0123456789"), 0o644)
	os.Symlink("/etc", filepath.Join(dir, "data", "etc"))
	refs := map[string]any{
		"good":     []any{"data/f.nc", 2, 3},
		"past-end": []any{"data/f.nc", 8, 5},
		"missing":  []any{"data/nope.nc", 0, 1},
		"scheme":   []any{"ftp://host/x.nc", 0, 1},
		"shadow":   []any{"/etc/shadow", 0, 1},
		"fileurl":  []any{"file:///etc/passwd", 0, 1},
		"dotdot":   []any{"data/../../../etc/passwd", 0, 1},
		"link":     []any{"data/etc/passwd", 0, 1},
	}
	doc, _ := json.Marshal(map[string]any{"version": 1, "refs": refs})
	os.WriteFile(filepath.Join(dir, "refs.json"), doc, 0o644)
	s := open(t, filepath.Join(dir, "refs.json"))
	ctx := context.Background()
	if b, err := s.Get(ctx, "good"); err != nil || string(b) != "234" {
		t.Fatalf("good: %q, %v", b, err)
	}
	for key, want := range map[string]error{
		"past-end": objectstore.ErrRange,
		"missing":  targets.ErrTargetMissing,
		"scheme":   targets.ErrScheme,
		"shadow":   targets.ErrOutOfScope,
		"fileurl":  targets.ErrOutOfScope,
		"dotdot":   targets.ErrOutOfScope,
		"link":     objectstore.ErrOutsideStore,
	} {
		_, err := s.Get(ctx, key)
		if !errors.Is(err, want) {
			t.Errorf("%s: %v, want %v", key, err, want)
			continue
		}
		// A target the reference names outside its folder is the scope's
		// refusal, which says nothing of links; only a real link is.
		if want == targets.ErrOutOfScope && (!strings.Contains(err.Error(), "outside the reference set's folder "+dir) || strings.Contains(err.Error(), "link")) {
			t.Errorf("%s: %q, want the folder named and no word of links", key, err)
		}
		if objectstore.IsNotFound(err) {
			t.Errorf("%s: %v reads as a missing key (a fill value)", key, err)
		}
		if msg := err.Error(); !strings.Contains(msg, key) || strings.Count(msg, "\n") > 0 {
			t.Errorf("%s: error %q does not name the key on one line", key, msg)
		}
	}
	// A listing lists every key, those that cannot be read too.
	n := 0
	if err := s.ListVersions(ctx, "", func(k, v string) { n++ }); err != nil || n != len(refs) {
		t.Fatalf("ListVersions: %d keys, %v", n, err)
	}
}

func TestMalformed(t *testing.T) {
	for name, doc := range map[string]string{
		"syntax":     `{"version": 1, "refs": {`,
		"version":    `{"version": 2, "refs": {}}`,
		"list":       `{"version": 1, "refs": {"a": ["x", 1]}}`,
		"negative":   `{"version": 1, "refs": {"a": ["x", -1, 4]}}`,
		"base64":     `{"version": 1, "refs": {"a": "base64:!!"}}`,
		"key":        `{"version": 1, "refs": {"../a": "x"}}`,
		"gen":        `{"version": 1, "gen": [{"key": "a/{{i}}", "url": "u", "dimensions": {"i": {"stop": 3}}, "offset": "{{ i ** 2 }}", "length": "1"}], "refs": {}}`,
		"gen-huge":   `{"version": 1, "gen": [{"key": "a/{{i}}", "url": "u", "dimensions": {"i": {"stop": 100000}, "j": {"stop": 100000}}}], "refs": {}}`,
		"norefs":     `{"version": 1}`,
		"not-an-obj": `[1, 2]`,
	} {
		dir := t.TempDir()
		os.WriteFile(filepath.Join(dir, "refs.json"), []byte(doc), 0o644)
		tg, _ := targets.New(targets.Options{})
		d, _ := objectstore.OpenPosix(dir)
		_, err := kerchunk.Open(context.Background(), d, "refs.json", kerchunk.Options{Targets: tg})
		if !errors.Is(err, kerchunk.ErrMalformed) || !strings.Contains(err.Error(), "refs.json") {
			t.Errorf("%s: %v, want ErrMalformed naming the file", name, err)
		}
	}
}

func TestGenerators(t *testing.T) {
	dir := t.TempDir()
	doc := `{"version": 1, "templates": {"u": "s3://bucket/era5"},
	  "gen": [{"key": "t/{{i}}.{{j}}", "url": "{{u}}/f{{i}}.nc", "offset": "{{ 1000 + (i*3 + j) * 10 }}", "length": "{{10 - j % 2}}",
	           "dimensions": {"i": {"start": 1, "stop": 4}, "j": [0, 1, 2]}}],
	  "refs": {"t/.zarray": "{}"}}`
	os.WriteFile(filepath.Join(dir, "refs.json"), []byte(doc), 0o644)
	var got []string
	fake := func(ctx context.Context, root string) (objectstore.Store, error) {
		return recordStore{root: root, got: &got}, nil
	}
	tg, _ := targets.New(targets.Options{Openers: targets.Openers{"s3": fake},
		Scope: targets.Scope{Places: []targets.Place{{Prefix: "s3://bucket/era5/", Name: "the test's bucket"}}}})
	d, _ := objectstore.OpenPosix(dir)
	s, err := kerchunk.Open(context.Background(), d, "refs.json", kerchunk.Options{Targets: tg})
	if err != nil {
		t.Fatal(err)
	}
	names, err := s.List(context.Background(), "t")
	if err != nil || len(names) != 10 {
		t.Fatalf("List(t) = %v, %v", names, err)
	}
	if _, err := s.Get(context.Background(), "t/2.1"); err != nil {
		t.Fatal(err)
	}
	if want := "s3://bucket era5/f2.nc 1070+9"; len(got) != 1 || got[0] != want {
		t.Fatalf("read %v, want %q", got, want)
	}
}

// recordStore records the ranges asked of it.
type recordStore struct {
	root string
	got  *[]string
}

func (r recordStore) ID() string { return r.root }
func (recordStore) Close() error { return nil }
func (r recordStore) Get(ctx context.Context, key string) ([]byte, error) {
	return nil, objectstore.ErrNotFound
}
func (r recordStore) GetRange(ctx context.Context, key string, off, n int64) ([]byte, error) {
	*r.got = append(*r.got, r.root+" "+key+" "+itoa(off)+"+"+itoa(n))
	return make([]byte, n), nil
}
func (r recordStore) List(ctx context.Context, prefix string) ([]string, error) { return nil, nil }

func itoa(n int64) string { return strconv.FormatInt(n, 10) }
