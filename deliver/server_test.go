package deliver

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/zarrfs/zarrfs/codec"
	"github.com/zarrfs/zarrfs/fill"
	"github.com/zarrfs/zarrfs/gpu"
	"github.com/zarrfs/zarrfs/internal/syncbuf"
	"github.com/zarrfs/zarrfs/layout"
	"github.com/zarrfs/zarrfs/zarr"
)

// indexReader fills a region's bytes from where it starts, so every sample
// differs; it fails the regions starting at a time step in bad.
type indexReader struct{ bad map[int64]bool }

func (r indexReader) Read(ctx context.Context, _ *zarr.Pin, reqs []zarr.Request) error {
	for _, q := range reqs {
		if r.bad[q.Start[0]] {
			return &zarr.ChunkError{Array: q.Array.Path, Key: fmt.Sprintf("%s/%d.0.0", q.Array.Path, q.Start[0]), Err: codec.ErrCorrupt}
		}
		for i := range q.Dst {
			q.Dst[i] = byte(int(q.Start[0])*31 + i*7)
		}
	}
	return nil
}

// fileBlobs fills every blob it is asked for into a file of its own (the
// cache's part in the host path) and counts the opens.
type fileBlobs struct {
	fill  *fill.Filler
	dir   string
	mu    sync.Mutex
	opens map[string]int
	// held are the blobs the cache holds (Holds), set before a test
	// fills; stale those it holds under an identity the source no longer
	// has, which Open fills again (fileBacking.Filled).
	held, stale map[string]bool
}

func (fb *fileBlobs) Holds(_ *layout.Layout, b layout.Blob) bool {
	return fb.held[b.Path()] || fb.stale[b.Path()]
}

type fileBacking struct {
	f      *os.File
	filled bool
}

func (b fileBacking) File() *os.File { return b.f }
func (b fileBacking) Close() error   { return b.f.Close() }
func (b fileBacking) Filled() bool   { return b.filled }

func (fb *fileBlobs) Open(ctx context.Context, lay *layout.Layout, b layout.Blob) (fill.Backing, string, error) {
	fb.mu.Lock()
	fb.opens[b.Path()]++
	fb.mu.Unlock()
	f, err := os.CreateTemp(fb.dir, "blob")
	if err != nil {
		return nil, "", err
	}
	os.Remove(f.Name())
	if err := fb.fill.Fill(ctx, lay, b, nil, f); err != nil {
		f.Close()
		return nil, "", err
	}
	return fileBacking{f, !fb.held[b.Path()]}, "", nil
}

func (fb *fileBlobs) Path(lay *layout.Layout, p string) string { return filepath.Join(fb.dir, p) }
func (fb *fileBlobs) Keeps(int64) bool                         { return true }

func (fb *fileBlobs) opened(p string) int {
	fb.mu.Lock()
	defer fb.mu.Unlock()
	return fb.opens[p]
}

// testServer serves a layout of one array t (12 samples of 4x8 float32)
// on a socket in a temporary folder.
type testServer struct {
	s     *Server
	lay   *layout.Layout
	blobs *fileBlobs
	sock  string
	stop  func()
}

func newTestServer(t *testing.T, bad map[int64]bool, fail func(string) bool, mem ...Memory) *testServer {
	t.Helper()
	ts := unstartedTestServer(t, bad, fail, mem...)
	ts.serve(t, nil)
	return ts
}

// unstartedTestServer is newTestServer before it serves (serve).
func unstartedTestServer(t *testing.T, bad map[int64]bool, fail func(string) bool, mem ...Memory) *testServer {
	t.Helper()
	f32 := zarr.DType{Kind: 'f', Size: 4}
	arr := &zarr.Array{Path: "t", Shape: []int64{12, 4, 8}, Chunks: []int64{1, 4, 8}, DType: f32, Dims: []string{"time", "y", "x"}, MetaHash: "t"}
	h := &zarr.Hierarchy{Arrays: []*zarr.Array{arr}, Groups: map[string]map[string]any{"": {}}}
	lay, err := layout.Build(h, layout.Options{})
	if err != nil {
		t.Fatal(err)
	}
	filler, err := fill.New(fill.Options{Reader: indexReader{bad: bad}})
	if err != nil {
		t.Fatal(err)
	}
	ts := &testServer{lay: lay, blobs: &fileBlobs{fill: filler, dir: t.TempDir(), opens: map[string]int{}}}
	ts.s = &Server{Layout: func() *layout.Layout { return lay }, Blobs: ts.blobs, Memory: HostMemory{},
		Device: HostFill{Filler: filler, Decoder: must(codec.NewCPU(codec.Options{Workers: 1})), Fail: fail}}
	if len(mem) > 0 {
		ts.s.Memory = mem[0]
	}
	ts.sock = filepath.Join(t.TempDir(), "d.sock")
	return ts
}

// serve serves ts on its socket until the test ends, through the
// listener wrap makes of it when wrap is set.
func (ts *testServer) serve(t *testing.T, wrap func(net.Listener) net.Listener) {
	t.Helper()
	ln, err := net.Listen("unix", ts.sock)
	if err != nil {
		t.Fatal(err)
	}
	if wrap != nil {
		ln = wrap(ln)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- ts.s.Serve(ctx, ln) }()
	ts.stop = func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	}
	t.Cleanup(ts.stop)
}

// want is sample p's data as the mount's file holds it.
func (ts *testServer) want(t *testing.T, p string) []byte {
	t.Helper()
	e, ok := ts.lay.Lookup(p)
	if !ok {
		t.Fatalf("%s: not in the layout", p)
	}
	var buf bytes.Buffer
	w := &bufWriter{b: &buf}
	if err := ts.blobs.fill.Fill(context.Background(), ts.lay, e.Blob, nil, w); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()[len(e.Blob.Header()):]
}

type bufWriter struct{ b *bytes.Buffer }

func (w *bufWriter) WriteAt(p []byte, off int64) (int, error) {
	if n := int(off) + len(p); n > w.b.Len() {
		w.b.Write(make([]byte, n-w.b.Len()))
	}
	copy(w.b.Bytes()[off:], p)
	return len(p), nil
}

// client speaks the protocol as the Python Loader does.
type client struct {
	c   *net.UnixConn
	rd  *bufio.Reader
	mem []byte
	rep openReply
}

func dial(t testing.TB, sock string) *client {
	t.Helper()
	c, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return &client{c: c.(*net.UnixConn), rd: bufio.NewReader(c)}
}

func (c *client) send(t testing.TB, v any) {
	t.Helper()
	b, _ := json.Marshal(v)
	if _, err := c.c.Write(append(b, '\n')); err != nil {
		t.Fatal(err)
	}
}

// open sends an open request and maps the memfd the reply carries.
func (c *client) open(t testing.TB, req OpenRequest) openReply {
	t.Helper()
	req.Op = "open"
	c.send(t, req)
	c.c.SetReadDeadline(time.Now().Add(10 * time.Second))
	buf, oob := make([]byte, 1<<16), make([]byte, unix.CmsgSpace(4*4))
	n, oobn, _, _, err := c.c.ReadMsgUnix(buf, oob)
	if err != nil {
		t.Fatal(err)
	}
	line := buf[:n]
	if !bytes.HasSuffix(line, []byte("\n")) {
		t.Fatalf("open reply not one message: %q", line)
	}
	var rep openReply
	if err := json.Unmarshal(line, &rep); err != nil {
		t.Fatal(err)
	}
	c.rep = rep
	msgs, _ := unix.ParseSocketControlMessage(oob[:oobn])
	if !rep.OK {
		if len(msgs) != 0 {
			t.Fatal("a failed open passed a file")
		}
		return rep
	}
	if len(msgs) != 1 {
		t.Fatalf("open reply with %d control messages, want the memfd", len(msgs))
	}
	fds, err := unix.ParseUnixRights(&msgs[0])
	if err != nil || len(fds) != 1 {
		t.Fatalf("rights %v: %v", fds, err)
	}
	mem, err := unix.Mmap(fds[0], 0, int(rep.RingBytes), unix.PROT_READ, unix.MAP_SHARED)
	unix.Close(fds[0])
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Munmap(mem) })
	c.mem = mem
	return rep
}

func (c *client) fill(t testing.TB, slot int, files ...string) fillReply {
	t.Helper()
	c.send(t, fillRequest{Op: "fill", Slot: slot, Files: files})
	return c.next(t)
}

func (c *client) next(t testing.TB) fillReply {
	t.Helper()
	var rep fillReply
	c.recv(t, &rep)
	return rep
}

// recv reads the next reply line into v.
func (c *client) recv(t testing.TB, v any) {
	t.Helper()
	c.c.SetReadDeadline(time.Now().Add(10 * time.Second))
	line, err := c.rd.ReadBytes('\n')
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(line, v); err != nil {
		t.Fatalf("%q: %v", line, err)
	}
}

func (c *client) sample(slot, j int) []byte {
	off := int64(slot)*c.rep.SlotBytes + int64(j)*c.rep.SampleBytes
	return c.mem[off : off+c.rep.SampleBytes]
}

// Samples come out of the ring byte for byte as the mount's files hold
// them, through the device path (CPU decoding into the slot, the cache
// untouched) and through the host path (the cache) alike; slots are
// filled again with other samples.
func TestRingHoldsTheFilesBytes(t *testing.T) {
	refused := map[string]bool{"t/03.npy": true, "t/07.npy": true}
	ts := newTestServer(t, nil, func(p string) bool { return refused[p] })
	c := dial(t, ts.sock)
	rep := c.open(t, OpenRequest{Dir: "t", Memory: MemoryHost, Slots: 2, Batch: 3})
	if !rep.OK {
		t.Fatalf("open: %+v", rep)
	}
	if rep.SampleBytes != 4*8*4 || rep.DType != "<f4" || fmt.Sprint(rep.Shape) != "[4 8]" || rep.SlotBytes < 3*rep.SampleBytes {
		t.Fatalf("open reply %+v", rep)
	}
	names := []string{"00.npy", "01.npy", "02.npy", "03.npy", "04.npy", "05.npy", "06.npy", "07.npy", "08.npy", "09.npy", "10.npy", "11.npy"}
	var asked, answered time.Time // the first fill's request, and its reply
	for b := 0; b*3 < len(names); b++ {
		slot := b % 2
		batch := names[b*3 : b*3+3]
		if b == 0 {
			asked = time.Now()
		}
		r := c.fill(t, slot, batch...)
		if b == 0 {
			answered = time.Now()
		}
		if r.Op != "ready" || r.Slot != slot {
			t.Fatalf("batch %d: %+v", b, r)
		}
		host := 0
		for j, n := range batch {
			if got, want := c.sample(slot, j), ts.want(t, "t/"+n); !bytes.Equal(got, want) {
				t.Fatalf("t/%s in slot %d differs from the file", n, slot)
			}
			if refused["t/"+n] {
				host++
			}
			if opens, want := ts.blobs.opened("t/"+n), map[bool]int{true: 1}[refused["t/"+n]]; opens != want {
				t.Fatalf("t/%s opened through the cache %d times, want %d", n, opens, want)
			}
		}
		if r.Host != host || r.Device != 3-host {
			t.Fatalf("batch %d: %d on the device path, %d on the host path; want %d, %d", b, r.Device, r.Host, 3-host, host)
		}
	}
	rings, tot := ts.s.Stats()
	if len(rings) != 1 || rings[0].Fills != 4 || rings[0].HostSamples != 2 || rings[0].DeviceSamples != 10 ||
		rings[0].Uploaded != 2*rep.SampleBytes || tot.Open != 1 || tot.HeldBytes != rep.RingBytes {
		t.Fatalf("stats %+v %+v", rings, tot)
	}
	// Where the fills' time went: every stage named, the fills' own time
	// at least that of the stages inside them that do not overlap.
	st := tot.Stages
	if len(st) != numStages || st["fill"] <= 0 || st["read"] <= 0 || st["host_path"] <= 0 ||
		st["fill"] < st["read"]+st["host_decode"] || fmt.Sprint(rings[0].Stages) != fmt.Sprint(st) {
		t.Fatalf("stages %v, the ring's %v", st, rings[0].Stages)
	}
	// The first fill's own: begun between its request and its reply, a
	// part of the sums, and not all of them (four fills).
	ff := rings[0].FirstFill
	if ff == nil || ff.Began.Before(asked) || ff.Began.After(answered) || ff.Stages["fill"] <= 0 || ff.Stages["fill"] >= st["fill"] ||
		ff.Stages["read"] > st["read"] {
		t.Fatalf("first fill %+v, asked at %v, answered at %v; all fills' stages %v", ff, asked, answered, st)
	}
}

// A sample whose blob the cache holds (a warm mount) is copied from it,
// not decoded again; the device path decodes the others of its batch,
// each at its place in the slot.
func TestRingCopiesCachedSamples(t *testing.T) {
	ts := newTestServer(t, nil, nil)
	ts.blobs.held = map[string]bool{"t/01.npy": true, "t/03.npy": true, "t/04.npy": true, "t/05.npy": true}
	ts.blobs.stale = map[string]bool{"t/07.npy": true} // filled again on the host path, not counted as cached
	c := dial(t, ts.sock)
	rep := c.open(t, OpenRequest{Dir: "t", Memory: MemoryHost, Slots: 2, Batch: 3})
	if !rep.OK {
		t.Fatalf("open: %+v", rep)
	}
	for b, batch := range [][]string{{"00.npy", "01.npy", "02.npy"}, {"03.npy", "04.npy", "05.npy"}, {"06.npy", "07.npy", "08.npy"}} {
		slot := b % 2
		r := c.fill(t, slot, batch...)
		held := 0
		for j, n := range batch {
			if got, want := c.sample(slot, j), ts.want(t, "t/"+n); !bytes.Equal(got, want) {
				t.Fatalf("t/%s in slot %d differs from the file", n, slot)
			}
			h := ts.blobs.held["t/"+n] || ts.blobs.stale["t/"+n]
			if h {
				held++
			}
			if opens, want := ts.blobs.opened("t/"+n), map[bool]int{true: 1}[h]; opens != want {
				t.Fatalf("t/%s opened through the cache %d times, want %d", n, opens, want)
			}
		}
		if r.Op != "ready" || r.Host != held || r.Device != 3-held {
			t.Fatalf("batch %d: %+v; want %d samples on the device path, %d copied from the cache", b, r, 3-held, held)
		}
	}
	rings, tot := ts.s.Stats()
	if len(rings) != 1 || rings[0].CachedSamples != 4 || rings[0].HostSamples != 5 || rings[0].DeviceSamples != 4 ||
		tot.CachedSamples != 4 || rings[0].Uploaded != 5*rep.SampleBytes || tot.Stages["host_path"] <= 0 {
		t.Fatalf("stats %+v %+v", rings, tot)
	}
}

// stagedMemory makes host rings the host path may not write in place, as
// a GPU's: samples go through Stage and Write, which it records; a Write
// at failAt fails.
type stagedMemory struct {
	HostMemory
	failAt int64
	mu     sync.Mutex
	staged []int            // the sizes Stage was asked for
	writes map[int64][2]int // offset in the ring: slot, length
}

func (m *stagedMemory) NewRing(ctx context.Context, req *OpenRequest, slots int, slotBytes int64) (Ring, error) {
	r, err := m.HostMemory.NewRing(ctx, req, slots, slotBytes)
	if err != nil {
		return nil, err
	}
	return &stagedRing{Ring: r, m: m, slot: slotBytes}, nil
}

type stagedRing struct {
	Ring
	m    *stagedMemory
	slot int64
}

func (r *stagedRing) Host(int) []byte { return nil }

func (r *stagedRing) Stage(n int) []byte {
	r.m.mu.Lock()
	r.m.staged = append(r.m.staged, n)
	r.m.mu.Unlock()
	return r.Ring.Stage(n)
}

func (r *stagedRing) Write(ctx context.Context, k int, off int64, b []byte) error {
	at := int64(k)*r.slot + off
	r.m.mu.Lock()
	r.m.writes[at] = [2]int{k, len(b)}
	fail := at == r.m.failAt
	r.m.mu.Unlock()
	if fail {
		return errors.New("device write failed (test)")
	}
	return r.Ring.Write(ctx, k, off, b)
}

// A ring the host cannot write in place (device memory) gets each sample
// staged in pieces of at most stagePiece, each written at its place; a
// failed write fails its sample, naming the file.
func TestStagedCopiesInPieces(t *testing.T) {
	p := stagePiece
	t.Cleanup(func() { stagePiece = p }) // after the server's: its fills read it
	stagePiece = 48                      // a sample's 128 bytes in pieces of 48, 48 and 32
	mem := &stagedMemory{failAt: -1, writes: map[int64][2]int{}}
	ts := unstartedTestServer(t, nil, nil, mem)
	ts.s.Device = nil // every sample on the host path
	ts.serve(t, nil)
	c := dial(t, ts.sock)
	rep := c.open(t, OpenRequest{Dir: "t", Memory: MemoryHost, Slots: 2, Batch: 3})
	if !rep.OK || rep.SampleBytes != 128 {
		t.Fatalf("open: %+v", rep)
	}
	if r := c.fill(t, 1, "00.npy", "01.npy", "02.npy"); r.Op != "ready" || r.Host != 3 {
		t.Fatalf("fill: %+v", r)
	}
	for j, n := range []string{"00.npy", "01.npy", "02.npy"} {
		if !bytes.Equal(c.sample(1, j), ts.want(t, "t/"+n)) {
			t.Fatalf("t/%s in slot 1 differs from the file", n)
		}
	}
	want := map[int64][2]int{}
	for j := range int64(3) {
		at := rep.SlotBytes + j*128
		want[at], want[at+48], want[at+96] = [2]int{1, 48}, [2]int{1, 48}, [2]int{1, 32}
	}
	mem.mu.Lock() // the fills' goroutines wrote them before the reply
	if !maps.Equal(mem.writes, want) {
		t.Fatalf("writes %v, want %v", mem.writes, want)
	}
	for _, n := range mem.staged {
		if n > 48 {
			t.Fatalf("staged %v: want pieces of at most 48 bytes", mem.staged)
		}
	}
	mem.failAt = 128 + 48 // the second piece of the second sample in slot 0
	mem.mu.Unlock()
	r := c.fill(t, 0, "03.npy", "04.npy")
	if r.Op != "error" || r.Code != CodeFill || r.File != "t/04.npy" || !strings.Contains(r.Error, "device write failed") {
		t.Fatalf("a failed write: %+v", r)
	}
}

// A reader asks whether the cache holds every sample of its share (the
// "auto" readers, before a ring and at each epoch): yes only when it does,
// no for one sample not held or a share outside the listing; a question
// it cannot answer is refused with the reason. No question makes a ring.
func TestHolds(t *testing.T) {
	ts := newTestServer(t, nil, nil)
	ts.blobs.held = map[string]bool{}
	for i := range 12 {
		if i != 5 {
			ts.blobs.held[fmt.Sprintf("t/%02d.npy", i)] = true
		}
	}
	q := dial(t, ts.sock) // one connection for every question
	for _, tc := range []struct {
		share *Share
		held  bool
	}{
		{&Share{First: 0, Step: 1, Count: 5}, true},
		{&Share{First: 6, Step: 1, Count: 6}, true},
		{&Share{First: 0, Step: 2, Count: 6}, true},  // the even positions
		{&Share{First: 1, Step: 2, Count: 6}, false}, // 5 is not held
		{&Share{First: 0, Step: 1, Count: 12}, false},
		{&Share{First: 6, Step: 1, Count: 7}, false}, // past the listing
		{&Share{First: 0, Step: 0, Count: 2}, false},
		{&Share{First: -1, Step: 1, Count: 2}, false},
	} {
		if h := q.holds(t, "t", tc.share); !h.OK || h.Held != tc.held {
			t.Errorf("holds %+v: %+v, want held %v", tc.share, h, tc.held)
		}
	}
	if h := q.holds(t, "nope", &Share{First: 0, Step: 1, Count: 1}); h.OK || h.Code != CodeBadRequest || !strings.Contains(h.Error, "nope: not a sample directory") {
		t.Errorf("holds of no directory: %+v", h)
	}
	if h := q.holds(t, "t", nil); h.OK || h.Code != CodeBadRequest || !strings.Contains(h.Error, "t: holds names no share") {
		t.Errorf("holds of no share: %+v", h)
	}
	// Not on a ring's connection: its replies are the fills'.
	c := dial(t, ts.sock)
	if rep := c.open(t, OpenRequest{Dir: "t", Memory: MemoryHost, Slots: 2, Batch: 2}); !rep.OK {
		t.Fatalf("open over a held share: %+v", rep)
	}
	c.send(t, HoldsRequest{Op: "holds", Dir: "t", Share: &Share{First: 0, Step: 1, Count: 1}})
	if r := c.next(t); r.Op != "error" || r.Code != CodeBadRequest || !strings.Contains(r.Error, `op "holds": want open first`) {
		t.Errorf("holds on a ring's connection: %+v", r)
	}
	if _, tot := ts.s.Stats(); tot.Opened != 1 {
		t.Fatalf("%d rings opened, want the one asked for", tot.Opened)
	}
}

func (c *client) holds(t testing.TB, dir string, sh *Share) holdsReply {
	t.Helper()
	c.send(t, HoldsRequest{Op: "holds", Dir: dir, Share: sh})
	var rep holdsReply
	c.recv(t, &rep)
	return rep
}

// A sample whose chunk is damaged fails its fill with an error naming the
// file and the chunk; the connection goes on serving.
func TestFillErrorNamesTheFile(t *testing.T) {
	ts := newTestServer(t, map[int64]bool{5: true}, nil)
	c := dial(t, ts.sock)
	c.open(t, OpenRequest{Dir: "t", Memory: MemoryHost, Slots: 2, Batch: 2})
	r := c.fill(t, 0, "04.npy", "05.npy")
	if r.Op != "error" || r.Code != CodeFill || r.File != "t/05.npy" || !strings.Contains(r.Error, "t/5.0.0") {
		t.Fatalf("damaged sample: %+v", r)
	}
	if r := c.fill(t, 1, "06.npy"); r.Op != "ready" || !bytes.Equal(c.sample(1, 0), ts.want(t, "t/06.npy")) {
		t.Fatalf("after the error: %+v", r)
	}
}

// Requests the server cannot take are refused with a reason, and the ring
// of a connection that closes is freed.
func TestBadRequestsAndRingFreed(t *testing.T) {
	ts := newTestServer(t, nil, nil)
	for _, tc := range []struct {
		req  OpenRequest
		code string
		msg  string
	}{
		{OpenRequest{Dir: "nope", Memory: MemoryHost, Slots: 2, Batch: 2}, CodeBadRequest, "not a sample directory"},
		{OpenRequest{Dir: "t", Memory: MemoryHost, Slots: 0, Batch: 2}, CodeBadRequest, "want 1 to 64 slots"},
		{OpenRequest{Dir: "t", Memory: MemoryCUDA, Slots: 2, Batch: 2, PCIBusID: "0000:01:00.0"}, CodeUnavailable, "host memory"},
		{OpenRequest{Dir: "t", Memory: MemoryHost, Slots: 2, Batch: 2, ConsumerEvents: []string{"00"}}, CodeBadRequest, "1 consumer events for 2 slots"},
	} {
		c := dial(t, ts.sock)
		if rep := c.open(t, tc.req); rep.OK || rep.Code != tc.code || !strings.Contains(rep.Error, tc.msg) {
			t.Errorf("%+v: %+v", tc.req, rep)
		}
	}
	c := dial(t, ts.sock)
	c.open(t, OpenRequest{Dir: "t", Memory: MemoryHost, Slots: 2, Batch: 2})
	for _, tc := range []struct {
		req fillRequest
		msg string
	}{
		{fillRequest{Op: "fill", Slot: 0, Files: []string{"99.npy"}}, "t/99.npy: no such sample"},
		{fillRequest{Op: "fill", Slot: 0, Files: []string{"../t/00.npy"}}, "no such sample"},
		{fillRequest{Op: "fill", Slot: 0, Files: []string{"00.npy", "01.npy", "02.npy"}}, "want 1 to 2"},
	} {
		c.send(t, tc.req)
		if r := c.next(t); r.Op != "error" || r.Code != CodeBadRequest || !strings.Contains(r.Error, tc.msg) {
			t.Errorf("%+v: %+v", tc.req, r)
		}
	}
	if _, tot := ts.s.Stats(); tot.Open != 1 {
		t.Fatalf("%d rings open, want 1", tot.Open)
	}
	c.send(t, fillRequest{Op: "fill", Slot: 2, Files: []string{"00.npy"}})
	if r := c.next(t); r.Code != CodeBadRequest {
		t.Fatalf("slot 2 of 2: %+v", r)
	}
	// A slot out of range ends the connection, and its ring goes.
	waitFor(t, func() bool { _, tot := ts.s.Stats(); return tot.Open == 0 && tot.HeldBytes == 0 })
	c2 := dial(t, ts.sock)
	c2.open(t, OpenRequest{Dir: "t", Memory: MemoryHost, Slots: 1, Batch: 1})
	c2.c.Close() // the reader dies
	waitFor(t, func() bool { _, tot := ts.s.Stats(); return tot.Open == 0 && tot.HeldBytes == 0 && tot.Opened == 2 })
}

// A request is read up to MaxRequest bytes, however many reads it takes;
// one byte more is refused with the reason, and the connection closed.
func TestRequestLineBound(t *testing.T) {
	ts := newTestServer(t, nil, nil)
	c := dial(t, ts.sock)
	c.open(t, OpenRequest{Dir: "t", Memory: MemoryHost, Slots: 2, Batch: 2})
	line := func(n int) []byte {
		b, _ := json.Marshal(fillRequest{Op: "fill", Slot: 0, Files: []string{"06.npy"}})
		// JSON's spaces, before the closing brace, make it n bytes.
		pad := bytes.Repeat([]byte(" "), n-len(b)-1)
		return append(append(b[:len(b)-1:len(b)-1], pad...), '}', '\n')
	}
	if _, err := c.c.Write(line(MaxRequest)); err != nil {
		t.Fatal(err)
	}
	if r := c.next(t); r.Op != "ready" || !bytes.Equal(c.sample(0, 0), ts.want(t, "t/06.npy")) {
		t.Fatalf("a request of %d bytes: %+v", MaxRequest, r)
	}
	// The connection reads the next request from where the long one ended.
	if r := c.fill(t, 1, "07.npy"); r.Op != "ready" || !bytes.Equal(c.sample(1, 0), ts.want(t, "t/07.npy")) {
		t.Fatalf("after the long request: %+v", r)
	}
	go c.c.Write(line(MaxRequest + 1))
	if r := c.next(t); r.Op != "error" || r.Code != CodeBadRequest || r.Error != "request longer than 1 MiB" {
		t.Fatalf("a request of %d bytes: %+v", MaxRequest+1, r)
	}
	waitFor(t, func() bool { _, tot := ts.s.Stats(); return tot.Open == 0 && tot.HeldBytes == 0 })
}

func waitFor(t *testing.T, ok func() bool) {
	t.Helper()
	for range 500 {
		if ok() {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatal("condition not met in 5 s")
}

// noGPUs is a mount that decodes on no GPU.
type noGPUs struct{ why string }

func (n noGPUs) GPUFor(context.Context, string) (*gpu.Decoder, func(), error) {
	return nil, nil, errors.New(n.why)
}

// A mount whose GPUs cannot take a ring says why, as "unavailable": the
// reader then reads files.
func TestCUDAMemoryUnavailable(t *testing.T) {
	ts := newTestServer(t, nil, nil, CUDAMemory{GPUs: noGPUs{why: "it decodes on no GPU here"}})
	for _, tc := range []struct {
		req OpenRequest
		msg string
	}{
		{OpenRequest{Dir: "t", Memory: MemoryCUDA, PCIBusID: "0000:3b:00.0", Slots: 2, Batch: 2}, "decodes on no GPU here"},
		{OpenRequest{Dir: "t", Memory: MemoryCUDA, Slots: 2, Batch: 2}, "named no GPU"},
		{OpenRequest{Dir: "t", Memory: MemoryCUDA, PCIBusID: "0000:3b:00.0", Slots: 2, Batch: 2, ConsumerEvent: "00"}, "one per slot"},
		{OpenRequest{Dir: "t", Memory: MemoryHost, Slots: 2, Batch: 2}, "not host"},
	} {
		c := dial(t, ts.sock)
		if rep := c.open(t, tc.req); rep.OK || rep.Code != CodeUnavailable || !strings.Contains(rep.Error, tc.msg) {
			t.Errorf("%+v: %+v", tc.req, rep)
		}
	}
}

// startingGPUs is a mount whose GPUs never finish starting.
type startingGPUs struct{}

func (startingGPUs) GPUFor(ctx context.Context, _ string) (*gpu.Decoder, func(), error) {
	<-ctx.Done()
	return nil, nil, ctx.Err()
}

// A ring's open waits for the GPUs to start only while its connection's
// context lasts: a mount that closes meanwhile is not held for the start's
// whole bound (2 minutes).
func TestCUDARingOpenEndsWithItsContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(50*time.Millisecond, cancel)
	t0 := time.Now()
	_, err := CUDAMemory{GPUs: startingGPUs{}}.NewRing(ctx, &OpenRequest{Memory: MemoryCUDA, PCIBusID: "0000:3b:00.0", Slots: 2, Batch: 2}, 2, 4096)
	if !errors.Is(err, context.Canceled) || !errors.Is(err, ErrUnavailable) || time.Since(t0) > 10*time.Second {
		t.Fatalf("a ring opened while the mount closed: %v after %v", err, time.Since(t0))
	}
}

// must is v, for options a test knows to be valid.
func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

// The rings open together stay within MaxHeldBytes: a ring that fits
// alone but not beside those open is refused as unavailable (the reader
// reads files), and opens once they are freed.
func TestRingsTogetherWithinBound(t *testing.T) {
	ts := newTestServer(t, nil, nil)
	ts.s.MaxHeldBytes = 3 * slotAlign // a slot of these samples is slotAlign
	a := dial(t, ts.sock)
	if rep := a.open(t, OpenRequest{Dir: "t", Memory: MemoryHost, Slots: 2, Batch: 2}); !rep.OK || rep.RingBytes != 2*slotAlign {
		t.Fatalf("first ring: %+v", rep)
	}
	b := dial(t, ts.sock)
	if rep := b.open(t, OpenRequest{Dir: "t", Memory: MemoryHost, Slots: 2, Batch: 2}); rep.OK || rep.Code != CodeUnavailable ||
		!strings.Contains(rep.Error, "may hold 6291456 together") || !rep.Full {
		t.Fatalf("a second ring past the bound together: %+v", rep)
	}
	if _, tot := ts.s.Stats(); tot.HeldBytes != 2*slotAlign || tot.Open != 1 {
		t.Fatalf("held %d in %d rings after the refusal, want the first's %d", tot.HeldBytes, tot.Open, 2*slotAlign)
	}
	a.c.Close()
	waitFor(t, func() bool { _, tot := ts.s.Stats(); return tot.HeldBytes == 0 })
	c := dial(t, ts.sock)
	if rep := c.open(t, OpenRequest{Dir: "t", Memory: MemoryHost, Slots: 3, Batch: 1}); !rep.OK {
		t.Fatalf("a ring within the bound once the first is freed: %+v", rep)
	}
}

// refusingMemory refuses every ring with err.
type refusingMemory struct {
	HostMemory
	err error
}

func (m refusingMemory) NewRing(context.Context, *OpenRequest, int, int64) (Ring, error) {
	return nil, m.err
}

// A ring refused for want of room in the mount's GPU memory says so
// (Full): the reader may ask for fewer slots, and tell its user which
// bound kept the ring from it; a ring refused for another reason (another
// GPU) does not.
func TestRingRefusedForRoomSaysFull(t *testing.T) {
	for _, c := range []struct {
		err  error
		full bool
	}{
		{fmt.Errorf("%w: %w: a ring of 8 bytes beside 0 held, budget 4 (--gpu-memory)", ErrUnavailable, gpu.ErrBudget), true},
		{fmt.Errorf("%w: no GPU of the mount has PCI bus id 0000:3b:00.0", ErrUnavailable), false},
		{fmt.Errorf("map a shadow: %w", gpu.ErrBudget), false}, // not unavailable: a fill error, nothing to retry smaller
	} {
		ts := newTestServer(t, nil, nil, refusingMemory{err: c.err})
		rep := dial(t, ts.sock).open(t, OpenRequest{Dir: "t", Memory: MemoryHost, Slots: 2, Batch: 2})
		if rep.OK || rep.Full != c.full || !strings.Contains(rep.Error, c.err.Error()) {
			t.Errorf("%v: %+v, want full %v", c.err, rep, c.full)
		}
	}
}

// emfileListener fails its first fails accepts as a process out of
// descriptors does, then accepts; at holds when each was asked for.
type emfileListener struct {
	net.Listener
	fails int
	mu    sync.Mutex
	at    []time.Time
}

func (l *emfileListener) Accept() (net.Conn, error) {
	l.mu.Lock()
	l.at = append(l.at, time.Now())
	n := len(l.at)
	l.mu.Unlock()
	if n <= l.fails {
		return nil, &net.OpError{Op: "accept", Net: "unix", Err: os.NewSyscallError("accept4", syscall.EMFILE)}
	}
	return l.Listener.Accept()
}

// Accepts that fail for a while (the daemon out of descriptors) do not
// stop the delivery socket: the server backs off and accepts again, so a
// reader that connected meanwhile is answered, and it logs the failure
// once, not per retry.
func TestAcceptErrorsPass(t *testing.T) {
	ts := unstartedTestServer(t, nil, nil)
	logs := &syncbuf.Buffer{}
	ts.s.Logger = slog.New(slog.NewTextHandler(logs, nil))
	ln := &emfileListener{fails: 4}
	ts.serve(t, func(inner net.Listener) net.Listener { ln.Listener = inner; return ln })
	c := dial(t, ts.sock) // waits in the backlog while the accepts fail
	if rep := c.open(t, OpenRequest{Dir: "t", Memory: MemoryHost, Slots: 1, Batch: 1}); !rep.OK {
		t.Fatalf("open after failed accepts: %+v", rep)
	}
	if r := c.fill(t, 0, "00.npy"); r.Op != "ready" || !bytes.Equal(c.sample(0, 0), ts.want(t, "t/00.npy")) {
		t.Fatalf("fill after failed accepts: %+v", r)
	}
	// Each retry waits twice as long as the one before, from 5 ms.
	ln.mu.Lock()
	at := ln.at[:5]
	ln.mu.Unlock()
	for i := 1; i < len(at); i++ {
		if d, want := at[i].Sub(at[i-1]), acceptBackoff<<(i-1); d < want {
			t.Fatalf("accept %d came %v after the one that failed, want %v at least", i+1, d, want)
		}
	}
	if n := strings.Count(logs.String(), "too many open files"); n != 1 {
		t.Fatalf("the failed accepts logged %d times, want once:\n%s", n, logs)
	}
}
