package gpu

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/ebitengine/purego"
)

// nvStatus is nvCOMP's nvcompStatus_t.
type nvStatus int32

const nvSuccess nvStatus = 0

// nvStatusNames gives nvcompStatus_t names for messages, so a status read
// back from the device can be reported without calling into the library.
var nvStatusNames = map[nvStatus]string{
	0:     "nvcompSuccess",
	10:    "nvcompErrorInvalidValue",
	11:    "nvcompErrorNotSupported",
	12:    "nvcompErrorCannotDecompress",
	13:    "nvcompErrorBadChecksum",
	14:    "nvcompErrorCannotVerifyChecksums",
	15:    "nvcompErrorOutputBufferTooSmall",
	16:    "nvcompErrorWrongHeaderLength",
	17:    "nvcompErrorAlignment",
	18:    "nvcompErrorChunkSizeTooLarge",
	19:    "nvcompErrorCannotCompress",
	20:    "nvcompErrorWrongInputLength",
	21:    "nvcompErrorBatchSizeTooLarge",
	22:    "nvcompErrorSubChunkCountTooLarge",
	23:    "nvcompErrorSubChunkCountTooSmall",
	24:    "nvcompErrorOutputBufferAlignmentTooSmall",
	1000:  "nvcompErrorCudaError",
	10000: "nvcompErrorInternal",
}

func (s nvStatus) String() string {
	if n, ok := nvStatusNames[s]; ok {
		return n
	}
	return fmt.Sprintf("nvcompStatus(%d)", int32(s))
}

// nvOpts is the 64-byte decompression options struct every batched
// algorithm takes by value (nvcompBatched*DecompressOpts_t). All-zero means
// the default backend and, for gzip, the naive algorithm; LZ4's data_type 0
// is NVCOMP_TYPE_CHAR with no bitshuffle, which is what raw LZ4 blocks need.
type nvOpts struct {
	w [16]int32
}

// nvAlign is nvcompAlignmentRequirements_t.
type nvAlign struct {
	Input, Output, Temp uint64
}

type nvProperties struct {
	Version, CudartVersion uint32
}

// nvAlgo is one batched low-level algorithm. The signatures are those of
// nvCOMP 5 and 6, where every decompression call takes the options struct.
type nvAlgo struct {
	name   string
	align  nvAlign
	opts   nvOpts
	getTmp func(numChunks, maxChunk uint64, opts nvOpts, temp *uint64, maxTotal uint64, stream uintptr) nvStatus
	getAln func(opts nvOpts, a *nvAlign) nvStatus
	decomp func(inPtrs, inBytes, outBufBytes, outActual uintptr, n uint64, temp uintptr, tempBytes uint64,
		outPtrs uintptr, opts nvOpts, statuses uintptr, stream uintptr) nvStatus
}

// Index of each algorithm in nvcompLib.algos.
const (
	algoZstd = iota
	algoLZ4
	algoDeflate
	algoSnappy
	numAlgos
)

var algoSymbols = [numAlgos]string{"Zstd", "LZ4", "Deflate", "Snappy"}

type nvcompLib struct {
	path    string
	handle  uintptr
	version uint32 // MAJOR*1000 + MINOR*100 + PATCH
	algos   [numAlgos]nvAlgo

	getProperties func(p *nvProperties) nvStatus
}

func (n *nvcompLib) versionString() string {
	v := n.version
	return fmt.Sprintf("%d.%d.%d", v/1000, (v%1000)/100, v%100)
}

// nvcompLibNames are the sonames tried on the loader path, newest first.
var nvcompLibNames = []string{"libnvcomp.so.6", "libnvcomp.so.5", "libnvcomp.so"}

// nvcompCandidates lists the places the library is looked for, in order:
// where.Nvcomp (a file, or a folder holding it), the
// dynamic loader's own search (bare sonames), then the lib64 folder of the
// nvidia-libnvcomp wheel under every Python site-packages folder we can
// think of, since that wheel is how most machines get nvCOMP.
func nvcompCandidates(where Libraries) []string {
	var out []string
	if p := where.Nvcomp; p != "" {
		if st, err := os.Stat(p); err == nil && st.IsDir() {
			for _, n := range nvcompLibNames {
				out = append(out, filepath.Join(p, n))
			}
		} else {
			out = append(out, p)
		}
	}
	out = append(out, nvcompLibNames...)
	for _, dir := range sitePackages(where) {
		for _, n := range nvcompLibNames {
			out = append(out, filepath.Join(dir, "nvidia", "libnvcomp", "lib64", n))
		}
	}
	return out
}

// sitePackages returns existing Python package folders: where.PythonPath
// first, then virtual environments, the user's site, and system locations.
func sitePackages(where Libraries) []string {
	var dirs []string
	for _, p := range filepath.SplitList(where.PythonPath) {
		if p != "" {
			dirs = append(dirs, p)
		}
	}
	var globs []string
	for _, root := range []string{where.VirtualEnv, where.CondaPrefix} {
		if root != "" {
			globs = append(globs, filepath.Join(root, "lib", "python3*", "site-packages"))
		}
	}
	if home := where.Home; home != "" {
		globs = append(globs, filepath.Join(home, ".local", "lib", "python3*", "site-packages"))
	}
	for _, prefix := range []string{"/usr/local/lib", "/usr/lib", "/usr/local/lib64", "/usr/lib64", "/opt/conda/lib"} {
		globs = append(globs,
			filepath.Join(prefix, "python3*", "site-packages"),
			filepath.Join(prefix, "python3*", "dist-packages"))
	}
	globs = append(globs, "/usr/lib/python3/dist-packages", "/opt/*/.venv/lib/python3*/site-packages")
	for _, g := range globs {
		m, _ := filepath.Glob(g)
		sort.Sort(sort.Reverse(sort.StringSlice(m))) // newest Python first
		dirs = append(dirs, m...)
	}
	seen := map[string]bool{}
	var out []string
	for _, d := range dirs {
		if !seen[d] {
			seen[d] = true
			out = append(out, d)
		}
	}
	return out
}

func loadNvcomp(where Libraries) (*nvcompLib, error) {
	var tried []string
	for _, cand := range nvcompCandidates(where) {
		if strings.ContainsRune(cand, '/') {
			if _, err := os.Stat(cand); err != nil {
				continue
			}
		}
		h, err := purego.Dlopen(cand, purego.RTLD_NOW|purego.RTLD_LOCAL)
		if err != nil {
			tried = append(tried, err.Error())
			continue
		}
		l := &nvcompLib{path: cand, handle: h}
		if err := l.bind(); err != nil {
			return nil, fmt.Errorf("nvCOMP at %s: %w", cand, err)
		}
		return l, nil
	}
	msg := "not found (set ZARRFS_NVCOMP_LIB, or pip install nvidia-libnvcomp-cu13)"
	if len(tried) > 0 {
		msg += ": " + strings.Join(tried, "; ")
	}
	return nil, fmt.Errorf("nvCOMP library libnvcomp.so %s", msg)
}

func (l *nvcompLib) bind() error {
	if err := register(&l.getProperties, l.handle, "nvcompGetProperties"); err != nil {
		return err
	}
	var p nvProperties
	if st := l.getProperties(&p); st != nvSuccess {
		return fmt.Errorf("nvcompGetProperties: %v", st)
	}
	l.version = p.Version
	if major := p.Version / 1000; major < 5 {
		// nvCOMP 4 and older take no options struct in the decompression
		// calls: binding them with these signatures would corrupt the stack.
		return fmt.Errorf("version %s is too old: need nvCOMP 5 or newer", l.versionString())
	}
	for i, sym := range algoSymbols {
		a := &l.algos[i]
		a.name = strings.ToLower(sym)
		pre := "nvcompBatched" + sym
		if err := register(&a.getTmp, l.handle, pre+"DecompressGetTempSize"); err != nil {
			return err
		}
		if err := register(&a.getAln, l.handle, pre+"DecompressGetRequiredAlignments"); err != nil {
			return err
		}
		if err := register(&a.decomp, l.handle, pre+"DecompressAsync"); err != nil {
			return err
		}
		if st := a.getAln(a.opts, &a.align); st != nvSuccess {
			return fmt.Errorf("%sDecompressGetRequiredAlignments: %v", pre, st)
		}
	}
	return nil
}
