package zarr_test

import (
	"context"
	"runtime"
	"strings"
	"testing"

	"github.com/zarrfs/zarrfs/zarr"
)

func TestNegativeFetchersRefused(t *testing.T) {
	_, err := zarr.Open(context.Background(), newMemStore(map[string][]byte{}), zarr.Options{Fetchers: -1})
	if err == nil || !strings.Contains(err.Error(), "Fetchers -1") {
		t.Errorf("Open with Fetchers -1: %v", err)
	}
}

// Open with no decoder starts no workers of its own: chunks decode in the
// goroutine that reads them (codec.Inline), and a read still decodes.
func TestOpenStartsNoWorkers(t *testing.T) {
	files := map[string][]byte{"zarr.json": []byte(strings.NewReplacer("SHAPE", "24,4", "CODEC", `,{"name":"zstd","configuration":{"level":1,"checksum":false}}`, "ATTRS", "").Replace(v3Doc))}
	before := runtime.NumGoroutine()
	h, err := zarr.Open(context.Background(), newMemStore(files), zarr.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	if n := runtime.NumGoroutine(); n > before {
		t.Errorf("%d goroutines after Open, %d before: Open started workers of its own", n, before)
	}
	dst := make([]byte, 24*4*4)
	if err := h.Read(context.Background(), nil, []zarr.Request{{Array: h.Arrays[0], Start: []int64{0, 0}, Count: []int64{24, 4}, Dst: dst}}); err != nil {
		t.Fatal(err) // every chunk missing: the fill value
	}
}
