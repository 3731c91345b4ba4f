package gpu

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// These tests hold on every machine; on one without a GPU they check that
// the absence is reported, not crashed on.

func TestProbeReportsReason(t *testing.T) {
	info := Probe(Libraries{})
	s := info.String()
	if info.Available {
		if info.Device == "" || info.Nvcomp == "" || !strings.HasPrefix(s, "GPU: ") {
			t.Fatalf("available GPU described incompletely: %+v", info)
		}
		t.Logf("%s (nvCOMP from %s)", s, info.NvcompPath)
		return
	}
	if info.Reason == "" || !strings.Contains(s, "none") {
		t.Fatalf("no GPU, but no reason given: %+v", info)
	}
	t.Logf("%s", s)
}

func TestNewWithoutGPU(t *testing.T) {
	if Probe(Libraries{}).Available {
		t.Skip("a GPU is present: the no-GPU error path cannot be exercised here")
	}
	d, err := New(Options{})
	if err == nil || d != nil {
		t.Fatalf("New on a machine without a usable GPU: %v, %v", d, err)
	}
	if !errors.Is(err, ErrNoGPU) || len(err.Error()) < 20 {
		t.Fatalf("error does not say why: %v", err)
	}
	t.Logf("New: %v", err)
}

func TestNewBadDevice(t *testing.T) {
	if !Probe(Libraries{}).Available {
		t.Skip("no GPU: " + Probe(Libraries{}).Reason)
	}
	if _, err := New(Options{Device: 1 << 20}); !errors.Is(err, ErrNoGPU) {
		t.Fatalf("device out of range: %v", err)
	}
}

func TestNvcompCandidates(t *testing.T) {
	dir := t.TempDir()
	site := filepath.Join(dir, "site")
	lib := filepath.Join(site, "nvidia", "libnvcomp", "lib64")
	if err := os.MkdirAll(lib, 0o755); err != nil {
		t.Fatal(err)
	}
	c := nvcompCandidates(Libraries{Nvcomp: dir, PythonPath: site + string(os.PathListSeparator) + "/nonexistent"})
	if len(c) < 4 || c[0] != filepath.Join(dir, nvcompLibNames[0]) {
		t.Fatalf("ZARRFS_NVCOMP_LIB folder not searched first: %v", c)
	}
	if c[len(nvcompLibNames)] != nvcompLibNames[0] {
		t.Fatalf("loader path not searched second: %v", c)
	}
	want := filepath.Join(lib, nvcompLibNames[0])
	var found bool
	for _, p := range c {
		found = found || p == want
	}
	if !found {
		t.Fatalf("PYTHONPATH site folder %s not searched: %v", want, c)
	}
}

func TestLoadNvcompNotFound(t *testing.T) {
	// A file that is not a library, named by the variable, and nothing on
	// the loader path (on machines without nvCOMP): the error must say
	// how to provide it.
	bogus := filepath.Join(t.TempDir(), "libnvcomp.so.6")
	if err := os.WriteFile(bogus, []byte("not an ELF file"), 0o644); err != nil {
		t.Fatal(err)
	}
	l, err := loadNvcomp(Libraries{Nvcomp: bogus, Home: t.TempDir()})
	if err == nil {
		if l.path == bogus {
			t.Fatal("loaded a bogus file")
		}
		t.Skipf("nvCOMP is installed here (%s)", l.path)
	}
	if !strings.Contains(err.Error(), "ZARRFS_NVCOMP_LIB") {
		t.Fatalf("error does not say how to provide nvCOMP: %v", err)
	}
}

func TestStatusNames(t *testing.T) {
	if nvStatus(12).String() != "nvcompErrorCannotDecompress" || !strings.Contains(nvStatus(-3).String(), "-3") {
		t.Fatal("status names")
	}
}

// LibrariesFrom names each place from its variable, so that the command's
// environment reaches the search (TestNvcompCandidates).
func TestLibrariesFrom(t *testing.T) {
	env := map[string]string{"ZARRFS_NVCOMP_LIB": "/n", "PYTHONPATH": "/p", "VIRTUAL_ENV": "/v", "CONDA_PREFIX": "/c", "HOME": "/h"}
	got := LibrariesFrom(func(k string) string { return env[k] })
	want := Libraries{Nvcomp: "/n", PythonPath: "/p", VirtualEnv: "/v", CondaPrefix: "/c", Home: "/h"}
	if got != want {
		t.Errorf("LibrariesFrom = %+v, want %+v", got, want)
	}
}
