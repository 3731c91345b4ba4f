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

	"github.com/zarrfs/zarrfs/cache"
	"github.com/zarrfs/zarrfs/decode"
	"github.com/zarrfs/zarrfs/zarr"
)

// serveMetrics exposes the daemon's counters on addr at /metrics until ctx
// ends. Counters are read from the components when scraped, so the hot path
// pays nothing for them.
func serveMetrics(ctx context.Context, addr string, h *zarr.Hierarchy, c *cache.Cache, dec *decode.Pipeline, log *slog.Logger) error {
	reg := prometheus.NewRegistry()
	st := h.Stats()
	counter := func(name, help string, f func() float64) {
		reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Namespace: "zarrfs", Name: name, Help: help}, f))
	}
	counter("chunks_decoded_total", "Chunks decompressed.", func() float64 { return float64(st.ChunksDecoded.Load()) })
	counter("chunks_missing_total", "Chunks absent from the source, read as the fill value.", func() float64 { return float64(st.ChunksMissing.Load()) })
	counter("chunk_cache_hits_total", "Chunks served from the in-memory decoded-chunk cache.", func() float64 { return float64(st.ChunkCacheHits.Load()) })
	counter("source_bytes_total", "Compressed bytes read from the source.", func() float64 { return float64(st.BytesFetched.Load()) })
	if dec != nil {
		counter("gpu_chunks_decoded_total", "Chunks decoded on the GPU.", func() float64 { return float64(dec.GPUStats().Chunks) })
		counter("gpu_chunks_refused_total", "Chunks the GPU refused; they decode on the CPU.", func() float64 { return float64(dec.GPUStats().Refused) })
		counter("gpu_chunks_corrupt_total", "Chunks the GPU found corrupt.", func() float64 { return float64(dec.GPUStats().Corrupt) })
	}
	if c != nil {
		reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "zarrfs", Name: "cache_bytes", Help: "Bytes held in the disk cache."},
			func() float64 { b, _ := c.Usage(); return float64(b) }))
		reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "zarrfs", Name: "cache_files", Help: "Files held in the disk cache."},
			func() float64 { _, n := c.Usage(); return float64(n) }))
	}
	if dec != nil {
		reg.MustRegister(gpuMemory{dec, prometheus.NewDesc("zarrfs_gpu_memory_bytes",
			"Memory the GPUs hold for decoding now, besides their CUDA contexts, by kind (device, pinned).", []string{"kind"}, nil)})
	}
	reg.MustRegister(prometheus.NewGoCollector(), prometheus.NewProcessCollector(prometheus.ProcessCollectorOpts{}))
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
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
			log.Error("metrics server stopped", "addr", addr, "err", err)
		}
	}()
	log.Info("metrics", "url", "http://"+ln.Addr().String()+"/metrics")
	return nil
}

// gpuMemory reports what the decoding pipeline's GPUs hold when scraped.
type gpuMemory struct {
	dec  *decode.Pipeline
	desc *prometheus.Desc
}

func (g gpuMemory) Describe(ch chan<- *prometheus.Desc) { ch <- g.desc }

func (g gpuMemory) Collect(ch chan<- prometheus.Metric) {
	d, p := g.dec.MemoryHeld()
	ch <- prometheus.MustNewConstMetric(g.desc, prometheus.GaugeValue, float64(d), "device")
	ch <- prometheus.MustNewConstMetric(g.desc, prometheus.GaugeValue, float64(p), "pinned")
}
