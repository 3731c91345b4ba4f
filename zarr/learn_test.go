package zarr_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/zarrfs/zarrfs/objectstore"
	"github.com/zarrfs/zarrfs/zarr"
)

// askingStore counts the versions a store is asked and its reads. It
// reads files but is not seen as local (objectstore.IsLocal: it does not
// unwrap to its Posix), so its lazy listings are not Bounded: they learn
// from reads and keep every answer, as a remote store's do.
type askingStore struct {
	*objectstore.Posix
	stats, reads atomic.Int64
}

func (s *askingStore) StatVersion(ctx context.Context, key string) (string, error) {
	s.stats.Add(1)
	return s.Posix.StatVersion(ctx, key)
}

func (s *askingStore) GetVersion(ctx context.Context, key string, buf []byte, limit int64) ([]byte, string, error) {
	s.reads.Add(1)
	return s.Posix.GetVersion(ctx, key, buf, limit)
}

// A lazy listing learns a key's version from the Read that fetches it,
// asking nothing first, and a missing chunk from the read that finds it
// absent; what it learnt then stands as a listing's answer does: a chunk
// written since reads as missing without a request, one rewritten fails
// with ErrChanged.
func TestLazyListingLearnsFromReads(t *testing.T) {
	dir, px := grownPosix(t, 4, 2)
	st := &askingStore{Posix: px}
	h, err := zarr.Open(context.Background(), st, zarr.Options{ChunkCacheBytes: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	l, err := h.List(context.Background(), h.Array("t"), time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	counts := func() (int64, int64) { return st.stats.Swap(0), st.reads.Swap(0) }
	counts()
	if got, err := readSample(t, h, 1); err != nil || got[0] != 2 {
		t.Fatalf("sample 1: %v %v", got, err)
	}
	if stats, reads := counts(); stats != 0 || reads != 1 {
		t.Fatalf("sample 1: %d versions asked, %d reads; want 0 and 1", stats, reads)
	}
	if v, ok, known := l.Known("t/c/0/0"); !known || !ok || v == "" {
		t.Fatalf("chunk 0 after its read: version %q ok %v known %v", v, ok, known)
	}
	os.Remove(filepath.Join(dir, "t", "c", "1", "0"))
	if got, err := readSample(t, h, 3); err != nil || got[0] != 7 {
		t.Fatalf("sample 3 without its chunk: %v %v, want the fill value 7", got, err)
	}
	if stats, reads := counts(); stats != 0 || reads != 1 {
		t.Fatalf("a missing chunk: %d versions asked, %d reads; want 0 and 1", stats, reads)
	}
	if _, ok, known := l.Known("t/c/1/0"); !known || ok {
		t.Fatalf("the missing chunk: ok %v known %v, want known absent", ok, known)
	}
	growStore(t, dir, 4, 2, 100)
	if got, err := readSample(t, h, 3); err != nil || got[0] != 7 {
		t.Errorf("sample 3, its chunk written after the listing learnt it absent: %v %v, want 7", got, err)
	}
	if stats, reads := counts(); stats != 0 || reads != 0 {
		t.Errorf("a chunk the listing knows absent: %d versions asked, %d reads; want none", stats, reads)
	}
	if _, err := readSample(t, h, 1); !errors.Is(err, zarr.ErrChanged) {
		t.Errorf("sample 1 after its chunk was rewritten: %v, want ErrChanged", err)
	}
}

// Options.LazyVersions bounds the lazy listings of a local store only: a
// remote one (where asking again costs a request) keeps every answer it
// learnt, past the bound, and its Reads ask no version first even under a
// full bound; a local one keeps the bound and asks (stats) past it.
func TestLazyVersionsBoundLocalListingsOnly(t *testing.T) {
	_, px := grownPosix(t, 4, 1)
	st := &askingStore{Posix: px}
	for _, local := range []bool{false, true} {
		var store objectstore.Store = st
		if local {
			store = px
		}
		h, err := zarr.Open(context.Background(), store, zarr.Options{ChunkCacheBytes: -1, LazyVersions: 2})
		if err != nil {
			t.Fatal(err)
		}
		l, err := h.List(context.Background(), h.Array("t"), time.Time{})
		if err != nil {
			t.Fatal(err)
		}
		if l.Bounded() != local {
			t.Errorf("local %v: Bounded %v", local, l.Bounded())
		}
		st.stats.Store(0)
		for k := range int64(4) {
			if got, err := readSample(t, h, k); err != nil || got[0] != 2*uint32(k) {
				t.Fatalf("local %v: sample %d: %v %v", local, k, got, err)
			}
		}
		want := 4
		if local {
			want = 2
		}
		if l.Len() != want {
			t.Errorf("local %v: the listing keeps %d versions, want %d", local, l.Len(), want)
		}
		if !local && st.stats.Load() != 0 {
			t.Errorf("remote: %d versions asked before reads, want none", st.stats.Load())
		}
		h.Close()
	}
}
