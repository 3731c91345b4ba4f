package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/zarrfs/zarrfs/decode"
	"github.com/zarrfs/zarrfs/deliver"
	zfs "github.com/zarrfs/zarrfs/fs"
	"github.com/zarrfs/zarrfs/gpu"
	"github.com/zarrfs/zarrfs/zarr"
)

// A running mount answers `zarrfs status` on a Unix socket beside its
// registry record (owner-only, like the registry): GET /status returns a
// statusDoc as JSON.

// statusDoc is what `zarrfs status --json` prints for a mount.
type statusDoc struct {
	Mountpoint    string    `json:"mountpoint"`
	Source        string    `json:"source"`
	PID           int       `json:"pid"`
	Started       time.Time `json:"started"`
	UptimeSeconds float64   `json:"uptime_seconds"`
	// Args is the mount's command line after the command name.
	Args []string `json:"args"`
	// LogFile is the file the daemon logs to when its stderr is one (a
	// mount started by mount(8) or fstab logs to a file of the helper's
	// choosing); empty for a terminal, a pipe or the journal.
	LogFile string         `json:"log_file"`
	Cache   statusCache    `json:"cache"`
	Mount   statusMount    `json:"mount"`
	Decode  statusDecode   `json:"decode"`
	Reads   statusReads    `json:"source_reads"`
	Errors  map[string]int `json:"errors_by_array"`
	// Delivery is the rings of zarrfs.torch.Loader readers (absent when
	// the mount delivers none).
	Delivery *statusDelivery `json:"delivery,omitempty"`
}

type statusCache struct {
	Dir         string `json:"dir"`
	BlobDir     string `json:"blob_dir"`
	BudgetB     int64  `json:"budget_bytes"`
	UsedB       int64  `json:"used_bytes"`
	Files       int    `json:"files"`
	BlobMode    string `json:"blob_mode"`
	Hits        int64  `json:"blob_hits"`
	Misses      int64  `json:"blob_fills"`
	Filling     int64  `json:"fills_in_flight"`
	Evictions   int64  `json:"evictions"`
	EvictedB    int64  `json:"evicted_bytes"`
	ChunkHits   int64  `json:"chunk_hits"`
	ChunkMisses int64  `json:"chunk_misses"`
	// Each tier's share of UsedB and Files: decoded blobs and compressed
	// chunks.
	BlobB  int64 `json:"blob_bytes"`
	Blobs  int   `json:"blob_files"`
	ChunkB int64 `json:"chunk_bytes"`
	Chunks int   `json:"chunk_files"`
	// ChunkStores counts the chunks this mount kept; ChunkDamaged those
	// found damaged on a read (dropped and read from the source again);
	// ChunkEvictions the evictions that were chunks.
	ChunkStores    int64 `json:"chunk_stores"`
	ChunkDamaged   int64 `json:"chunk_damaged"`
	ChunkEvictions int64 `json:"chunk_evictions"`
}

type statusMount struct {
	Direct bool `json:"direct"`
	// Passthrough: the kernel reads the cache's files itself (plain mode).
	Passthrough bool   `json:"passthrough"`
	Lease       string `json:"lease,omitempty"`
	Rank        int    `json:"rank"`
	World       int    `json:"world"`
	Shard       string `json:"shard"`
	Opens       int64  `json:"opens"`
	OpenFiles   int64  `json:"open_files"`
	Files       int64  `json:"files"`
	Arrays      int    `json:"arrays"`
}

type statusDecode struct {
	Placement  string          `json:"placement"`
	GPUDeviceB int64           `json:"gpu_device_bytes"`
	GPUPinnedB int64           `json:"gpu_pinned_bytes"`
	GPUPinned  statusGPUPinned `json:"gpu_pinned"`
	GPU        statusGPUStats  `json:"gpu"`
	// GPUs is GPU by device, where the GPUs started.
	GPUs    []statusGPU     `json:"gpus,omitempty"`
	Decoded []statusDecoded `json:"decoded"`
}

// statusGPUPinned is gpu_pinned_bytes by use (gpu.Pinned): the rounds'
// staging, and the pool the fills and reads are lent from, what of it is
// lent now and the most lent at once, and what the pool had no room for
// (lent from ordinary memory, since the mount started).
type statusGPUPinned struct {
	StagingB  int64 `json:"staging_bytes"`
	PoolB     int64 `json:"pool_bytes"`
	LentB     int64 `json:"lent_bytes"`
	LentPeakB int64 `json:"lent_peak_bytes"`
	MissedB   int64 `json:"unpinned_bytes"`
}

// statusGPUStats is gpu.Stats under the status document's own keys: the
// JSON is an interface of its own, not the Go field names of a package.
type statusGPUStats struct {
	Chunks    int64 `json:"chunks"`
	Bytes     int64 `json:"bytes"`
	Refused   int64 `json:"refused"`
	Corrupt   int64 `json:"corrupt"`
	Rounds    int64 `json:"rounds"`
	Disagreed int64 `json:"disagreed"`
}

func gpuStatsDoc(s gpu.Stats) statusGPUStats {
	return statusGPUStats{Chunks: s.Chunks, Bytes: s.Bytes, Refused: s.Refused, Corrupt: s.Corrupt, Rounds: s.Rounds, Disagreed: s.Disagreed}
}

type statusGPU struct {
	Device int `json:"device"`
	statusGPUStats
}

type statusDecoded struct {
	Codec  string `json:"codec"`
	Device string `json:"device"`
	Chunks int64  `json:"chunks"`
	Bytes  int64  `json:"bytes"`
}

type statusReads struct {
	BytesFetched  int64 `json:"bytes_fetched"`
	ChunksDecoded int64 `json:"chunks_decoded"`
	ChunksMissing int64 `json:"chunks_missing"`
}

// statusParts are what a mount's status is gathered from.
type statusParts struct {
	mountpoint string
	args       []string
	logFile    string
	started    time.Time
	f          *mountFlags
	o          *opened
	m          *zfs.Mounted
	// delivery serves the rings on deliverySock; nil when off.
	delivery     *deliver.Server
	deliverySock string
}

func (s *statusParts) doc() statusDoc {
	c, dec := s.o.cache, s.o.dec
	lay := s.m.Layout() // the tree served now, after any refresh
	used, files := c.Usage()
	tiers := c.TierUsage()
	cs := c.Stats()
	mode, _ := c.BlobAccess()
	ms := s.m.Stats()
	d := statusDoc{
		Mountpoint: s.mountpoint, Source: s.o.store.ID(), PID: os.Getpid(), Started: s.started,
		UptimeSeconds: time.Since(s.started).Seconds(), Args: s.args, LogFile: s.logFile,
		Cache: statusCache{Dir: c.Dir(), BlobDir: c.BlobDir(lay.ID), BudgetB: c.Budget(), UsedB: used, Files: files,
			BlobMode: fmt.Sprintf("%04o", uint32(mode)), Hits: cs.BlobHits, Misses: cs.BlobMisses, Filling: cs.Filling,
			Evictions: cs.Evictions, EvictedB: cs.EvictedBytes, ChunkHits: cs.ChunkHits, ChunkMisses: cs.ChunkMisses,
			BlobB: tiers.BlobBytes, Blobs: tiers.Blobs, ChunkB: tiers.ChunkBytes, Chunks: tiers.Chunks,
			ChunkStores: cs.ChunkStores, ChunkDamaged: cs.ChunkDamaged, ChunkEvictions: cs.ChunkEvictions},
		Mount: statusMount{Direct: s.f.direct, Passthrough: s.m.Passthrough(), Rank: s.f.rank, World: s.f.world, Shard: s.f.shard, Opens: ms.Opens, OpenFiles: ms.OpenFiles,
			Files: lay.Files, Arrays: lay.Arrays},
		Reads:  readsOf(s.o.stats),
		Errors: map[string]int{},
	}
	if s.f.direct {
		d.Mount.Lease = s.f.lease.String()
	}
	for k, v := range ms.Errors {
		d.Errors[k] = int(v)
	}
	d.Decode.Placement = dec.Placement()
	d.Decode.GPUDeviceB, d.Decode.GPUPinnedB = dec.MemoryHeld()
	pin := dec.Pinned()
	d.Decode.GPUPinned = statusGPUPinned{StagingB: pin.Staging, PoolB: pin.Pool, LentB: pin.Lent, LentPeakB: pin.LentPeak, MissedB: pin.Missed}
	d.Decode.GPU = gpuStatsDoc(dec.GPUStats())
	for dev, st := range dec.GPUStatsByDevice() {
		d.Decode.GPUs = append(d.Decode.GPUs, statusGPU{Device: dev, statusGPUStats: gpuStatsDoc(st)})
	}
	slices.SortFunc(d.Decode.GPUs, func(a, b statusGPU) int { return a.Device - b.Device })
	d.Decode.Decoded = decodedRows(dec.Decoded())
	d.Delivery = deliveryDoc(s.delivery, s.deliverySock)
	return d
}

func readsOf(st *zarr.Stats) statusReads {
	return statusReads{BytesFetched: st.BytesFetched.Load(), ChunksDecoded: st.ChunksDecoded.Load(), ChunksMissing: st.ChunksMissing.Load()}
}

func decodedRows(d decode.Decoded) []statusDecoded {
	rows := []statusDecoded{}
	for k, v := range d {
		rows = append(rows, statusDecoded{Codec: k.Codec, Device: k.Device, Chunks: v.Chunks, Bytes: v.Bytes})
	}
	sort.Slice(rows, func(i, j int) bool {
		return rows[i].Codec+rows[i].Device < rows[j].Codec+rows[j].Device
	})
	return rows
}

// stderrFile names the regular file this process's stderr writes to, or ""
// when it is a terminal, a pipe or a socket (the journal).
func stderrFile() string {
	st, err := os.Stderr.Stat()
	if err != nil || !st.Mode().IsRegular() {
		return ""
	}
	p, err := os.Readlink("/proc/self/fd/2")
	if err != nil || !filepath.IsAbs(p) {
		return ""
	}
	return p
}

// controlSocket is where the mount at mountpoint (absolute, resolved)
// answers status requests.
func controlSocket(mountpoint string) string {
	return strings.TrimSuffix(recordFile(mountpoint), ".json") + ".sock"
}

// listenPrivate listens on the Unix socket sock of the user's registry
// folder (made owner-only if missing), the socket owner-only too: a
// mount's sockets answer its user alone.
func listenPrivate(sock string) (net.Listener, error) {
	if err := privateRegistry(); err != nil {
		return nil, err
	}
	os.Remove(sock) // left by a killed daemon: the registry is ours
	ln, err := net.Listen("unix", sock)
	if err != nil {
		return nil, err
	}
	if err := os.Chmod(sock, 0o600); err != nil {
		ln.Close()
		return nil, err
	}
	return ln, nil
}

// serveControl answers status requests on sock until ctx ends.
func serveControl(ctx context.Context, sock string, status func() statusDoc, log *slog.Logger) error {
	ln, err := listenPrivate(sock)
	if err != nil {
		return err
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /status", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		enc.Encode(status())
	})
	// Idle connections close soon: a client that keeps one (a status
	// --watch elsewhere) holds no descriptor of the daemon for long.
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second, IdleTimeout: 10 * time.Second}
	go func() {
		<-ctx.Done()
		srv.Close()
		os.Remove(sock)
	}()
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Warn("status socket stopped", "socket", sock, "err", err)
		}
	}()
	return nil
}

// fetchStatus asks the mount behind sock for its status.
func fetchStatus(ctx context.Context, sock string) (statusDoc, error) {
	var d statusDoc
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		// One request a connection: each fetch closes what it opened.
		DisableKeepAlives: true,
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", sock)
		},
	}}
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://zarrfs/status", nil)
	resp, err := client.Do(req)
	if err != nil {
		return d, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return d, fmt.Errorf("status socket answered %s", resp.Status)
	}
	return d, json.NewDecoder(resp.Body).Decode(&d)
}
