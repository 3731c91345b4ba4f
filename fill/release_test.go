package fill

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/zarrfs/zarrfs/codec"
	"github.com/zarrfs/zarrfs/internal/memory"
	"github.com/zarrfs/zarrfs/internal/viewtest"
	"github.com/zarrfs/zarrfs/layout"
)

// A fill that fails gives its memory back: the budget holds nothing once
// it has returned, so failed fills cannot starve the ones after them (of
// an array, and of a view).
func TestFailedFillReleasesMemory(t *testing.T) {
	budget := memory.New(64 << 20)
	out, err := os.Create(filepath.Join(t.TempDir(), "x"))
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()

	l, r := build(t, viewtest.Hierarchy(), layout.Options{})
	r.err = fmt.Errorf("t/c/0/0/0/0: %w", codec.ErrCorrupt)
	f := newFiller(t, Options{Reader: r, MemoryBudget: budget})
	for range 3 {
		if err := f.Fill(context.Background(), l, mustLookup(t, l, "t/00.npy"), nil, out); !errors.Is(err, codec.ErrCorrupt) {
			t.Fatalf("fill: %v, want the reader's error", err)
		}
		if n := budget.Used(); n != 0 {
			t.Fatalf("%d bytes of the budget held after a failed fill of an array", n)
		}
	}
	if budget.Peak() == 0 {
		t.Fatal("the fill took nothing from the budget: the test proves nothing")
	}

	h := viewtest.ViewHierarchy()
	views, err := bindYAML(t, h, trainYAML)
	if err != nil {
		t.Fatal(err)
	}
	vl, err := layout.Build(h, layout.Options{Views: views})
	if err != nil {
		t.Fatal(err)
	}
	d := mustDir(t, vl, "train")
	b := d.SampleEntry(1).Blob
	f = newFiller(t, Options{Reader: failReader{}, MemoryBudget: budget})
	if err := f.Fill(context.Background(), vl, b, nil, out); !errors.Is(err, codec.ErrCorrupt) {
		t.Fatalf("view fill: %v, want the reader's error", err)
	}
	if n := budget.Used(); n != 0 {
		t.Fatalf("%d bytes of the budget held after a failed fill of a view", n)
	}
}
