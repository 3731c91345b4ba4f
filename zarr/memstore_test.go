package zarr_test

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/zarrfs/zarrfs/objectstore"
)

// memStore is an in-memory Store that counts requests, for partial-read
// and hostile-input tests.
type memStore struct {
	mu     sync.Mutex
	files  map[string][]byte
	gets   atomic.Int64
	ranges atomic.Int64
	bytes  atomic.Int64
}

func newMemStore(files map[string][]byte) *memStore { return &memStore{files: files} }

func (m *memStore) ID() string { return "mem://test" }
func (*memStore) Close() error { return nil }

func (m *memStore) Get(_ context.Context, key string) ([]byte, error) {
	m.gets.Add(1)
	m.mu.Lock()
	defer m.mu.Unlock()
	b, ok := m.files[key]
	if !ok {
		return nil, fmt.Errorf("%s: %w", key, objectstore.ErrNotFound)
	}
	m.bytes.Add(int64(len(b)))
	return append([]byte(nil), b...), nil
}

func (m *memStore) GetRange(_ context.Context, key string, off, n int64) ([]byte, error) {
	m.ranges.Add(1)
	m.mu.Lock()
	defer m.mu.Unlock()
	b, ok := m.files[key]
	if !ok {
		return nil, fmt.Errorf("%s: %w", key, objectstore.ErrNotFound)
	}
	if off < 0 {
		off = int64(len(b)) - n
	}
	if off < 0 || n < 0 || off+n > int64(len(b)) {
		return nil, fmt.Errorf("%s: %w: %d+%d, size %d", key, objectstore.ErrRange, off, n, len(b))
	}
	m.bytes.Add(n)
	return append([]byte(nil), b[off:off+n]...), nil
}

func (m *memStore) List(_ context.Context, prefix string) ([]string, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	prefix = strings.Trim(prefix, "/")
	if prefix != "" {
		prefix += "/"
	}
	seen := map[string]bool{}
	for k := range m.files {
		rest, ok := strings.CutPrefix(k, prefix)
		if !ok {
			continue
		}
		if i := strings.Index(rest, "/"); i >= 0 {
			seen[rest[:i+1]] = true
		} else {
			seen[rest] = true
		}
	}
	out := make([]string, 0, len(seen))
	for k := range seen {
		out = append(out, k)
	}
	sort.Strings(out)
	return out, nil
}
