package layout

import (
	"errors"
	"testing"
)

func TestNegativeSlabBytesRefused(t *testing.T) {
	if _, err := (Options{SlabBytes: -1}).withDefaults(); !errors.Is(err, ErrInvalidOption) {
		t.Errorf("SlabBytes -1: %v, want ErrInvalidOption", err)
	}
	if o, err := (Options{}).withDefaults(); err != nil || o.SlabBytes != 64<<20 {
		t.Errorf("SlabBytes 0: %d, %v", o.SlabBytes, err)
	}
}
