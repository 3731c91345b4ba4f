package main

import (
	"strings"
	"sync/atomic"
	"testing"
)

// Every run's sample 0 and byte count are checked against the baseline,
// not only the last run's.
func TestAgreeChecksEveryRun(t *testing.T) {
	ref := []byte("sample zero")
	runs := []*result{{Mode: "fill", Bytes: 100}, {Mode: "batch", Bytes: 100}}
	if err := agree(runs, [][]byte{ref, ref}, ref, 100); err != nil {
		t.Fatalf("agreeing runs: %v", err)
	}
	bad := []byte("sample 0ero")
	for _, tc := range []struct {
		name    string
		samples [][]byte
		bytes   [2]int64
		want    string
	}{
		{"first sample differs", [][]byte{bad, ref}, [2]int64{100, 100}, "zarrfs fill: sample 0 differs"},
		{"last sample differs", [][]byte{ref, bad}, [2]int64{100, 100}, "zarrfs batch: sample 0 differs"},
		{"first count differs", [][]byte{ref, ref}, [2]int64{99, 100}, "zarrfs fill: 99 bytes"},
		{"last count differs", [][]byte{ref, ref}, [2]int64{100, 101}, "zarrfs batch: 101 bytes"},
	} {
		runs[0].Bytes, runs[1].Bytes = tc.bytes[0], tc.bytes[1]
		err := agree(runs, tc.samples, ref, 100)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error saying %q", tc.name, err, tc.want)
		}
	}
}

type nowhere struct{}

func (nowhere) WriteAt(p []byte, off int64) (int, error) { return len(p), nil }

// The counter counts what is written at or past the data offset.
func TestCounterCountsDataWritten(t *testing.T) {
	var n atomic.Int64
	c := counter{WriterAt: nowhere{}, align: 64, n: &n}
	c.WriteAt(make([]byte, 64), 0)   // the header: no data
	c.WriteAt(make([]byte, 100), 60) // 4 header bytes, 96 data bytes
	c.WriteAt(make([]byte, 10), 500)
	if got := n.Load(); got != 106 {
		t.Errorf("counted %d data bytes, want 106", got)
	}
}
