package main

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// fillMetrics times every blob fill by array or view (fs.Group: one label
// value per array or view of the store, never a sample path).
type fillMetrics struct {
	seconds *prometheus.HistogramVec
}

func newFillMetrics() *fillMetrics {
	return &fillMetrics{seconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Namespace: "zarrfs", Name: "fill_seconds",
		Help:    "Time to fill one file (fetch, decode, assemble, write) by array or view, and outcome.",
		Buckets: prometheus.ExponentialBuckets(0.005, 2, 14), // 5 ms to 41 s
	}, []string{"array", "outcome"})}
}

func (m *fillMetrics) observe(group string, took time.Duration, err error) {
	outcome := "ok"
	if err != nil {
		outcome = "error"
	}
	m.seconds.WithLabelValues(group, outcome).Observe(took.Seconds())
}

// serveMetrics exposes the daemon's counters on ln at /metrics until ctx
// ends. Counters are read from the components when scraped, so the hot path
// pays nothing for them (the fill histogram excepted: one observation per
// fill).
func serveMetrics(ctx context.Context, ln net.Listener, s *statusParts, fills *fillMetrics, log *slog.Logger) {
	reg := prometheus.NewRegistry()
	st := s.o.stats
	c, dec := s.o.cache, s.o.dec
	counter := func(name, help string, f func() float64) {
		reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Namespace: "zarrfs", Name: name, Help: help}, f))
	}
	gauge := func(name, help string, f func() float64) {
		reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "zarrfs", Name: name, Help: help}, f))
	}
	counter("chunks_decoded_total", "Chunks decompressed.", func() float64 { return float64(st.ChunksDecoded.Load()) })
	counter("chunks_missing_total", "Chunks absent from the source, read as the fill value.", func() float64 { return float64(st.ChunksMissing.Load()) })
	counter("chunk_cache_hits_total", "Chunks served from the in-memory decoded-chunk cache.", func() float64 { return float64(st.ChunkCacheHits.Load()) })
	counter("source_bytes_total", "Compressed bytes read from the source.", func() float64 { return float64(st.BytesFetched.Load()) })
	counter("source_requests_total", "Reads of chunks sent to the source.", func() float64 { return float64(st.Requests.Load()) })
	counter("source_listings_total", "Arrays listed to learn their chunks' versions.", func() float64 { return float64(st.Listings.Load()) })
	// A request for a file is an open, a direct-mode link resolution or a
	// readahead: a hit finds the file complete in the disk cache, a miss
	// fills it (or waits for the fill another request started).
	counter("cache_hits_total", "Requests for a file (opens, link resolutions, readahead) that found it complete in the disk cache.", func() float64 { return float64(c.Stats().BlobHits) })
	counter("cache_misses_total", "Requests for a file (opens, link resolutions, readahead) that filled it or waited for its fill.", func() float64 { return float64(c.Stats().BlobMisses) })
	counter("cache_evictions_total", "Files evicted from the disk cache to keep its budget.", func() float64 { return float64(c.Stats().Evictions) })
	counter("cache_evicted_bytes_total", "Bytes evicted from the disk cache.", func() float64 { return float64(c.Stats().EvictedBytes) })
	counter("chunk_tier_hits_total", "Compressed chunks read from the disk cache's chunk tier.", func() float64 { return float64(c.Stats().ChunkHits) })
	counter("chunk_tier_misses_total", "Compressed chunks not in the chunk tier (read from the source).", func() float64 { return float64(c.Stats().ChunkMisses) })
	counter("chunk_tier_damaged_total", "Compressed chunks found damaged in the chunk tier (read from the source again).", func() float64 { return float64(c.Stats().ChunkDamaged) })
	gauge("chunk_tier_bytes", "Bytes of compressed chunks held in the disk cache (part of cache_bytes).", func() float64 { return float64(c.TierUsage().ChunkBytes) })
	gauge("chunk_tier_files", "Compressed chunks held in the disk cache (part of cache_files).", func() float64 { return float64(c.TierUsage().Chunks) })
	gauge("cache_bytes", "Bytes held in the disk cache.", func() float64 { b, _ := c.Usage(); return float64(b) })
	gauge("cache_files", "Files held in the disk cache.", func() float64 { _, n := c.Usage(); return float64(n) })
	gauge("cache_budget_bytes", "The disk cache's budget (0: unlimited).", func() float64 { return float64(c.Budget()) })
	gauge("fills_in_flight", "Files being filled now.", func() float64 { return float64(c.Stats().Filling) })
	gauge("open_files", "Files open now (direct mode: leased).", func() float64 { return float64(s.m.Stats().OpenFiles) })
	counter("opens_total", "Opens of sample files (direct mode: link resolutions).", func() float64 { return float64(s.m.Stats().Opens) })
	counter("gpu_chunks_decoded_total", "Chunks decoded on the GPU.", func() float64 { return float64(dec.GPUStats().Chunks) })
	counter("gpu_chunks_refused_total", "Chunks the GPU refused; they decode on the CPU.", func() float64 { return float64(dec.GPUStats().Refused) })
	counter("gpu_chunks_corrupt_total", "Chunks the GPU found corrupt.", func() float64 { return float64(dec.GPUStats().Corrupt) })
	gauge("uptime_seconds", "Seconds since the mount started.", func() float64 { return time.Since(s.started).Seconds() })
	reg.MustRegister(fills.seconds)
	registerDeliveryMetrics(reg, s.delivery)
	reg.MustRegister(&scraped{s: s,
		gpuMem: prometheus.NewDesc("zarrfs_gpu_memory_bytes",
			"Memory the GPUs hold for decoding now, besides their CUDA contexts, by kind (device, pinned).", []string{"kind"}, nil),
		decoded: prometheus.NewDesc("zarrfs_decoded_bytes_total",
			"Decoded bytes by codec and device (cpu, gpu).", []string{"codec", "device"}, nil),
		errors: prometheus.NewDesc("zarrfs_open_errors_total",
			"Opens that failed (EIO), by array or view.", []string{"array"}, nil),
	})
	reg.MustRegister(prometheus.NewGoCollector(), prometheus.NewProcessCollector(prometheus.ProcessCollectorOpts{}))
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("metrics server stopped", "addr", ln.Addr().String(), "err", err)
		}
	}()
	log.Info("metrics", "url", "http://"+ln.Addr().String()+"/metrics")
}

// scraped reports the values with labels that the components hold, read
// when scraped.
type scraped struct {
	s                       *statusParts
	gpuMem, decoded, errors *prometheus.Desc
}

func (c *scraped) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.gpuMem
	ch <- c.decoded
	ch <- c.errors
}

func (c *scraped) Collect(ch chan<- prometheus.Metric) {
	dec := c.s.o.dec
	d, p := dec.MemoryHeld()
	ch <- prometheus.MustNewConstMetric(c.gpuMem, prometheus.GaugeValue, float64(d), "device")
	ch <- prometheus.MustNewConstMetric(c.gpuMem, prometheus.GaugeValue, float64(p), "pinned")
	for k, v := range dec.Decoded() {
		ch <- prometheus.MustNewConstMetric(c.decoded, prometheus.CounterValue, float64(v.Bytes), k.Codec, k.Device)
	}
	for a, n := range c.s.m.Stats().Errors {
		ch <- prometheus.MustNewConstMetric(c.errors, prometheus.CounterValue, float64(n), a)
	}
}
