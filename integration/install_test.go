package integration

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/zarrfs/zarrfs/internal/testenv"
)

// make install and install-systemd, staged under DESTDIR with another
// PREFIX: the binary runs, mount(8)'s helper links to it where it will be
// installed, the units name it, and make uninstall takes all of it away.
func TestMakeInstall(t *testing.T) {
	if _, err := exec.LookPath("make"); err != nil {
		testenv.Missing(t, "make is needed: %v", err)
	}
	root := repoRoot(t)
	dest := t.TempDir()
	const prefix = "/opt/zarrfs-test"
	mk := func(targets ...string) {
		t.Helper()
		cmd := exec.Command("make", append([]string{"--no-print-directory", "DESTDIR=" + dest, "PREFIX=" + prefix}, targets...)...)
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("make %v: %v\n%s", targets, err, out)
		}
	}
	mk("install", "install-systemd")

	bin := filepath.Join(dest, prefix, "bin", "zarrfs")
	if out, err := exec.Command(bin, "version").CombinedOutput(); err != nil || !strings.Contains(string(out), "zarrfs") {
		t.Errorf("%s version: %v\n%s", bin, err, out)
	}
	// With a PREFIX of its own, the helper stays under it too.
	helper := filepath.Join(dest, prefix, "sbin", "mount.fuse.zarrfs")
	if target, err := os.Readlink(helper); err != nil || target != prefix+"/bin/zarrfs" {
		t.Errorf("%s -> %q (%v), want a link to %s/bin/zarrfs", helper, target, err, prefix)
	}
	units, _ := filepath.Glob(filepath.Join(root, "contrib", "systemd", "*"))
	if len(units) == 0 {
		t.Fatal("contrib/systemd holds no units")
	}
	for _, u := range units {
		b, err := os.ReadFile(filepath.Join(dest, "etc", "systemd", "system", filepath.Base(u)))
		if err != nil {
			t.Error(err)
			continue
		}
		if strings.Contains(string(b), "/usr/local/bin/zarrfs") {
			t.Errorf("%s still names /usr/local/bin/zarrfs with PREFIX=%s", filepath.Base(u), prefix)
		}
		if strings.Contains(string(b), "ExecStart=") && !strings.Contains(string(b), prefix+"/bin/zarrfs") {
			t.Errorf("%s does not name %s/bin/zarrfs", filepath.Base(u), prefix)
		}
	}

	mk("uninstall")
	var left []string
	filepath.Walk(dest, func(p string, info os.FileInfo, err error) error {
		if err == nil && !info.IsDir() {
			left = append(left, p)
		}
		return nil
	})
	if len(left) > 0 {
		t.Errorf("make uninstall left %v", left)
	}
}

// make install with a PREFIX of its own writes nothing outside it (mount(8)'s
// helper goes to /sbin only for /usr/local and /usr, or when HELPERDIR says
// so), and make demo needs the build and numpy alone: none of the test
// suite's Python packages (make pydeps, gigabytes) is installed for it.
func TestMakeTargetsStayInTheirPlace(t *testing.T) {
	if _, err := exec.LookPath("make"); err != nil {
		testenv.Missing(t, "make is needed: %v", err)
	}
	dry := func(args ...string) string {
		t.Helper()
		cmd := exec.Command("make", append([]string{"-n", "--no-print-directory"}, args...)...)
		cmd.Dir = repoRoot(t)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("make -n %v: %v\n%s", args, err, out)
		}
		return string(out)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"install", "PREFIX=/opt/z"}, "/opt/z/sbin/mount.fuse.zarrfs"},
		{[]string{"install"}, " /sbin/mount.fuse.zarrfs"},
		{[]string{"install", "PREFIX=/opt/z", "HELPERDIR=/sbin"}, " /sbin/mount.fuse.zarrfs"},
	} {
		out := dry(tc.args...)
		if !strings.Contains(out, tc.want) {
			t.Errorf("make -n %v does not install %s:\n%s", tc.args, tc.want, out)
		}
		if tc.args[len(tc.args)-1] == "PREFIX=/opt/z" && strings.Contains(out, " /sbin/") {
			t.Errorf("make -n %v writes to /sbin:\n%s", tc.args, out)
		}
	}
	// A checkout without .venv: what would make demo install?
	out := dry("demo", "VENV="+filepath.Join(t.TempDir(), "venv"))
	for _, bad := range []string{"pip install", "requirements", "venv"} {
		if strings.Contains(out, bad) {
			t.Errorf("make demo would run %q:\n%s", bad, out)
		}
	}
}
