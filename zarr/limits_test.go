package zarr_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/zarrfs/zarrfs/zarr"
)

const limitGroup = `{"zarr_format":3,"node_type":"group","attributes":{}}`

func limitArray(attrs string) string {
	return `{"zarr_format":3,"node_type":"array","shape":[4],"data_type":"uint8",` +
		`"chunk_grid":{"name":"regular","configuration":{"chunk_shape":[2]}},"chunk_key_encoding":{"name":"default"},` +
		`"codecs":[{"name":"bytes"}],"fill_value":0,"attributes":{` + attrs + `}}`
}

// Each metadata limit holds: a document past Document leaves its array
// out (refused before it is read, on a local store) or fails Open at the
// root; the tree past Total or Nodes fails Open; a group past Depth is
// left out with nothing below read; attributes past Attributes are named,
// not parsed; negative limits are refused.
func TestMetadataLimits(t *testing.T) {
	dir := t.TempDir()
	write := func(p, s string) {
		os.MkdirAll(filepath.Dir(filepath.Join(dir, p)), 0o755)
		os.WriteFile(filepath.Join(dir, p), []byte(s), 0o644)
	}
	write("zarr.json", limitGroup)
	write("small/zarr.json", limitArray(`"a":1`))
	write("big/zarr.json", limitArray(`"pad":"`+strings.Repeat("x", 5000)+`"`))
	write("wide/zarr.json", limitArray(`"keep":"k","list":[`+strings.Repeat("0,", 1000)+`0],"z":2`))
	p := "g0"
	write(p+"/zarr.json", limitGroup)
	for i := 1; i < 6; i++ {
		p += fmt.Sprintf("/g%d", i)
		write(p+"/zarr.json", limitGroup)
	}
	write(p+"/deep/zarr.json", limitArray(""))
	st, err := openPosix(dir)
	if err != nil {
		t.Fatal(err)
	}
	open := func(l zarr.MetadataLimits) (*zarr.Hierarchy, error) {
		return zarr.Open(context.Background(), st, zarr.Options{Limits: l, ChunkCacheBytes: -1})
	}

	h, err := open(zarr.MetadataLimits{Document: 4096, Depth: 3, Attributes: 1024})
	if err != nil {
		t.Fatal(err)
	}
	if a := h.Array("big"); a == nil || !strings.Contains(a.Unsupported, "big/zarr.json is larger than the metadata limit of 4.0 KiB per document") {
		t.Errorf("big: %+v", a)
	}
	if a := h.Array("small"); a == nil || a.Unsupported != "" || a.Attributes["a"] == nil {
		t.Errorf("small: %+v", a)
	}
	if a := h.Array("wide"); a == nil || a.Attributes["keep"] != "k" || a.Attributes["z"] == nil ||
		a.Attributes["list"] != nil || fmt.Sprint(a.AttributesLeftOut) != "[list]" {
		t.Errorf("wide: attributes %v, left out %v", a.Attributes, a.AttributesLeftOut)
	}
	if a := h.Array("g0/g1/g2/g3"); a == nil || !strings.Contains(a.Unsupported, "group 4 levels below the root, past the metadata limit of 3") {
		t.Errorf("g0/g1/g2/g3: %+v", a)
	}
	for _, a := range h.Arrays {
		if strings.HasPrefix(a.Path, "g0/g1/g2/g3/") {
			t.Errorf("%s read below the depth limit", a.Path)
		}
	}
	if h, err := open(zarr.MetadataLimits{}); err != nil || h.Array(p+"/deep") == nil || h.Array(p+"/deep").Unsupported != "" {
		t.Errorf("defaults: %v", err)
	}

	for _, c := range []struct {
		lim  zarr.MetadataLimits
		want string
	}{
		{zarr.MetadataLimits{Total: 2048}, "past the limit of 2.0 KiB in all"},
		{zarr.MetadataLimits{Nodes: 4}, "more than 4 arrays and groups"},
		{zarr.MetadataLimits{Document: 20}, "zarr.json is larger than the metadata limit of 20 B per document"},
		{zarr.MetadataLimits{Depth: -1}, "negative metadata limit"},
	} {
		_, err := open(c.lim)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %v, want %q", c.lim, err, c.want)
		}
		if c.lim.Depth >= 0 && !errors.Is(err, zarr.ErrMetadataLimit) {
			t.Errorf("%+v: %v is not ErrMetadataLimit", c.lim, err)
		}
	}

	// A store that does not honour the request's size limit: the
	// document is refused once read.
	hm, _ := openMemLimits(t, map[string][]byte{"zarr.json": []byte(limitGroup), "big/zarr.json": []byte(limitArray(`"pad":"` + strings.Repeat("x", 5000) + `"`))},
		zarr.MetadataLimits{Document: 4096})
	if a := hm.Array("big"); a == nil || !strings.Contains(a.Unsupported, "larger than the metadata limit") {
		t.Errorf("big on a store without size limits: %+v", a)
	}
}

func openMemLimits(t testing.TB, files map[string][]byte, l zarr.MetadataLimits) (*zarr.Hierarchy, *memStore) {
	t.Helper()
	st := newMemStore(files)
	h, err := zarr.Open(context.Background(), st, zarr.Options{ChunkCacheBytes: -1, Limits: l})
	if err != nil {
		t.Fatal(err)
	}
	return h, st
}

// The root counts once toward Limits.Nodes, consolidated metadata naming
// it (v2's ".zgroup" entry) or not: a root and two arrays fit a limit of 3.
func TestMetadataNodesCountTheRootOnce(t *testing.T) {
	arr := `{"zarr_format":2,"shape":[4],"chunks":[2],"dtype":"|u1","compressor":null,"fill_value":0,"order":"C","filters":null}`
	zm := `{"zarr_consolidated_format":1,"metadata":{".zgroup":{"zarr_format":2},"a/.zarray":` + arr + `,"b/.zarray":` + arr + `}}`
	v2 := map[string][]byte{".zgroup": []byte(`{"zarr_format":2}`), ".zmetadata": []byte(zm)}
	v3 := map[string][]byte{"zarr.json": []byte(`{"zarr_format":3,"node_type":"group","consolidated_metadata":{"kind":"inline","must_understand":false,"metadata":{` +
		`"a":` + limitArray("") + `,"b":` + limitArray("") + `}}}`)}
	for name, files := range map[string]map[string][]byte{"v2": v2, "v3": v3} {
		for lim, fits := range map[int]bool{3: true, 2: false} {
			h, err := zarr.Open(context.Background(), newMemStore(files), zarr.Options{ChunkCacheBytes: -1, Limits: zarr.MetadataLimits{Nodes: lim}})
			if fits && (err != nil || len(h.Arrays) != 2) {
				t.Errorf("%s, %d nodes at most: %v", name, lim, err)
			}
			if !fits && !errors.Is(err, zarr.ErrMetadataLimit) {
				t.Errorf("%s, %d nodes at most: %v, want the limit passed", name, lim, err)
			}
			if h != nil {
				h.Close()
			}
		}
	}
}
