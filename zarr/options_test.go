package zarr_test

import (
	"context"
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
