package deliver

import (
	"bufio"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/zarrfs/zarrfs/fill"
	"github.com/zarrfs/zarrfs/gpu"
	"github.com/zarrfs/zarrfs/layout"
	"github.com/zarrfs/zarrfs/zarr"
)

// Server answers delivery requests on a listener: the mount's delivery
// socket.
type Server struct {
	// Layout returns the tree the mount serves now; Blobs its blobs (the
	// host path opens samples there, as a read of the mount does).
	Layout func() *layout.Layout
	Blobs  fill.Blobs
	// Memory makes the rings; Device, when set, is the device path.
	Memory Memory
	Device DeviceFill
	// MaxSlots bounds one ring's slots; zero means 64. MaxHeldBytes bounds
	// what the open rings hold together (a ring that would pass it is
	// refused as unavailable); zero means no bound beyond Memory's.
	MaxSlots     int
	MaxHeldBytes int64
	// WriteTimeout bounds a reply's write to a reader that does not read.
	// Zero means 30 s.
	WriteTimeout time.Duration
	Logger       *slog.Logger

	log   *slog.Logger
	stats totals

	mu     sync.Mutex
	rings  map[*conn]*ringStats
	nextID int
}

// totals are the counts of every ring since the server started.
type totals struct {
	rings atomic.Int64
	held  atomic.Int64 // bytes of the rings open
	counters
}

// Serve answers connections on ln until ctx ends; it closes ln then, and
// returns once every connection's fills have returned. An accept that
// fails is retried after a pause: Serve returns an error before ctx ends
// only when ln was closed under it.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	if s.Layout == nil || s.Blobs == nil || s.Memory == nil {
		return errors.New("deliver: a Server needs Layout, Blobs and Memory")
	}
	s.log = cmp.Or(s.Logger, slog.New(slog.DiscardHandler))
	s.mu.Lock()
	if s.rings == nil {
		s.rings = map[*conn]*ringStats{}
	}
	s.mu.Unlock()
	go func() {
		<-ctx.Done()
		ln.Close()
	}()
	var wg sync.WaitGroup
	defer wg.Wait()
	var delay time.Duration // the back-off after failed accepts; zero while they succeed
	for {
		c, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			if errors.Is(err, net.ErrClosed) {
				return err
			}
			// Anything else may pass (EMFILE while the daemon's
			// descriptors run out): returning would leave the socket
			// open with no one accepting, and every reader connecting
			// would wait its whole timeout for a reply. Back off as
			// net/http's Server does, and log once per run of failures.
			if delay == 0 {
				s.log.Warn("delivery: cannot accept a connection; retrying", "err", err)
			}
			delay = min(max(2*delay, acceptBackoff), maxAcceptBackoff)
			t := time.NewTimer(delay)
			select {
			case <-ctx.Done():
				t.Stop()
				return nil
			case <-t.C:
			}
			continue
		}
		delay = 0
		wg.Add(1)
		go func() {
			defer wg.Done()
			s.serveConn(ctx, c.(*net.UnixConn))
		}()
	}
}

// acceptBackoff is the first wait after a failed accept, doubling up to
// maxAcceptBackoff while accepts fail.
const (
	acceptBackoff    = 5 * time.Millisecond
	maxAcceptBackoff = time.Second
)

// conn is one reader's connection and its ring.
type conn struct {
	s     *Server
	c     *net.UnixConn
	wmu   sync.Mutex
	ring  Ring
	dir   string // the sample directory, relative to the mount
	size  int64  // data bytes of a sample
	slots int
	batch int
	slot  int64
	held  int64 // the ring's bytes, counted in the server's held bytes
	stats *ringStats
	busy  []atomic.Bool // per slot: a fill runs
}

// serveConn reads requests until the reader closes the connection (or
// dies), then waits for the fills and frees the ring.
func (s *Server) serveConn(ctx context.Context, uc *net.UnixConn) {
	ctx, cancel := context.WithCancel(ctx)
	c := &conn{s: s, c: uc}
	var fills sync.WaitGroup
	defer func() {
		cancel()
		uc.Close()
		fills.Wait()
		c.free()
	}()
	go func() {
		<-ctx.Done()
		uc.SetReadDeadline(time.Now()) // the reader loop ends with the server
	}()
	rd := bufio.NewReaderSize(uc, 64<<10)
	var long []byte // a request longer than rd's buffer, as read so far
	for {
		line, err := rd.ReadSlice('\n')
		if long != nil || errors.Is(err, bufio.ErrBufferFull) {
			long = append(long, line...)
			if len(long) > MaxRequest {
				c.reply(fillReply{Op: "error", Slot: -1, errorReply: errorReply{Error: "request longer than 1 MiB", Code: CodeBadRequest}}, nil)
				return
			}
			if errors.Is(err, bufio.ErrBufferFull) {
				continue
			}
			line, long = long, nil
		}
		if err != nil {
			return
		}
		var req request
		if err := json.Unmarshal(line, &req); err != nil {
			c.reply(fillReply{Op: "error", Slot: -1, errorReply: errorReply{Error: "not a JSON request: " + err.Error(), Code: CodeBadRequest}}, nil)
			return
		}
		switch {
		case req.Op == "open" && c.ring == nil:
			rep, files := s.open(ctx, &req.OpenRequest, c)
			if err := c.reply(rep, files); err != nil || !rep.OK {
				return
			}
		case req.Op == "holds" && c.ring == nil:
			if err := c.reply(s.holds(req.Dir, req.Share), nil); err != nil {
				return
			}
		case req.Op == "fill" && c.ring != nil:
			if req.Slot < 0 || req.Slot >= c.slots || !c.busy[req.Slot].CompareAndSwap(false, true) {
				c.reply(fillReply{Op: "error", Slot: req.Slot, errorReply: errorReply{
					Error: fmt.Sprintf("slot %d: not a slot of the ring (0..%d) or one being filled", req.Slot, c.slots-1), Code: CodeBadRequest}}, nil)
				return
			}
			fills.Add(1)
			go func() {
				defer fills.Done()
				rep := c.fill(ctx, req.Slot, req.Files)
				// Free before the reply: the reader may ask for the slot
				// again as soon as it reads it.
				c.busy[req.Slot].Store(false)
				c.reply(rep, nil)
			}()
		default:
			c.reply(fillReply{Op: "error", Slot: -1, errorReply: errorReply{
				Error: fmt.Sprintf("op %q: want open first, then fill (or holds, without a ring)", req.Op), Code: CodeBadRequest}}, nil)
			return
		}
	}
}

// reply writes one line, with files as SCM_RIGHTS.
func (c *conn) reply(v any, files []*os.File) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	b = append(b, '\n')
	c.wmu.Lock()
	defer c.wmu.Unlock()
	c.c.SetWriteDeadline(time.Now().Add(cmp.Or(c.s.WriteTimeout, 30*time.Second)))
	var oob []byte
	if len(files) > 0 {
		fds := make([]int, len(files))
		for i, f := range files {
			fds[i] = int(f.Fd())
		}
		oob = rights(fds)
	}
	n, _, err := c.c.WriteMsgUnix(b, oob, nil)
	if err == nil && n < len(b) {
		_, err = c.c.Write(b[n:])
	}
	return err
}

// open makes the connection's ring for the sample directory req names.
func (s *Server) open(ctx context.Context, req *OpenRequest, c *conn) (openReply, []*os.File) {
	fail := func(code, format string, args ...any) (openReply, []*os.File) {
		return openReply{errorReply: errorReply{Error: fmt.Sprintf(format, args...), Code: code}}, nil
	}
	lay := s.Layout()
	dir, _, first, ok := sampleDir(lay, req.Dir)
	if !ok {
		return fail(CodeBadRequest, "%s: not a sample directory of the mount", req.Dir)
	}
	maxSlots := cmp.Or(s.MaxSlots, 64)
	// No fill names more files than a request holds: each costs at least
	// its quotes, a character and a comma.
	const maxBatch = MaxRequest / 4
	if req.Slots < 1 || req.Slots > maxSlots || req.Batch < 1 || req.Batch > maxBatch {
		return fail(CodeBadRequest, "%d slots of %d samples: want 1 to %d slots of 1 to %d samples", req.Slots, req.Batch, maxSlots, maxBatch)
	}
	if n := len(req.ConsumerEvents); n != 0 && n != req.Slots {
		return fail(CodeBadRequest, "%d consumer events for %d slots: want one per slot", n, req.Slots)
	}
	size := first.Size() - int64(len(first.Header()))
	slot := alignUp(int64(req.Batch)*size, slotAlign)
	total := slot * int64(req.Slots)
	// The ring's bytes are counted before it is made: rings opened at once
	// cannot pass the bound together.
	if held := s.stats.held.Add(total); s.MaxHeldBytes > 0 && held > s.MaxHeldBytes {
		s.stats.held.Add(-total)
		rep, fds := fail(CodeUnavailable, "%d slots of %d samples of %d bytes take %d bytes; the mount's rings hold %d, and may hold %d together",
			req.Slots, req.Batch, size, total, held-total, s.MaxHeldBytes)
		rep.Full = true
		return rep, fds
	}
	r, err := s.Memory.NewRing(ctx, req, req.Slots, slot)
	if err != nil {
		s.stats.held.Add(-total)
		code := CodeFill
		if errors.Is(err, ErrUnavailable) {
			code = CodeUnavailable
		}
		rep, fds := fail(code, "%s: ring of %d bytes: %v", req.Dir, total, err)
		rep.Full = code == CodeUnavailable && errors.Is(err, gpu.ErrBudget)
		return rep, fds
	}
	shape, dtype := sampleType(first)
	c.ring, c.dir, c.size, c.slots, c.batch, c.slot, c.held = r, dir, size, req.Slots, req.Batch, slot, total
	c.busy = make([]atomic.Bool, req.Slots)
	s.mu.Lock()
	s.nextID++
	c.stats = &ringStats{ID: s.nextID, Dir: dir, Memory: s.Memory.Kind(), Device: r.Device(), Slots: req.Slots,
		SlotBytes: slot, SampleBytes: size, Opened: time.Now()}
	s.rings[c] = c.stats
	s.mu.Unlock()
	s.stats.rings.Add(1)
	decodeWhere := "host"
	if s.Device != nil && s.Memory.Kind() == MemoryCUDA {
		decodeWhere = "device"
	}
	rep := openReply{OK: true, Memory: s.Memory.Kind(), RingBytes: r.Bytes(), SlotBytes: slot, SampleBytes: size,
		Shape: shape, DType: dtype, Slots: req.Slots, Batch: req.Batch, Device: r.Device(), Decode: decodeWhere}
	files := r.Describe(&rep)
	s.log.Info("delivery ring opened", "dir", dir, "memory", rep.Memory, "device", rep.Device, "slots", req.Slots, "batch", req.Batch, "bytes", r.Bytes())
	return rep, files
}

// holds answers a HoldsRequest: whether the cache holds every sample of sh
// in the sample directory dir names.
func (s *Server) holds(dir string, sh *Share) holdsReply {
	lay := s.Layout()
	_, ls, _, ok := sampleDir(lay, dir)
	if !ok {
		return holdsReply{errorReply: errorReply{Error: dir + ": not a sample directory of the mount", Code: CodeBadRequest}}
	}
	if sh == nil {
		return holdsReply{errorReply: errorReply{Error: dir + ": holds names no share", Code: CodeBadRequest}}
	}
	return holdsReply{OK: true, Held: s.holdsShare(lay, ls, *sh)}
}

// holdsShare reports whether the cache holds every sample of sh in the
// sample directory listed by ls: false when the mount's blobs cannot tell
// without a request, or sh is not within the listing (a listing that
// changed since the reader read it).
func (s *Server) holdsShare(lay *layout.Layout, ls *layout.Dir, sh Share) bool {
	h, ok := s.Blobs.(holder)
	if !ok {
		return false
	}
	n := int64(ls.Len())
	if sh.Count < 1 || sh.Count > n || sh.Step < 1 || sh.Step > n || sh.First < 0 || sh.First+(sh.Count-1)*sh.Step >= n {
		return false
	}
	for j := range sh.Count {
		b := ls.Entry(int(sh.First + j*sh.Step)).Blob
		if b == nil || !h.Holds(lay, b) {
			return false
		}
	}
	return true
}

// slotAlign aligns slots: huge pages on the host, and more than any
// decoder's output alignment on a GPU.
const slotAlign = 2 << 20

func alignUp(x, a int64) int64 { return (x + a - 1) / a * a }

// free closes the ring once no fill writes it.
func (c *conn) free() {
	if c.ring == nil {
		return
	}
	s := c.s
	s.mu.Lock()
	delete(s.rings, c)
	s.mu.Unlock()
	s.stats.held.Add(-c.held)
	if err := c.ring.Close(); err != nil {
		s.log.Warn("delivery ring not freed", "dir", c.dir, "err", err)
		return
	}
	s.log.Info("delivery ring closed", "dir", c.dir, "fills", c.stats.fills.Load())
}

// fill answers one fill request.
func (c *conn) fill(ctx context.Context, k int, files []string) fillReply {
	s := c.s
	rep := fillReply{Op: "error", Slot: k}
	if len(files) == 0 || len(files) > c.batch {
		rep.Error, rep.Code = fmt.Sprintf("%d files: want 1 to %d (the batch)", len(files), c.batch), CodeBadRequest
		return rep
	}
	lay := s.Layout()
	job := newSlotJob(lay, c.size)
	for j, name := range files {
		p := c.dir + "/" + name
		e, ok := lay.Lookup(p)
		if !ok || e.Blob == nil || strings.Contains(name, "/") {
			rep.Error, rep.Code, rep.File = fmt.Sprintf("%s: no such sample in the mount", p), CodeBadRequest, p
			return rep
		}
		if got := e.Blob.Size() - int64(len(e.Blob.Header())); got != c.size {
			// The tree changed under the ring (a refresh with another
			// sample shape): the reader must open a new one.
			rep.Error, rep.Code, rep.File = fmt.Sprintf("%s: sample of %d bytes, the ring's are %d (the store changed)", p, got, c.size), CodeBadRequest, p
			return rep
		}
		job.blobs = append(job.blobs, e.Blob)
		job.offs = append(job.offs, int64(j)*c.size)
	}
	t0 := time.Now()
	first := c.stats.started.Add(1) == 1
	dev, host, failed, err := s.fillSlot(ctx, c.ring, k, job)
	job.stages.add(stFill, time.Since(t0))
	if first {
		s.mu.Lock()
		c.stats.firstFill = &FirstFill{Began: t0, Stages: job.stages.doc()}
		s.mu.Unlock()
	}
	c.stats.add(job, dev, host, err)
	s.stats.add(job, dev, host, err)
	if errors.Is(err, gpu.ErrRingLost) {
		rep.Error, rep.Code = err.Error(), CodeRingLost
		s.log.Warn("delivery: ring lost", "dir", c.dir, "cause", err)
		return rep
	}
	if err != nil {
		rep.Error, rep.Code = err.Error(), CodeFill
		if failed != nil {
			rep.File = failed.Path()
			var ce *zarr.ChunkError
			if errors.As(err, &ce) {
				s.log.Error("delivery: cannot fill sample", "file", failed.Path(), "array", ce.Array, "chunk", ce.Key, "cause", ce.Err)
			} else {
				s.log.Error("delivery: cannot fill sample", "file", failed.Path(), "cause", err)
			}
		}
		return rep
	}
	rep.Op, rep.Device, rep.Host = "ready", dev, host
	return rep
}

// sampleDir resolves the sample directory a request names ("t",
// "/views/era5/"): its path relative to the mount's root, its listing and
// its first listed sample; ok is false for a name that is no sample
// directory of the mount.
func sampleDir(lay *layout.Layout, name string) (dir string, ls *layout.Dir, first layout.Blob, ok bool) {
	dir = strings.Trim(path.Clean("/"+name), "/")
	e, found := lay.Lookup(dir)
	if !found || e.Dir == nil || e.Dir.Len() == 0 {
		return dir, nil, nil, false
	}
	f := e.Dir.Entry(0)
	if f.Blob == nil || e.Dir.Entry(e.Dir.Len()-1).Blob == nil {
		return dir, nil, nil, false
	}
	return dir, e.Dir, f.Blob, true
}
