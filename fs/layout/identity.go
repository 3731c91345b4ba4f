package layout

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"io"
)

// Identity returns what blob b's bytes are built from, for the cache to
// record next to the blob (cache.BlobKey.Identity) and compare on every
// open: a hash of b.Inputs().
func (l *Layout) Identity(ctx context.Context, b Blob) (string, error) {
	h := sha256.New()
	io.WriteString(h, layoutVersion)
	h.Write([]byte{0})
	io.WriteString(h, b.Inputs())
	return hex.EncodeToString(h.Sum(nil))[:32], nil
}
