package targets_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/zarrfs/zarrfs/objectstore"
	"github.com/zarrfs/zarrfs/objectstore/storetest"
	"github.com/zarrfs/zarrfs/objectstore/targets"
)

// memIndex is an Index held in a map, as a format's parser would build.
type memIndex map[string]targets.Ref

func (m memIndex) Lookup(_ context.Context, key string) (targets.Ref, bool, error) {
	r, ok := m[key]
	return r, ok, nil
}

func (m memIndex) Children(_ context.Context, dir string) ([]string, error) {
	pre := ""
	if dir != "" {
		pre = dir + "/"
	}
	seen := map[string]bool{}
	var out []string
	for k := range m {
		rest, ok := strings.CutPrefix(k, pre)
		if !ok {
			continue
		}
		name, _, sub := strings.Cut(rest, "/")
		if sub {
			name += "/"
		}
		if !seen[name] {
			seen[name] = true
			out = append(out, name)
		}
	}
	sort.Strings(out)
	return out, nil
}

func (m memIndex) Each(_ context.Context, prefix string, fn func(string, targets.Ref)) error {
	pre := ""
	if prefix != "" {
		pre = prefix + "/"
	}
	for k, r := range m {
		if strings.HasPrefix(k, pre) {
			fn(k, r)
		}
	}
	return nil
}

// virtualStore lays files out as every kind of reference: inline bytes,
// ranges of one archive file, whole files (by URL), and ranges of an
// immutable object of a store the index names itself.
func virtualStore(t *testing.T, files map[string][]byte) (*targets.Store, string) {
	t.Helper()
	dir := t.TempDir()
	objects := t.TempDir()
	repo, err := objectstore.OpenPosix(objects)
	if err != nil {
		t.Fatal(err)
	}
	tg, err := targets.New(targets.Options{Base: dir, Scope: targets.Scope{Places: []targets.Place{{Prefix: dir, Name: "the reference set's folder"}}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tg.Close(); repo.Close() })
	keys := make([]string, 0, len(files))
	for k := range files {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	idx := memIndex{}
	archive := []byte("header")
	for i, k := range keys {
		b := files[k]
		switch i % 4 {
		case 0:
			idx[k] = targets.Ref{Inline: true, Data: b}
		case 1:
			idx[k] = targets.Ref{URL: "archive.nc", Off: int64(len(archive)), N: int64(len(b))}
			archive = append(append(archive, b...), "gap"...)
		case 2:
			name := "whole" + strconv.Itoa(i)
			if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
				t.Fatal(err)
			}
			idx[k] = targets.Ref{URL: "file://" + filepath.Join(dir, name), N: -1}
		case 3:
			name := "chunk" + strconv.Itoa(i)
			if err := os.WriteFile(filepath.Join(objects, name), append([]byte("pad"), b...), 0o644); err != nil {
				t.Fatal(err)
			}
			idx[k] = targets.Ref{Object: targets.Target{Store: repo, Key: name, URL: repo.ID() + "/" + name},
				Version: "n" + name, Off: 3, N: int64(len(b))}
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "archive.nc"), archive, 0o644); err != nil {
		t.Fatal(err)
	}
	return targets.NewStore("virtual://test", tg, func() targets.Index { return idx }), dir
}

func TestStoreConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T, files map[string][]byte) objectstore.Store {
		s, _ := virtualStore(t, files)
		return s
	})
}

// A key whose target fails reads fails (never as a missing key), and
// lists with a version of its own; Check vetoes a target's version.
func TestStoreTargetFaults(t *testing.T) {
	s, dir := virtualStore(t, map[string][]byte{"a": []byte("0123456789")})
	os.WriteFile(filepath.Join(dir, "f.nc"), []byte("0123456789"), 0o644)
	stale := errors.New("stale")
	idx := memIndex{
		"good":    {URL: "f.nc", Off: 2, N: 3},
		"missing": {URL: "nope.nc", Off: 0, N: 1},
		"scheme":  {URL: "ftp://host/x.nc", Off: 0, N: 1},
		"vetoed":  {URL: "f.nc", Off: 0, N: 1, Check: func(targets.Target, string) error { return stale }},
	}
	tg, _ := targets.New(targets.Options{Base: dir, Scope: targets.Scope{Places: []targets.Place{{Prefix: dir, Name: "the reference set's folder"}}}})
	defer tg.Close()
	s = targets.NewStore("virtual://faults", tg, func() targets.Index { return idx })
	ctx := context.Background()
	if b, err := s.Get(ctx, "good"); err != nil || string(b) != "234" {
		t.Fatalf("good: %q, %v", b, err)
	}
	for key, want := range map[string]error{"missing": targets.ErrTargetMissing, "scheme": targets.ErrScheme, "vetoed": stale} {
		_, err := s.Get(ctx, key)
		if !errors.Is(err, want) || objectstore.IsNotFound(err) || !strings.Contains(err.Error(), key) {
			t.Errorf("%s: %v, want %v naming the key, not a missing key", key, err, want)
		}
	}
	vers := map[string]string{}
	if err := s.ListVersions(ctx, "", func(k, v string) { vers[k] = v }); err != nil {
		t.Fatal(err)
	}
	if len(vers) != len(idx) || vers["missing"] != "missing" || vers["scheme"] != "unreadable" || !strings.HasPrefix(vers["good"], "r") {
		t.Errorf("ListVersions = %v", vers)
	}
	if _, v, err := s.GetVersion(ctx, "good", nil, 0); err != nil || v != vers["good"] {
		t.Errorf("good: version %q, listed %q, %v", v, vers["good"], err)
	}
	if _, err := s.List(ctx, "good"); err == nil || objectstore.IsNotFound(err) {
		t.Errorf("List(good) = %v, want a key that is not a directory", err)
	}
}
