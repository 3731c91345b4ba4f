package cache

import (
	"cmp"
	"container/list"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/zarrfs/zarrfs/internal/memory"
	"golang.org/x/sys/unix"
)

// Sentinel errors, checked with errors.Is.
var (
	// ErrClosed is returned by calls on a Cache after Close.
	ErrClosed = errors.New("cache closed")
	// ErrInvalidKey is returned for a BlobKey that would escape its
	// directory or is not a clean relative path.
	ErrInvalidKey = errors.New("invalid cache key")
	// ErrFillSize is returned when a fill wrote a different number of bytes
	// than the size it was asked for.
	ErrFillSize = errors.New("fill wrote wrong size")
)

// Options configure Open. Zero values mean the documented defaults.
type Options struct {
	// Dir is the cache root; required. Created if absent. Blobs live under
	// Dir/blobs, chunks under Dir/chunks, fills in progress under Dir/tmp,
	// the index in Dir/journal, the directory lock in Dir/lock.
	Dir string
	// Size is the byte budget for blobs and chunks together. It counts file
	// contents, not filesystem blocks. 0 means what the cache's filesystem
	// can hold: the cache's entries plus the free space at Open, less a
	// twentieth (at most 1 GiB) for the journal, counted in blocks. A Size
	// larger than that is lowered to it.
	Size int64
	// Logger receives recovery summaries (Info), dropped or corrupt entries
	// (Warn) and evictions (Debug). Nil discards.
	Logger *slog.Logger
	// Memory lends the buffers a file is hashed through when it is
	// checked (the process's one lender). Nil means ordinary memory.
	Memory memory.Lender
	// BlobMode is the permission of decoded blobs: zero means
	// DefaultBlobMode (0400, the owner only), or 0440 with BlobGroup. Only
	// read bits count (0440, 0444; a write bit is dropped: blobs are
	// read-only, to their owner too); the directories
	// leading to blobs get the matching search bits. The chunk tier, the
	// journal, the lock and temp files are owner-only whatever it is.
	BlobMode fs.FileMode
	// BlobGroup, when set, is the group (gid) given to blobs and the
	// directories leading to them, Dir included; the caller must be
	// allowed to chown to it. Nil means Dir's group when BlobMode lets the
	// group read, so that every instance gives blobs one group.
	BlobGroup *uint32

	// noSync skips the filesystem sync before the journal is compacted and
	// at a clean Close. Only tests that build large caches quickly set it.
	noSync bool
	// compactMin overrides the journal growth (1 MiB) before an instance
	// tries to compact it; tests set it small.
	compactMin int64
	// onSync, when set, is called after each filesystem sync (tests).
	onSync func()
}

// Cache is a byte-bounded, persistent, crash-safe cache on local disk with
// two tiers (decoded blobs and compressed chunks) under one budget. All
// methods are safe for concurrent use, and several Cache values (in one
// process or many) may share one Dir.
type Cache struct {
	dir     string
	budget  int64
	unit    int64 // the filesystem's block size when the budget is the filesystem's, else 1
	derived bool  // the budget is what the filesystem can hold
	log     *slog.Logger
	mem     memory.Lender // lends hashBuf's buffers; nil: ordinary memory
	noSync  bool
	// mapOnce sets mapOK: whether large writes may go through a mapping
	// (mapsWrites).
	mapOnce    sync.Once
	mapOK      bool
	compactMin int64
	onSync     func()
	// treeSums says which checksum this instance's records hold: the
	// segment hash when the journal is of version 3, else xxh64
	// (checksum.go). Set at Open and by a compaction, which writes
	// version 3.
	treeSums atomic.Bool

	acc      access   // modes and group of what the cache creates
	lockFile *os.File // Dir/lock, OFD read lock held while open
	inst     *instance

	base     context.Context // cancelled by Close; parent of every fill
	stop     context.CancelFunc
	wg       sync.WaitGroup // running flights
	wb       *writeback     // starts the disk writes of filled blobs
	closeMu  sync.Once
	closeErr error

	mu     sync.Mutex
	closed bool
	idx    map[string]*entry
	// byIdent finds a blob by layout directory and identity, so that a
	// blob whose path changed but whose bytes did not (sample names
	// widened when a store grew past a power of ten) is linked, not filled.
	byIdent map[string]*entry
	lru     list.List // of *entry, most recently used at the front
	used    int64     // what indexed entries count against the budget (charge)
	bytes   int64     // bytes of indexed entries
	// chunkBytes and chunks are the part of bytes and of the index that
	// is the chunk tier (TierUsage).
	chunkBytes int64
	chunks     int
	// chunksOf counts the chunks indexed by the tag of the store they came
	// from (entry.ident of a chunk): ChunkTier.HoldsStore.
	chunksOf map[string]int
	inflight int64 // bytes reserved by fills of this instance
	quit     map[string]bool
	intern   map[string]string
	jf       *os.File // journal, O_APPEND
	joff     int64    // bytes of the journal applied to idx
	jbuf     []byte
	jnext    int64 // journal size at which to try compaction next
	// compacted is the journal's size after its last compaction (or a
	// clean Open); a journal still that size needs no compaction at Close.
	compacted int64

	counts counters // Stats (stats.go)

	// blobFlights are the blob fills running, by path and identity, or by
	// path alone for one that learns its identity (learnFlight).
	blobFlights  map[string]*flight[filled]
	chunkFlights map[string]*flight[[]byte]
}

// entry is one complete file: a blob or a chunk, keyed by its path
// relative to Dir ("blobs/<layout>/<path>" or "chunks/ab/<hash>").
type entry struct {
	key  string
	size int64
	sum  checksum
	// ident is a blob's identity (BlobKey.Identity), or the tag of the
	// store a chunk came from (storeTag); "" for none (chunks kept
	// before stores were recorded).
	ident   string
	writer  string // instance that added it
	trusted bool   // verified, or written by an instance known to have finished it
	pins    int    // open Handles in this instance
	// mtime is the file's modification time (UnixNano) as this instance
	// first saw it: when it published the file, or opened it first. 0:
	// not seen yet. A file whose time or size differs since was written
	// in place (openIndexed).
	mtime int64
	elem  *list.Element
}

const (
	blobsDir   = "blobs"
	chunksDir  = "chunks"
	tmpDir     = "tmp"
	journalRel = "journal"
	lockRel    = "lock"
)

// Open opens (creating if needed) the cache at opts.Dir.
//
// If no other instance is using Dir, Open recovers from whatever happened
// to the last one: it removes torn temp files, rebuilds the index from the
// journal, checks the size and checksum of every entry that a killed
// instance added after the journal was last compacted (dropping the ones
// that do not match, and files whose deletion was logged but not done),
// and compacts the journal. A clean previous shutdown leaves nothing to
// check, so a restart costs one read of the journal.
//
// If another instance is running, Open joins it: it removes only the temp
// files of dead instances and trusts the journal as it stands.
func Open(opts Options) (*Cache, error) {
	if opts.Dir == "" {
		return nil, errors.New("cache: Options.Dir is required")
	}
	if opts.Size < 0 {
		return nil, fmt.Errorf("cache %s: negative size %d", opts.Dir, opts.Size)
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	acc, lf, err := prepareRoot(&opts)
	if err != nil {
		return nil, err
	}
	c := &Cache{
		dir:          opts.Dir,
		acc:          acc,
		budget:       opts.Size,
		log:          log.With("cache", opts.Dir),
		mem:          opts.Memory,
		noSync:       opts.noSync,
		onSync:       opts.onSync,
		compactMin:   cmp.Or(opts.compactMin, 1<<20),
		lockFile:     lf,
		idx:          map[string]*entry{},
		byIdent:      map[string]*entry{},
		chunksOf:     map[string]int{},
		quit:         map[string]bool{},
		intern:       map[string]string{},
		blobFlights:  map[string]*flight[filled]{},
		chunkFlights: map[string]*flight[[]byte]{},
	}
	c.base, c.stop = context.WithCancel(context.Background())
	c.wb = newWriteback(opts.noSync)
	fail := func(err error) (*Cache, error) {
		c.wb.close()
		if c.jf != nil {
			c.jf.Close()
		}
		if c.inst != nil {
			c.inst.close()
		}
		lf.Close()
		return nil, fmt.Errorf("cache %s: %w", opts.Dir, err)
	}
	if c.inst, err = newInstance(filepath.Join(opts.Dir, tmpDir)); err != nil {
		return fail(err)
	}
	if opts.Size == 0 {
		if sp, err := statSpace(opts.Dir); err == nil {
			c.unit = sp.block
		}
	}
	start := time.Now()
	exclusive := true
	if err := ofdLock(lf, syscall.F_WRLCK, false); err != nil {
		if !isWouldBlock(err) {
			return fail(fmt.Errorf("lock: %w", err))
		}
		exclusive = false
		// Waits while another instance recovers or compacts.
		if err := ofdLock(lf, syscall.F_RDLCK, true); err != nil {
			return fail(fmt.Errorf("lock: %w", err))
		}
	}
	var st recoveryStats
	if exclusive {
		_, jerr := os.Lstat(filepath.Join(opts.Dir, journalRel))
		st, err = c.recover()
		if err == nil {
			err = c.applyAccess(jerr == nil)
		}
		if err == nil {
			err = ofdLock(lf, syscall.F_RDLCK, false) // atomic downgrade
		}
	} else if err = c.checkAccess(); err == nil {
		st, err = c.join()
	}
	if err != nil {
		return fail(err)
	}
	c.mu.Lock()
	c.deriveBudget(opts.Size)
	c.evictLocked()
	used, n := c.bytes, len(c.idx)
	c.mu.Unlock()
	logf := c.log.Debug
	if st.suspicious+st.dropped+st.temps+st.torn > 0 {
		logf = c.log.Info // recovery did something worth a line
	}
	logf("cache open", "exclusive", exclusive, "entries", n, "bytes", used, "budget", c.budget, "blob_mode", c.acc.String(),
		"suspicious", st.suspicious, "dropped", st.dropped, "temps_removed", st.temps, "torn_records", st.torn,
		"duration", time.Since(start))
	return c, nil
}

type recoveryStats struct{ suspicious, dropped, temps, torn int }

// replayState is the journal's final word on one key.
type replayState struct {
	rec       record
	present   bool
	seq       int  // position of its last record, for LRU order
	afterMark bool // its last record came after the last marker
}

// replay reads the whole journal into states. Missing means the journal
// does not exist.
func (c *Cache) replay(buf []byte) (states map[string]*replayState, quit map[string]bool, torn, consumed, afterMark int) {
	states = make(map[string]*replayState, len(buf)/80)
	quit = map[string]bool{}
	seq := 0
	var slab []replayState // one allocation per 4096 keys, not per key
	consumed, torn = scanRecords(buf[len(journalHeader):], c.intern, func(r record) {
		seq++
		afterMark++
		switch r.op {
		case opMarker:
			for _, s := range states {
				s.afterMark = false
			}
			clear(quit)
			afterMark = 0
		case opQuit:
			quit[r.writer] = true
		case opAdd, opDel:
			s := states[r.key]
			if s == nil {
				if len(slab) == cap(slab) {
					slab = make([]replayState, 0, 4096)
				}
				slab = slab[:len(slab)+1]
				s = &slab[len(slab)-1]
				states[r.key] = s
			}
			s.rec, s.present, s.seq, s.afterMark = r, r.op == opAdd, seq, true
		}
	})
	return states, quit, torn, consumed + len(journalHeader), afterMark
}

// prepareRoot makes opts.Dir absolute (paths handed out, blob files, link
// targets in direct mode, what warm prints, must name the same file from
// any working directory), makes the cache's directories with the access
// the options ask for, and opens its lock file.
func prepareRoot(opts *Options) (access, *os.File, error) {
	abs, err := filepath.Abs(opts.Dir)
	if err != nil {
		return access{}, nil, fmt.Errorf("cache %s: %w", opts.Dir, err)
	}
	opts.Dir = abs
	acc, err := newAccess(opts.BlobMode, opts.BlobGroup)
	if err != nil {
		return access{}, nil, fmt.Errorf("cache %s: %w", opts.Dir, err)
	}
	if err := makeRoot(opts.Dir); err != nil {
		if oe := (*OwnerError)(nil); errors.As(err, &oe) {
			return access{}, nil, err // names the directory itself
		}
		return access{}, nil, fmt.Errorf("cache %s: %w", opts.Dir, err)
	}
	if acc.blobFile&0o040 != 0 && acc.gid < 0 {
		if fi, err := os.Stat(opts.Dir); err == nil {
			acc.gid = groupOf(fi)
		}
	}
	pre := &Cache{dir: opts.Dir, acc: acc}
	for _, d := range []string{blobsDir, chunksDir, tmpDir} {
		if err := pre.mkdirs(d); err != nil {
			return access{}, nil, fmt.Errorf("cache %s: %w", opts.Dir, err)
		}
	}
	lf, err := os.OpenFile(filepath.Join(opts.Dir, lockRel), os.O_RDWR|os.O_CREATE, privateFile)
	if err != nil {
		return access{}, nil, fmt.Errorf("cache %s: %w", opts.Dir, err)
	}
	return acc, lf, nil
}

// recover runs with the directory lock held for writing: no other instance
// is alive.
func (c *Cache) recover() (recoveryStats, error) {
	var st recoveryStats
	var err error
	if st.temps, err = sweepTemps(filepath.Join(c.dir, tmpDir), c.inst.id, true); err != nil {
		return st, err
	}
	jp := filepath.Join(c.dir, journalRel)
	buf, err := os.ReadFile(jp)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return st, fmt.Errorf("journal: %w", err)
	}
	fresh := err != nil || checkHeader(buf) != nil
	if fresh {
		// Nothing on disk can be vouched for without the index: start over.
		if err == nil {
			c.log.Warn("cache journal unreadable; emptying the cache", "path", jp)
		}
		for _, d := range []string{blobsDir, chunksDir} {
			p := filepath.Join(c.dir, d)
			if err := os.RemoveAll(p); err != nil {
				return st, err
			}
			if err := c.mkdirs(d); err != nil {
				return st, err
			}
		}
		buf = []byte(journalHeader)
	}
	states, quit, torn, consumed, afterMark := c.replay(buf)
	st.torn = torn

	var check []*replayState
	live := make([]*replayState, 0, len(states))
	for key, s := range states {
		suspicious := s.afterMark && !quit[s.rec.writer]
		switch {
		case s.present && suspicious:
			check = append(check, s)
		case s.present:
			live = append(live, s)
		case suspicious:
			// Deleted in the journal; the unlink after it may not have
			// happened before the kill.
			if err := os.Remove(filepath.Join(c.dir, key)); err == nil {
				st.dropped++
			}
		}
	}
	st.suspicious = len(check)
	for i, ok := range c.verifyAll(check) {
		if ok {
			live = append(live, check[i])
			continue
		}
		st.dropped++
		c.log.Warn("cache entry failed verification; removed", "key", check[i].rec.key)
		os.Remove(filepath.Join(c.dir, check[i].rec.key))
	}
	sortBySeq(live)
	c.idx = make(map[string]*entry, len(live))
	c.byIdent = map[string]*entry{}
	c.chunksOf = map[string]int{}
	for _, s := range live {
		c.insertLocked(s.rec, true)
	}
	// A version 1 journal is rewritten in the current format.
	current := string(buf[:len(journalHeader)]) == journalHeader
	if !fresh && current && afterMark == 0 && torn == 0 && consumed == len(buf) && st.dropped == 0 {
		// A clean shutdown left a compact journal: keep it as it is.
		c.treeSums.Store(true)
		jf, err := os.OpenFile(jp, os.O_RDWR|os.O_APPEND, 0)
		if err != nil {
			return st, fmt.Errorf("journal: %w", err)
		}
		c.jf, c.joff, c.compacted = jf, int64(consumed), int64(consumed)
		c.jnext = c.compactThreshold()
		return st, nil
	}
	if err := c.compact(); err != nil {
		if fresh || !isNoSpace(err) {
			return st, err
		}
		// The filesystem is full and nothing could make room: keep the
		// journal as it is, which is still the index. What recovery
		// verified is verified again next time; what it dropped is
		// forgotten on first use.
		c.log.Warn("cache journal not compacted: filesystem full", "err", err)
		c.treeSums.Store(segmentSums(buf))
		jf, err := os.OpenFile(jp, os.O_RDWR|os.O_APPEND, 0)
		if err != nil {
			return st, fmt.Errorf("journal: %w", err)
		}
		if len(buf) > 0 && buf[len(buf)-1] != '\n' {
			jf.Write([]byte{'\n'}) // end a torn record, so ours start on a line of their own
		}
		c.jf, c.joff = jf, int64(len(buf))
		c.jnext = c.compactThreshold()
	}
	return st, nil
}

// verifyAll checks the file of every state of check against its record,
// in parallel (hashing is CPU bound and the files are independent), and
// reports which pass.
func (c *Cache) verifyAll(check []*replayState) []bool {
	ok := make([]bool, len(check))
	work := make(chan int)
	var wg sync.WaitGroup
	for range max(1, runtime.GOMAXPROCS(0)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := c.hashBuf()
			defer c.freeHashBuf(buf)
			for i := range work {
				r := check[i].rec
				ok[i] = verifyFile(filepath.Join(c.dir, r.key), r.size, r.sum, buf) == nil
			}
		}()
	}
	for i := range check {
		work <- i
	}
	close(work)
	wg.Wait()
	return ok
}

// join loads the journal as another running instance left it.
func (c *Cache) join() (recoveryStats, error) {
	var st recoveryStats
	var err error
	if st.temps, err = sweepTemps(filepath.Join(c.dir, tmpDir), c.inst.id, false); err != nil {
		return st, err
	}
	jp := filepath.Join(c.dir, journalRel)
	c.jf, err = os.OpenFile(jp, os.O_RDWR|os.O_APPEND, 0)
	if err != nil {
		return st, fmt.Errorf("journal: %w", err)
	}
	buf, err := io.ReadAll(c.jf)
	if err != nil {
		return st, fmt.Errorf("journal: %w", err)
	}
	if err := checkHeader(buf); err != nil {
		return st, fmt.Errorf("journal %s: %w", jp, err)
	}
	c.treeSums.Store(segmentSums(buf))
	states, quit, torn, consumed, _ := c.replay(buf)
	st.torn = torn
	live := make([]*replayState, 0, len(states))
	for _, s := range states {
		if s.present {
			live = append(live, s)
		}
	}
	sortBySeq(live)
	c.idx = make(map[string]*entry, len(live))
	c.byIdent = map[string]*entry{}
	c.chunksOf = map[string]int{}
	for _, s := range live {
		c.insertLocked(s.rec, !s.afterMark)
	}
	c.quit = quit
	c.joff = int64(consumed)
	c.jnext = c.compactThreshold()
	return st, nil
}

// verifyFile checks that the file at p has the given size and checksum.
func verifyFile(p string, size int64, sum checksum, buf []byte) error {
	f, err := os.Open(p)
	if err != nil {
		return err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	if !fi.Mode().IsRegular() || fi.Size() != size {
		return fmt.Errorf("%s: size %d, recorded %d", p, fi.Size(), size)
	}
	got, err := hashFile(f, size, buf, sum.tree)
	if err != nil {
		return err
	}
	if got != sum {
		return fmt.Errorf("%s: checksum mismatch", p)
	}
	return nil
}

// hashBuf is a buffer a file is read through to hash it: lent by the
// cache's memory when it has one.
func (c *Cache) hashBuf() []byte {
	if c.mem != nil {
		return c.mem.HostAlloc(hashBufBytes)
	}
	return make([]byte, hashBufBytes)
}

func (c *Cache) freeHashBuf(b []byte) {
	if c.mem != nil {
		c.mem.HostFree(b)
	}
}

// hashBufBytes is what a file is read in to hash it.
const hashBufBytes = 1 << 20

// sortBySeq orders states by the position of their last record (oldest
// first), which is their LRU order. Positions are distinct and bounded by
// the record count, so a bucket pass does it without comparisons.
func sortBySeq(s []*replayState) {
	top := 0
	for _, x := range s {
		top = max(top, x.seq)
	}
	if top > 4*len(s)+1024 {
		slices.SortFunc(s, func(a, b *replayState) int { return a.seq - b.seq })
		return
	}
	byPos := make([]*replayState, top+1)
	for _, x := range s {
		byPos[x.seq] = x
	}
	s = s[:0]
	for _, x := range byPos {
		if x != nil {
			s = append(s, x)
		}
	}
}

// insertLocked adds or replaces the entry for r.key as most recently used.
func (c *Cache) insertLocked(r record, trusted bool) *entry {
	if e := c.idx[r.key]; e != nil {
		c.used += c.charge(r.size) - c.charge(e.size)
		c.bytes += r.size - e.size
		if isChunk(r.key) {
			c.chunkBytes += r.size - e.size
		}
		c.unidentLocked(e)
		c.countStoreLocked(e, -1)
		e.size, e.sum, e.writer, e.ident, e.mtime = r.size, r.sum, r.writer, r.ident, 0
		c.countStoreLocked(e, 1)
		e.trusted = e.trusted && trusted
		c.lru.MoveToFront(e.elem)
		c.identLocked(e)
		return e
	}
	e := &entry{key: r.key, size: r.size, sum: r.sum, ident: r.ident, writer: r.writer, trusted: trusted}
	e.elem = c.lru.PushFront(e)
	c.idx[r.key] = e
	c.used += c.charge(r.size)
	c.bytes += r.size
	if isChunk(r.key) {
		c.chunkBytes += r.size
		c.chunks++
		c.countStoreLocked(e, 1)
	}
	c.identLocked(e)
	return e
}

// countStoreLocked adds d to the count of chunks of e's store, when e is
// a chunk recorded under one.
func (c *Cache) countStoreLocked(e *entry, d int) {
	if e.ident == "" || !isChunk(e.key) {
		return
	}
	if n := c.chunksOf[e.ident] + d; n > 0 {
		c.chunksOf[e.ident] = n
	} else {
		delete(c.chunksOf, e.ident)
	}
}

// identKey is e's key in byIdent, "" for none.
func identKey(e *entry) string {
	if e.ident == "" {
		return ""
	}
	rest, ok := strings.CutPrefix(e.key, blobsDir+"/")
	if !ok {
		return ""
	}
	layout, _, _ := strings.Cut(rest, "/")
	return layout + "\x00" + e.ident
}

func (c *Cache) identLocked(e *entry) {
	if k := identKey(e); k != "" {
		c.byIdent[k] = e
	}
}

func (c *Cache) unidentLocked(e *entry) {
	if k := identKey(e); k != "" && c.byIdent[k] == e {
		delete(c.byIdent, k)
	}
}

// removeLocked forgets e (the file is the caller's business).
func (c *Cache) removeLocked(e *entry) {
	if c.idx[e.key] != e {
		return
	}
	delete(c.idx, e.key)
	c.unidentLocked(e)
	c.lru.Remove(e.elem)
	c.used -= c.charge(e.size)
	c.bytes -= e.size
	if isChunk(e.key) {
		c.chunkBytes -= e.size
		c.chunks--
		c.countStoreLocked(e, -1)
	}
}

// appendLocked writes one record to the journal.
func (c *Cache) appendLocked(r record) error {
	if r.writer == "" {
		r.writer = c.inst.id
	}
	c.jbuf = appendRecord(c.jbuf[:0], r)
	_, err := c.jf.Write(c.jbuf)
	if err != nil {
		return fmt.Errorf("cache journal: %w", err)
	}
	return nil
}

// lookupLocked returns rel's entry, or nil: from the index, or else after
// reading what other instances appended to the journal meanwhile.
func (c *Cache) lookupLocked(rel string) *entry {
	e := c.idx[rel]
	if e == nil {
		c.tailLocked()
		e = c.idx[rel]
	}
	return e
}

// tailLocked applies what other instances appended since the last look.
func (c *Cache) tailLocked() {
	if c.jf == nil {
		return
	}
	fi, err := c.jf.Stat()
	if err != nil || fi.Size() <= c.joff {
		return
	}
	buf := make([]byte, fi.Size()-c.joff)
	n, err := c.jf.ReadAt(buf, c.joff)
	if err != nil && !errors.Is(err, io.EOF) {
		c.log.Warn("cache journal read failed", "err", err)
		return
	}
	consumed, _ := scanRecords(buf[:n], c.intern, func(r record) {
		if r.writer == c.inst.id {
			return // our own records: memory is ahead of them
		}
		switch r.op {
		case opAdd:
			c.insertLocked(r, false)
		case opDel:
			if e := c.idx[r.key]; e != nil {
				c.removeLocked(e)
			}
		case opQuit:
			c.quit[r.writer] = true
		}
	})
	c.joff += int64(consumed)
	if c.joff >= c.jnext {
		c.maybeCompactLocked()
	}
}

// compactThreshold is the journal size past which an instance tries to
// rewrite it: well past the size of a fresh journal for the current
// entries, so the rewrite cost is amortised over many appends.
func (c *Cache) compactThreshold() int64 {
	return max(c.joff, int64(len(c.idx))*120)*2 + c.compactMin
}

// maybeCompactLocked rewrites the journal if this instance is alone.
func (c *Cache) maybeCompactLocked() {
	if err := ofdLock(c.lockFile, syscall.F_WRLCK, false); err != nil {
		// Not alone: try again after as much growth again.
		c.jnext = c.compactThreshold()
		return
	}
	c.tailLocked0()
	if err := c.compact(); err != nil {
		c.log.Warn("cache journal compaction failed", "err", err)
		c.jnext = c.compactThreshold()
	}
	if err := ofdLock(c.lockFile, syscall.F_RDLCK, false); err != nil {
		c.log.Warn("cache lock downgrade failed", "err", err)
	}
}

// tailLocked0 tails without the compaction check (compact calls it).
func (c *Cache) tailLocked0() {
	next := c.jnext
	c.jnext = 1<<63 - 1
	c.tailLocked()
	c.jnext = next
}

// compact writes a fresh journal holding the current index and replaces the
// old one. The caller holds the directory lock for writing (no other
// instance is running) and c.mu if the Cache is shared.
//
// On a full filesystem it makes room for the new journal by evicting least
// recently used entries (no other instance is running, so their records
// need not precede the unlinks: the new journal leaves them out) and tries
// again.
func (c *Cache) compact() error {
	var err error
	for attempt := 0; attempt < 3; attempt++ {
		var n int
		if n, err = c.compactOnce(); !isNoSpace(err) {
			return err
		}
		if !c.makeRoomLocked(int64(n) + 64<<10) {
			break
		}
	}
	return err
}

// compactOnce writes the new journal; n is its size.
func (c *Cache) compactOnce() (n int, _ error) {
	// Compaction makes this instance's entries trusted (never verified
	// again), so their bytes must be on disk first.
	if err := c.syncAll(); err != nil {
		return 0, fmt.Errorf("journal: %w", err)
	}
	jp := filepath.Join(c.dir, journalRel)
	tmp := jp + ".new"
	buf := []byte(journalHeader)
	var later []*entry
	for el := c.lru.Back(); el != nil; el = el.Prev() {
		e := el.Value.(*entry)
		if e.trusted || e.writer == c.inst.id || c.quit[e.writer] {
			e.trusted = true
			buf = appendRecord(buf, record{op: opAdd, writer: c.inst.id, size: e.size, sum: e.sum, ident: e.ident, key: e.key})
		} else {
			later = append(later, e)
		}
	}
	buf = appendRecord(buf, record{op: opMarker, key: ""})
	// Entries of instances that were killed stay suspicious for the next
	// exclusive Open to verify.
	for _, e := range later {
		buf = appendRecord(buf, record{op: opAdd, writer: e.writer, size: e.size, sum: e.sum, ident: e.ident, key: e.key})
	}
	if err := writeFileSync(tmp, buf); err != nil {
		os.Remove(tmp)
		return len(buf), fmt.Errorf("journal: %w", err)
	}
	if err := os.Rename(tmp, jp); err != nil {
		return len(buf), fmt.Errorf("journal: %w", err)
	}
	syncDir(c.dir)
	jf, err := os.OpenFile(jp, os.O_RDWR|os.O_APPEND, 0)
	if err != nil {
		return len(buf), fmt.Errorf("journal: %w", err)
	}
	if c.jf != nil {
		c.jf.Close()
	}
	c.jf = jf
	c.joff = int64(len(buf))
	c.compacted = c.joff
	c.treeSums.Store(true) // the journal is of version 3 now
	clear(c.quit)
	c.jnext = c.compactThreshold()
	return len(buf), nil
}

// syncAll flushes every file written to the cache's filesystem to disk
// (syncfs). Blobs are published without an fsync of their own, so that no
// reader waits for the disk; until an instance's entries are synced they
// stay untrusted: a power loss before then leaves them for the next
// exclusive Open to verify against their checksums (a blob whose bytes did
// not reach the disk fails and is dropped). Compaction and a clean Close,
// which make the entries trusted, call this first.
func (c *Cache) syncAll() error {
	if c.noSync {
		return nil
	}
	d, err := os.Open(c.dir)
	if err != nil {
		return err
	}
	defer d.Close()
	if err := unix.Syncfs(int(d.Fd())); err != nil {
		return fmt.Errorf("syncfs %s: %w", c.dir, err)
	}
	if c.onSync != nil {
		c.onSync()
	}
	return nil
}

func writeFileSync(p string, data []byte) error {
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, privateFile)
	if err != nil {
		return err
	}
	if err := f.Chmod(privateFile); err != nil { // whatever the umask left
		f.Close()
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func syncDir(p string) {
	if d, err := os.Open(p); err == nil {
		d.Sync()
		d.Close()
	}
}

// reserve counts n bytes about to be written and makes room for them. The
// returned func gives the reservation back; call it unless the bytes were
// committed to the index (which then accounts for them).
func (c *Cache) reserve(n int64) (unreserve func()) {
	n = c.charge(n)
	c.mu.Lock()
	c.inflight += n
	c.tailLocked()
	c.evictLocked()
	c.mu.Unlock()
	return func() {
		c.mu.Lock()
		c.inflight -= n
		c.mu.Unlock()
	}
}

// evictLocked removes least recently used, unpinned entries until used +
// in-flight bytes fit the budget, or nothing more can go.
//
// Why a plain LRU over exact byte counts rather than ristretto: a disk
// cache must keep a hard bound ("the directory never exceeds the budget"),
// must never evict a file a reader holds, and evicting means deleting a
// file that cost a fill to make. Ristretto admits and evicts
// probabilistically (TinyLFU may refuse a blob that was just written at
// full cost), applies Set asynchronously through buffers so its cost
// accounting lags what is on disk, and cannot be told that an entry is
// pinned: its OnEvict can only observe. Keeping the exact byte count and
// order ourselves makes the bound deterministic, lets pinned entries be
// skipped, and is what every instance sharing the directory can reproduce
// from the journal. Training reads are scans over epochs, where LRU's
// weakness (a scan flushes the cache) is no worse than any frequency
// estimate that has seen each sample once per epoch.
func (c *Cache) evictLocked() {
	if c.budget <= 0 {
		return
	}
	skipped := 0
	for c.used+c.inflight > c.budget && skipped < c.lru.Len() {
		victim := c.victimLocked()
		if victim == nil {
			return
		}
		if !c.evictOneLocked(victim) {
			// Open in another instance: keep it, look at it last.
			c.lru.MoveToFront(victim.elem)
			skipped++
		}
	}
}

// victimLocked is the least recently used entry no reader pins, nil when
// every entry is pinned.
func (c *Cache) victimLocked() *entry {
	for el := c.lru.Back(); el != nil; el = el.Prev() {
		if e := el.Value.(*entry); e.pins == 0 {
			return e
		}
	}
	return nil
}

// evictOneLocked deletes e's file unless some reader (in any process)
// holds it open through a Handle. The deletion is logged before the unlink
// so that no instance can log a re-add that the journal would then order
// before the delete.
func (c *Cache) evictOneLocked(e *entry) bool { return c.evictEntryLocked(e, false) }

// evictEntryLocked is evictOneLocked; with force, a deletion record that
// cannot be written (the filesystem is full) does not keep the file.
func (c *Cache) evictEntryLocked(e *entry, force bool) bool {
	p := filepath.Join(c.dir, e.key)
	f, err := os.Open(p)
	if err != nil {
		c.removeLocked(e) // already gone (or never linked): forget it
		return true
	}
	defer f.Close()
	if err := flock(f, syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		return false
	}
	if err := c.appendLocked(record{op: opDel, key: e.key}); err != nil {
		if !force {
			c.log.Warn("cache eviction not logged", "key", e.key, "err", err)
			return false
		}
		c.log.Debug("cache eviction not logged; unlinking anyway", "key", e.key, "err", err)
	}
	os.Remove(p)
	c.removeLocked(e)
	c.counts.evictions.Add(1)
	c.counts.evictedBytes.Add(e.size)
	if isChunk(e.key) {
		c.counts.chunkEvictions.Add(1)
	}
	c.log.Debug("cache evict", "key", e.key, "bytes", e.size)
	return true
}

// Usage reports the bytes and number of complete files in the cache as
// this instance knows them (including what other instances sharing the
// directory have logged).
func (c *Cache) Usage() (bytes int64, files int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.closed {
		c.tailLocked()
	}
	return c.bytes, len(c.idx)
}

// Close stops fills in progress (their callers get an error), logs a clean
// shutdown, compacts the journal if no other instance is running, and
// releases the directory. Handles still open stay readable; closing them
// later is fine. Close is idempotent.
func (c *Cache) Close() error {
	c.closeMu.Do(func() {
		c.mu.Lock()
		c.closed = true
		c.mu.Unlock()
		c.stop()
		c.wg.Wait()
		c.wb.close()
		c.mu.Lock()
		defer c.mu.Unlock()
		c.tailLocked0()
		var errs []error
		if err := ofdLock(c.lockFile, syscall.F_WRLCK, false); err == nil {
			// Alone: leave a compact journal, which is also the mark of a
			// clean shutdown. If nothing changed since the last one, the
			// journal already is that.
			if c.joff != c.compacted {
				if err := c.compact(); err != nil {
					errs = append(errs, err)
				}
			}
		} else if err := c.syncAll(); err != nil {
			// Without the quit record, the next exclusive Open verifies
			// this instance's entries.
			errs = append(errs, err)
		} else if err := c.appendLocked(record{op: opQuit, key: ""}); err != nil {
			errs = append(errs, err)
		}
		if err := c.jf.Close(); err != nil {
			errs = append(errs, err)
		}
		c.jf = nil
		c.inst.close()
		c.lockFile.Close()
		if err := errors.Join(errs...); err != nil {
			c.closeErr = fmt.Errorf("cache %s: close: %w", c.dir, err)
		}
	})
	return c.closeErr
}

// abandon drops the Cache as a kill would: locks released, nothing more
// logged, fills in progress left running with their temp files in place
// (their later writes fail). Tests use it to simulate a crash in process.
func (c *Cache) abandon() {
	c.wb.close() // a killed process's descriptors close with it
	c.mu.Lock()
	defer c.mu.Unlock()
	c.closed = true
	c.jf.Close()
	c.inst.lock.Close()
	c.lockFile.Close()
}

func randomID() string {
	var b [8]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// checkRel reports whether key is a path the cache could have written.
func checkRel(key string) error {
	if !fs.ValidPath(key) || key == "." {
		return ErrInvalidKey
	}
	top, _, _ := cutFirst(key)
	if top != blobsDir && top != chunksDir {
		return ErrInvalidKey
	}
	return nil
}

func cutFirst(p string) (string, string, bool) {
	for i := 0; i < len(p); i++ {
		if p[i] == '/' {
			return p[:i], p[i+1:], true
		}
	}
	return p, "", false
}
