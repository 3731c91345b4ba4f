package zarr_test

import (
	"context"
	"encoding/binary"
	"errors"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/klauspost/compress/zstd"

	"github.com/zarrfs/zarrfs/codec"
	"github.com/zarrfs/zarrfs/zarr"
)

// lineStore is a v3 array of n chunks of 4 uint16, zstd; element i is i.
func lineStore(n int) map[string][]byte {
	enc, _ := zstd.NewWriter(nil)
	files := map[string][]byte{"zarr.json": []byte(`{"zarr_format":3,"node_type":"array","shape":[` + strconv.Itoa(4*n) + `],"data_type":"uint16",
	"chunk_grid":{"name":"regular","configuration":{"chunk_shape":[4]}},
	"chunk_key_encoding":{"name":"default"},"fill_value":0,
	"codecs":[{"name":"bytes","configuration":{"endian":"little"}},{"name":"zstd","configuration":{"level":1}}]}`)}
	for c := range n {
		raw := make([]byte, 8)
		for i := range 4 {
			binary.LittleEndian.PutUint16(raw[2*i:], uint16(4*c+i))
		}
		files["c/"+strconv.Itoa(c)] = enc.EncodeAll(raw, nil)
	}
	return files
}

// gatedStore holds the fetch of key until gate closes (or fails it with
// fail, when set).
type gatedStore struct {
	*memStore
	key  string
	gate chan struct{}
	fail error
}

func (g *gatedStore) Get(ctx context.Context, key string) ([]byte, error) {
	if key == g.key {
		if g.fail != nil {
			return nil, g.fail
		}
		select {
		case <-g.gate:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	return g.memStore.Get(ctx, key)
}

// batches decodes inline, counting its batches, and calls first once, on
// its first batch; fail, when set, fails every batch as a whole.
type batches struct {
	mu    sync.Mutex
	n     int
	first func()
	once  sync.Once
	fail  error
}

// DecodesAhead asks for chunks as they are fetched (codec.AheadDecoder).
func (b *batches) DecodesAhead() bool { return true }

func (b *batches) DecodeBatch(ctx context.Context, jobs []codec.Job) error {
	b.mu.Lock()
	b.n++
	b.mu.Unlock()
	if b.first != nil {
		b.once.Do(b.first)
	}
	if b.fail != nil {
		return b.fail
	}
	return codec.Inline{}.DecodeBatch(ctx, jobs)
}

// A Read of many chunks through a decoder that asks for it decodes those
// fetched while the rest are fetched: a chunk whose fetch waits for the
// first batch to be decoded is read, in a later batch, where a Read that
// decoded only once everything was fetched would wait for it for ever.
func TestReadDecodesAhead(t *testing.T) {
	gate := make(chan struct{})
	st := &gatedStore{memStore: newMemStore(lineStore(16)), key: "c/15", gate: gate}
	h, err := zarr.Open(context.Background(), st, zarr.Options{ChunkCacheBytes: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	dec := &batches{first: func() { close(gate) }}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	buf := make([]byte, 2*64)
	if err := h.Decoding(dec).Read(ctx, nil, []zarr.Request{{Array: h.Arrays[0], Start: []int64{0}, Count: []int64{64}, Dst: buf}}); err != nil {
		t.Fatalf("read: %v (batches decoded: %d)", err, dec.n)
	}
	for i := range 64 {
		if got := binary.LittleEndian.Uint16(buf[2*i:]); got != uint16(i) {
			t.Fatalf("element %d: %d", i, got)
		}
	}
	if dec.n < 2 {
		t.Fatalf("%d batches, want 2 or more", dec.n)
	}
}

// A fetch that fails fails the Read with its chunk's error while batches
// decode ahead, and a batch that fails as a whole fails it with its error;
// either way every buffer lent for the Read (the decoded edge chunks, not
// landing whole in the request) is given back, and nothing is decoded
// once the Read has returned.
func TestReadDecodeAheadFails(t *testing.T) {
	boom := errors.New("boom")
	for _, tc := range []struct {
		name  string
		fetch error
		dec   error
		want  string
	}{
		{"fetch", boom, nil, "c/9"},
		{"decode", nil, errors.New("device lost"), "device lost"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := &gatedStore{memStore: newMemStore(lineStore(16)), key: "c/9", gate: make(chan struct{}), fail: tc.fetch}
			if tc.fetch == nil {
				close(st.gate)
			}
			mem := &lendCounter{}
			h, err := zarr.Open(context.Background(), st, zarr.Options{ChunkCacheBytes: -1, Host: mem})
			if err != nil {
				t.Fatal(err)
			}
			defer h.Close()
			buf := make([]byte, 2*62)
			dec := &batches{fail: tc.dec}
			err = h.Decoding(dec).Read(context.Background(), nil, []zarr.Request{{Array: h.Arrays[0], Start: []int64{1}, Count: []int64{62}, Dst: buf}})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("read: %v, want an error naming %q", err, tc.want)
			}
			dec.mu.Lock()
			n := dec.n
			dec.mu.Unlock()
			mem.mu.Lock()
			defer mem.mu.Unlock()
			if mem.n == 0 || mem.back != mem.n || mem.foreign != 0 {
				t.Fatalf("%d buffers lent, %d given back (%d not lent)", mem.n, mem.back, mem.foreign)
			}
			time.Sleep(20 * time.Millisecond)
			dec.mu.Lock()
			defer dec.mu.Unlock()
			if dec.n != n {
				t.Fatalf("%d batches decoded after the Read returned", dec.n-n)
			}
		})
	}
}
