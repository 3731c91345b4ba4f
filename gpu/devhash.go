package gpu

import "encoding/binary"

// This file holds zstd frames decoded into device memory that the host
// never reads (a ring slot, Ring.Decode) to their content checksum: the
// device hashes their decoded bytes (kernels.cu's xxh64_check) in the
// round, after nvCOMP and before any kernel moves or swaps them, and the
// host compares the sums that come back with the frames' checksums, as it
// compares its own over decoded bytes it holds (checksum.go). With PTX from
// before the kernel, such chunks go to the caller (ErrUnsupported), who
// decodes them on the host.

// hashRef is one decoded zstd frame the device hashes: job (an index into
// the layout's jobs) decoded to [at, at+n) of the output buffer, whose
// frame's checksum is want.
type hashRef struct {
	job   int
	at, n int64
	want  uint32
}

// hashable reports whether the device can hold job p to its checksum:
// one zstd frame with a content checksum, nothing else to verify.
func (p *prepared) hashable() bool {
	return p.check == checkXXH64 && len(p.sums) == 0 && len(p.pieces) == 1 && p.pieces[0].algo == algoZstd && p.shuffle == nil
}

// checkHashes compares the sums xxh64_check wrote into hout (the output
// buffer's host copy) with the frames' checksums: a mismatch makes the job
// corrupt (a zstd checksum sits at the end of its frame: the CPU decoder
// fails it too), a match verifies it, so that settle does not hash it
// again. Jobs already failed are left as they are.
func (l *layout) checkHashes(hout []byte, jobErr []error, preps []prepared) {
	for i, h := range l.hashes {
		if jobErr[h.job] != nil {
			continue
		}
		got := binary.LittleEndian.Uint32(l.staged(hout, l.hashOff+4*int64(i)))
		if got != h.want {
			jobErr[h.job] = mismatch(checkXXH64, "", got, h.want)
			continue
		}
		preps[l.jobs[h.job]].check = checkNone
	}
}

// hashDescs writes xxh64_check's descriptors into the staging buffer hin,
// the output buffer being at outBase on the device.
func (l *layout) hashDescs(hin []byte, outBase uint64) {
	le := binary.LittleEndian
	for i, h := range l.hashes {
		o := l.hashDesc + int64(i*hashDescSize)
		le.PutUint64(hin[o:], outBase+uint64(h.at))
		le.PutUint64(hin[o+8:], uint64(h.n))
	}
}
