package main

import (
	"bytes"
	"encoding/json"
	"os"
	"reflect"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/zarrfs/zarrfs/cache"
	"github.com/zarrfs/zarrfs/deliver"
)

// fullStatus is a status document with every field set, omitempty ones
// included, so that its keys are all the keys there are.
func fullStatus() statusDoc {
	g := statusGPUStats{Chunks: 2, Bytes: 8, Refused: 1, Corrupt: 1, Rounds: 1, Disagreed: 1}
	stages := map[string]float64{}
	for _, s := range deliver.StageNames() {
		stages[s] = 1
	}
	return statusDoc{Mountpoint: "/m", Source: "file:///s", PID: 1, Started: time.Unix(0, 0), UptimeSeconds: 1,
		Args: []string{"mount"}, LogFile: "/l",
		Cache: statusCache{Dir: "/c", BlobDir: "/c/b", BudgetB: 1, UsedB: 1, Files: 1, BlobMode: "0400", Hits: 1, Misses: 1, Filling: 1,
			Evictions: 1, EvictedB: 1, ChunkHits: 1, ChunkMisses: 1, BlobB: 1, Blobs: 1, ChunkB: 1, Chunks: 1,
			ChunkStores: 1, ChunkDamaged: 1, ChunkEvictions: 1},
		Mount:  statusMount{Direct: true, Lease: "1m", World: 1, Shard: "contiguous", Opens: 1, OpenFiles: 1, Files: 1, Arrays: 1},
		Decode: statusDecode{Placement: "cpu", GPU: g, GPUs: []statusGPU{{Device: 0, statusGPUStats: g}}, Decoded: []statusDecoded{{Codec: "zstd", Device: "cpu", Chunks: 1, Bytes: 1}}},
		Reads:  statusReads{BytesFetched: 1},
		Errors: map[string]int{"t": 1},
		Delivery: &statusDelivery{Socket: "/r.ring.sock", Totals: deliver.Totals{Opened: 1, Open: 1, HeldBytes: 1,
			Counts: deliver.Counts{Fills: 1, Errors: 1, DeviceSamples: 1, HostSamples: 1, CachedSamples: 1, Compressed: 1, Uploaded: 1, Stages: stages}},
			Rings: []deliver.RingInfo{{ID: 1, Dir: "era5", Memory: "cuda", Slots: 3, Bytes: 1, SampleBytes: 1, Opened: time.Unix(0, 0),
				FirstFill: &deliver.FirstFill{Began: time.Unix(1, 0), Stages: stages},
				Route:     &deliver.RouteInfo{DeviceWait: 1, HostRate: 1, Fills: 1, AllOnHost: 1, OnHost: 1, OnDevice: 1},
				Counts:    deliver.Counts{Fills: 1, DeviceSamples: 1, HostSamples: 1, CachedSamples: 1, Compressed: 1, Uploaded: 1, Stages: stages}}}},
	}
}

// checkOmitemptySet fails t for each omitempty field of v (recursively)
// left zero: fullStatus must set them, or their keys would be missing from
// the comparison with the docs.
func checkOmitemptySet(t *testing.T, v reflect.Value, path string) {
	t.Helper()
	switch v.Kind() {
	case reflect.Struct:
		for i := range v.NumField() {
			f := v.Type().Field(i)
			fv := v.Field(i)
			if strings.HasSuffix(f.Tag.Get("json"), ",omitempty") && fv.IsZero() {
				t.Errorf("fullStatus leaves %s.%s (omitempty) unset", path, f.Name)
			}
			checkOmitemptySet(t, fv, path+"."+f.Name)
		}
	case reflect.Slice:
		for i := range v.Len() {
			checkOmitemptySet(t, v.Index(i), path+"[]")
		}
	}
}

// keyPaths lists the object keys of a JSON document as dotted paths;
// maps keyed by data (errors_by_array: array names) count as one key.
func keyPaths(v any, prefix string, out map[string]bool) {
	switch x := v.(type) {
	case map[string]any:
		if prefix == "errors_by_array" {
			return
		}
		for k, e := range x {
			p := k
			if prefix != "" {
				p = prefix + "." + k
			}
			out[p] = true
			keyPaths(e, p, out)
		}
	case []any:
		for _, e := range x {
			keyPaths(e, prefix+"[]", out)
		}
	}
}

func jsonKeys(t *testing.T, b []byte) []string {
	t.Helper()
	var v any
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatalf("%v\n%s", err, b)
	}
	m := map[string]bool{}
	keyPaths(v, "", m)
	var keys []string
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

var snake = regexp.MustCompile(`^[a-z][a-z0-9_]*$`)

// docJSON returns the JSON block of docs/operations.md that follows the
// first line containing marker.
func docJSON(t *testing.T, marker string) []byte {
	t.Helper()
	b, err := os.ReadFile("../../docs/operations.md")
	if err != nil {
		t.Fatal(err)
	}
	i := bytes.Index(b, []byte(marker))
	if i < 0 {
		t.Fatalf("docs/operations.md has no %q", marker)
	}
	rest := b[i:]
	start := bytes.Index(rest, []byte("```json\n"))
	if start < 0 {
		t.Fatalf("no JSON block after %q", marker)
	}
	rest = rest[start+len("```json\n"):]
	return rest[:bytes.Index(rest, []byte("```"))]
}

// status --json: every key snake_case (the GPU counters were Go field
// names), and the keys docs/operations.md shows are the keys printed.
func TestStatusJSONKeys(t *testing.T) {
	checkOmitemptySet(t, reflect.ValueOf(fullStatus()), "status")
	var buf bytes.Buffer
	if err := writeJSON(&buf, fullStatus()); err != nil {
		t.Fatal(err)
	}
	got := jsonKeys(t, buf.Bytes())
	for _, k := range got {
		for _, seg := range strings.Split(strings.ReplaceAll(k, "[]", ""), ".") {
			if !snake.MatchString(seg) {
				t.Errorf("status key %q is not snake_case", k)
			}
		}
	}
	doc := jsonKeys(t, docJSON(t, "`zarrfs status MOUNTPOINT --json` prints"))
	if !slices.Equal(got, doc) {
		t.Errorf("status --json keys differ from docs/operations.md\nprinted:    %v\ndocumented: %v", got, doc)
	}

	buf.Reset()
	s := cache.Summary{Dir: "/c", Blobs: 1, Layouts: []cache.LayoutSummary{{ID: "x", Blobs: 1, Bytes: 1}}}
	if err := writeJSON(&buf, cacheSummaryDoc(s)); err != nil {
		t.Fatal(err)
	}
	got = jsonKeys(t, buf.Bytes())
	doc = jsonKeys(t, docJSON(t, "`zarrfs status --cache DIR --json`"))
	if !slices.Equal(got, doc) {
		t.Errorf("status --cache --json keys differ from docs/operations.md\nprinted:    %v\ndocumented: %v", got, doc)
	}
}

// zarrfs status says what the GPUs' pinned memory is for, once they hold
// any: the rounds' staging, the pool fills are lent from, what of it is
// lent now and the most lent at once, and what the pool had no room for.
func TestStatusTextPinned(t *testing.T) {
	d := fullStatus()
	var out bytes.Buffer
	printStatus(&out, d)
	if strings.Contains(out.String(), "pinned:") {
		t.Fatalf("a status without pinned memory has a pinned line:\n%s", out.String())
	}
	d.Decode.GPUPinned = statusGPUPinned{StagingB: 512 << 20, PoolB: 2 << 30, LentB: 1 << 20, LentPeakB: 768 << 20, MissedB: 96 << 20}
	out.Reset()
	printStatus(&out, d)
	line := regexp.MustCompile(`pinned: (\S+ \S+) staging, (\S+ \S+) pool \((\S+ \S+) lent, at most (\S+ \S+)\); (\S+ \S+) lent unpinned`).FindStringSubmatch(out.String())
	if line == nil || line[1] != "512 MiB" || line[2] != "2.0 GiB" || line[4] != "768 MiB" || line[5] != "96 MiB" {
		t.Fatalf("no pinned line with the staging, pool, peak and misses:\n%s", out.String())
	}
}

// The text status gives a ring's route where its router saw chunks of
// large parts: how many went where, and what it decided on.
func TestStatusTextRoute(t *testing.T) {
	d := fullStatus()
	d.Delivery.Rings[0].Route = &deliver.RouteInfo{DeviceWait: 0.118, HostRate: 3 << 30, Fills: 24, AllOnHost: 20, OnHost: 380, OnDevice: 4}
	var out bytes.Buffer
	printStatus(&out, d)
	line := regexp.MustCompile(`chunks of large parts \(zstd frames of 1 MiB or more\): (\d+) on the host, (\d+) on the GPU, in (\d+) fills \((\d+) all on the host\); the GPU's wait (\d+) ms, the host's rate (\S+ \S+)/s`).FindStringSubmatch(out.String())
	if line == nil || line[1] != "380" || line[2] != "4" || line[3] != "24" || line[4] != "20" || line[5] != "118" || line[6] != "3.0 GiB" {
		t.Fatalf("no route line with the chunks by side, the fills and the measures:\n%s", out.String())
	}
	// Every such chunk on the host from the first fill: the GPU's wait is
	// not known, not 0 ms.
	d.Delivery.Rings[0].Route = &deliver.RouteInfo{HostRate: 3 << 30, Fills: 24, AllOnHost: 24, OnHost: 384}
	out.Reset()
	printStatus(&out, d)
	if !strings.Contains(out.String(), "in 24 fills (24 all on the host); the GPU's wait not measured, the host's rate 3.0 GiB/s") {
		t.Fatalf("a route whose GPU wait was never measured says it:\n%s", out.String())
	}
	d.Delivery.Rings[0].Route = nil
	out.Reset()
	printStatus(&out, d)
	if strings.Contains(out.String(), "chunks of large parts") {
		t.Fatalf("a ring without a route has a route line:\n%s", out.String())
	}
}

// The text status says how many of the host path's samples came from the
// cache, in the totals and per ring.
func TestStatusTextCachedSamples(t *testing.T) {
	d := fullStatus()
	d.Delivery.HostSamples, d.Delivery.CachedSamples = 40, 37
	d.Delivery.Rings[0].HostSamples, d.Delivery.Rings[0].CachedSamples = 12, 9
	var out bytes.Buffer
	printStatus(&out, d)
	if !strings.Contains(out.String(), "40 host path, 37 of them from the cache)") ||
		!strings.Contains(out.String(), "12 host path samples (9 from the cache)") {
		t.Fatalf("no cached samples in the delivery lines:\n%s", out.String())
	}
}
