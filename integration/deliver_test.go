package integration

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/zarrfs/zarrfs/internal/testenv"
)

// The device path faces the decoders' damage suite (internal/damage,
// applied to a store's chunk files by integration/gpu/chunkdamage) through
// zarrfs.torch.Loader with decode='device', here in the mount's test mode
// (a ring of host memory the CPU decodes into), as make test-gpu runs it
// on a GPU (integration/gpu/deliver.sh): every damaged sample the CPU
// rejects raises naming its file and chunk, no other sample differs from
// the file of a mount decoding on the CPU, an epoch hands out the batches
// before a damaged one, and the daemon serves on.
func TestDevicePathDamage(t *testing.T) {
	requirePython(t)
	if err := exec.Command("python3", "-c", "import numcodecs, torch, zarrfs.loader").Run(); err != nil {
		testenv.Missing(t, "numcodecs, torch and the zarrfs package are needed (make pydeps)")
	}
	root := repoRoot(t)
	bin := zarrfsBin(t)
	tool := filepath.Join(t.TempDir(), "chunkdamage")
	build := exec.Command("go", "build", "-o", tool, "./integration/gpu/chunkdamage")
	build.Dir = root
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	cmd := exec.Command("python3", filepath.Join(root, "integration", "gpu", "deliver_check.py"), bin, "-", "-", t.TempDir(),
		"--parts", "damage", "--device", "cpu", "--chunkdamage", tool)
	cmd.Env = append(os.Environ(), "PYTHONPATH="+filepath.Join(root, "python", "src"))
	out, err := cmd.CombinedOutput()
	text := string(out)
	if err != nil || !strings.Contains(text, "all checks passed") {
		t.Fatalf("deliver_check.py --parts damage: %v\n%s", err, text)
	}
	// Every check ran, and the suite damaged what it says: each array
	// rejected damaged samples and served undamaged ones.
	if n := strings.Count(text, "\nPASS damage"); n < 8 {
		t.Errorf("%d checks passed, want 8 or more:\n%s", n, text)
	}
	re := regexp.MustCompile(`(?m)^  (\w+) \(default\): (\d+) undamaged \((\d+) filled by the device path\), (\d+) damaged rejected`)
	seen := 0
	for _, m := range re.FindAllStringSubmatch(text, -1) {
		seen++
		if m[2] == "0" || m[2] != m[3] || m[4] == "0" {
			t.Errorf("%s: %s undamaged, %s by the device path, %s damaged rejected", m[1], m[2], m[3], m[4])
		}
	}
	if seen != 3 {
		t.Errorf("%d arrays reported, want 3:\n%s", seen, text)
	}
	t.Log(text)
}
