package targets

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"

	"github.com/zarrfs/zarrfs/objectstore"
)

// The Scope is the one rule of what a reference set reaches: each target
// is read only inside a place the user named (or the reference set's own),
// and a refused one opens no store and names the rule that refused it.
func TestScope(t *testing.T) {
	dir := t.TempDir()
	var mu sync.Mutex
	var opened []string
	open := func(_ context.Context, root string) (objectstore.Store, error) {
		mu.Lock()
		opened = append(opened, root)
		mu.Unlock()
		return &gateStore{}, nil
	}
	r, err := New(Options{Base: dir, Aliases: map[string]string{"s3a": "s3"},
		Openers: Openers{"s3": open, "gs": open, "http": open, "https": open},
		Scope: Scope{LocalHint: "--ref-base", RemoteHint: "--ref-allow", Places: []Place{
			{Prefix: dir, Name: "the reference set's folder"},
			{Prefix: "s3://era5-raw/", Name: "--ref-allow"},
			{Prefix: "https://Data.Example.org:443/era5", Name: "--ref-allow"},
			{Prefix: "http://127.0.0.1:8080/", Name: "--ref-allow"},
		}}})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, raw := range []string{
		"a.nc", "sub/b.nc", dir + "/c.nc", "file://" + dir + "/d.nc", "file://localhost" + dir + "/e.nc",
		"s3://era5-raw/x.nc", "s3a://era5-raw/y/z.nc",
		"https://data.example.org/era5/f.nc", "https://DATA.example.org:443/era5/g/h.nc", "https://data.example.org/era5",
		"http://127.0.0.1:8080/i.nc",
	} {
		if _, err := r.Resolve(ctx, raw); err != nil {
			t.Errorf("%s: %v, want it read", raw, err)
		}
	}
	opened = nil
	for raw, want := range map[string]string{
		"/etc/passwd":                                "target /etc/passwd is outside the reference set's folder " + dir + " (--ref-base)",
		"file:///etc/passwd":                         "target /etc/passwd is outside",
		"../../../etc/passwd":                        "is outside the reference set's folder",
		dir + "/../x.nc":                             "is outside the reference set's folder",
		"s3://other/x.nc":                            "target s3://other/x.nc is outside --ref-allow s3://era5-raw/ and --ref-allow https://Data.Example.org:443/era5 and --ref-allow http://127.0.0.1:8080/ (--ref-allow)",
		"s3://era5-raw2/x.nc":                        "is outside --ref-allow s3://era5-raw/",
		"https://data.example.org/era5x/f.nc":        "is outside",
		"https://data.example.org/other/f.nc":        "is outside",
		"http://data.example.org/era5/f.nc":          "is outside",
		"https://data.example.org:8443/era5/f":       "is outside",
		"http://127.0.0.2:8080/i.nc":                 "is outside",
		"http://127.0.0.1:8081/i.nc":                 "is outside",
		"gs://era5-raw/x.nc":                         "is outside",
		"https://user:pw@data.example.org/era5/f.nc": "without credentials",
	} {
		_, err := r.Resolve(ctx, raw)
		if err == nil || !strings.Contains(err.Error(), want) || strings.Contains(err.Error(), "\n") {
			t.Errorf("%s: %v, want one line with %q", raw, err, want)
			continue
		}
		if !strings.Contains(want, "credentials") && !errors.Is(err, ErrOutOfScope) {
			t.Errorf("%s: %v is not ErrOutOfScope", raw, err)
		}
		if strings.Contains(err.Error(), "link") || strings.Contains(err.Error(), "pw") {
			t.Errorf("%s: %q speaks of links or shows the password", raw, err)
		}
	}
	if len(opened) != 0 {
		t.Errorf("refused targets opened stores %v", opened)
	}

	// A remote reference set's own bucket, and nothing local.
	remote, _ := New(Options{Base: "s3://refs/r", Openers: Openers{"s3": open},
		Scope: Scope{LocalHint: "--ref-base", RemoteHint: "--ref-allow", Places: []Place{{Prefix: "s3://refs/", Name: "the reference set's bucket"}}}})
	if _, err := remote.Resolve(ctx, "data/x.nc"); err != nil {
		t.Errorf("relative target in the reference set's bucket: %v", err)
	}
	for raw, want := range map[string]string{
		"/etc/passwd":       "target /etc/passwd is outside what this reference set may read: it reads no local file (--ref-base)",
		"s3://private/x.nc": "target s3://private/x.nc is outside the reference set's bucket s3://refs/ (--ref-allow)",
	} {
		if _, err := remote.Resolve(ctx, raw); err == nil || err.Error() != want {
			t.Errorf("remote %s: %v, want %q", raw, err, want)
		}
	}
	// Bad places are refused at New.
	for _, p := range []string{"relative/dir", "https://", "s3://u:p@b/"} {
		if _, err := New(Options{Scope: Scope{Places: []Place{{Prefix: p, Name: "--ref-allow"}}}}); err == nil {
			t.Errorf("place %q accepted", p)
		}
	}
}
