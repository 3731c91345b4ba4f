package main

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/zarrfs/zarrfs/objectstore/icechunk"
	"github.com/zarrfs/zarrfs/objectstore/kerchunk"
)

// A remote source is read as a virtual store from what the command line
// says, each store opened once and nothing probed: a plain prefix costs
// no request before it opens as a plain store, a ".json" key is a kerchunk
// reference set, reference://URL a Parquet folder, and --ref an Icechunk
// repository.
func TestOpenRemoteVirtual(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "data.bin"), []byte("0123456789"), 0o644)
	os.WriteFile(filepath.Join(dir, "refs.json"), []byte(`{"version": 1, "refs": {".zgroup": "{\"zarr_format\": 2}", "a/0": ["data.bin", 2, 3]}}`), 0o644)
	var mu sync.Mutex
	var reqs []string
	files := http.FileServer(http.Dir(dir))
	repo := http.StripPrefix("/repo", http.FileServer(http.Dir(filepath.Join("..", "..", "objectstore", "icechunk", "testdata", "v2"))))
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		reqs = append(reqs, r.Method+" "+r.URL.Path)
		mu.Unlock()
		if strings.HasPrefix(r.URL.Path, "/repo/") {
			repo.ServeHTTP(w, r)
			return
		}
		files.ServeHTTP(w, r)
	}))
	defer srv.Close()
	taken := func() []string {
		mu.Lock()
		defer mu.Unlock()
		out := reqs
		reqs = nil
		return out
	}
	flags := func(ref bool) *sourceFlags {
		return &sourceFlags{deadlines: deadlineFlags{timeout: 30 * time.Second, stall: 10 * time.Second},
			virtual: virtualFlags{ref: "main", refGiven: ref}}
	}
	ctx := context.Background()

	if st, ok, err := flags(false).openVirtual(ctx, srv.URL+"/plain.zarr"); ok || err != nil || st != nil {
		t.Errorf("plain prefix: %v, %v, %v; want a plain store", st, ok, err)
	}
	if got := taken(); len(got) != 0 {
		t.Errorf("plain prefix: requests %v before opening it as a plain store", got)
	}

	st, ok, err := flags(false).openVirtual(ctx, srv.URL+"/refs.json")
	if _, isRefs := st.(*kerchunk.Store); !ok || err != nil || !isRefs {
		t.Fatalf("refs.json: %T, %v, %v; want a kerchunk store", st, ok, err)
	}
	if got := taken(); len(got) != 1 || got[0] != "GET /refs.json" {
		t.Errorf("refs.json: requests %v at open, want the reference file alone", got)
	}
	if b, err := st.Get(ctx, "a/0"); err != nil || string(b) != "234" {
		t.Errorf("a/0 through a relative target: %q, %v", b, err)
	}
	closeStore(st)

	st, ok, err = flags(true).openVirtual(ctx, srv.URL+"/repo")
	if _, isRepo := st.(*icechunk.Store); !ok || err != nil || !isRepo {
		t.Fatalf("--ref over a repository: %T, %v, %v; want an Icechunk store", st, ok, err)
	}
	for _, r := range taken() {
		if strings.Contains(r, ".zmetadata") {
			t.Errorf("--ref: request %q for a Parquet reference set", r)
		}
	}
	if b, err := st.Get(ctx, "zarr.json"); err != nil || !strings.Contains(string(b), "zarr_format") {
		t.Errorf("repository zarr.json: %q, %v", b, err)
	}
	closeStore(st)

	for _, tc := range []struct {
		src          string
		ref          bool
		want, forbid string // forbid: a probe for the other kind
	}{
		{"reference://" + srv.URL + "/nothing", false, "nothing/.zmetadata", "/nothing/repo"},
		{srv.URL + "/plain.zarr", true, "not an Icechunk repository", ".zmetadata"},
	} {
		st, ok, err := flags(tc.ref).openVirtual(ctx, tc.src)
		if !ok || err == nil || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "\n") {
			t.Errorf("%s (--ref %v): %v, %v; want one line naming %q", tc.src, tc.ref, ok, err, tc.want)
		}
		if st != nil {
			closeStore(st)
		}
		for _, r := range taken() {
			if strings.Contains(r, tc.forbid) {
				t.Errorf("%s (--ref %v): request %q probes for another kind of store", tc.src, tc.ref, r)
			}
		}
	}
}

// A local source is recognised by what it holds; reference:// makes any
// file a JSON reference set and any folder a Parquet one.
func TestOpenLocalVirtual(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "data.bin"), []byte("0123456789"), 0o644)
	os.WriteFile(filepath.Join(dir, "refs"), []byte(`{"version": 1, "refs": {"a/0": ["data.bin", 2, 3]}}`), 0o644)
	os.WriteFile(filepath.Join(dir, "refs.json"), []byte(`{"version": 1, "refs": {"a/0": ["data.bin", 4, 2]}}`), 0o644)
	repo := filepath.Join("..", "..", "objectstore", "icechunk", "testdata", "v2")
	f := &sourceFlags{virtual: virtualFlags{ref: "main"}}
	ctx := context.Background()
	for _, tc := range []struct {
		src, want string // want: the key a/0's bytes, "icechunk", "plain" or an error's words
	}{
		{filepath.Join(dir, "refs.json"), "45"},
		{"file://" + filepath.Join(dir, "refs.json"), "45"},
		{"reference://" + filepath.Join(dir, "refs"), "234"},
		{filepath.Join(dir, "refs"), "plain"},
		{dir, "plain"},
		{repo, "icechunk"},
		{"reference://" + repo, "not a Parquet reference folder"},
		{"reference://" + dir, "not a Parquet reference folder"},
		{"reference://" + filepath.Join(dir, "nope"), "no such file"},
	} {
		st, ok, err := f.openVirtual(ctx, tc.src)
		switch {
		case tc.want == "plain":
			if ok || err != nil || st != nil {
				t.Errorf("%s: %T, %v, %v; want a plain store", tc.src, st, ok, err)
			}
		case tc.want == "icechunk":
			if _, isRepo := st.(*icechunk.Store); !ok || err != nil || !isRepo {
				t.Errorf("%s: %T, %v, %v; want an Icechunk store", tc.src, st, ok, err)
			}
		case err != nil || !ok:
			if !ok || err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("%s: %v, %v; want %q", tc.src, ok, err, tc.want)
			}
		default:
			if b, err := st.Get(ctx, "a/0"); err != nil || string(b) != tc.want {
				t.Errorf("%s: a/0 = %q, %v; want %q", tc.src, b, err, tc.want)
			}
		}
		if st != nil {
			closeStore(st)
		}
	}
}

// The bearer token is the user's for the source they named: it goes to
// the source's own origin, and to no other host a reference set names.
func TestBearerTokenScope(t *testing.T) {
	var mu sync.Mutex
	seen := map[string]string{}
	serve := func(name string) *httptest.Server {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			mu.Lock()
			seen[name] = r.Header.Get("Authorization")
			mu.Unlock()
			w.Write([]byte("x"))
		}))
		t.Cleanup(srv.Close)
		return srv
	}
	own, other := serve("own"), serve("other")
	t.Setenv(bearerTokenEnv, "user-token")
	ctx := context.Background()
	for _, tc := range []struct {
		source, store, name, want string
	}{
		{own.URL + "/refs.json", own.URL, "own", "Bearer user-token"},
		{"reference://" + own.URL + "/refs.parq", own.URL, "own", "Bearer user-token"},
		{own.URL + "/refs.json", other.URL, "other", ""},
		{"/local/refs.json", own.URL, "own", ""},
	} {
		f := &sourceFlags{deadlines: deadlineFlags{timeout: 30 * time.Second, stall: 10 * time.Second}, source: tc.source}
		st, err := openHTTP(ctx, tc.store, f)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := st.Get(ctx, "k"); err != nil {
			t.Fatal(err)
		}
		closeStore(st)
		mu.Lock()
		if got := seen[tc.name]; got != tc.want {
			t.Errorf("source %s, store %s: Authorization %q, want %q", tc.source, tc.name, got, tc.want)
		}
		mu.Unlock()
	}
}

// --ref-allow and --http-redirects are checked before anything opens.
func TestVirtualFlagErrors(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		allow []string
		redir string
		want  string
	}{
		{[]string{"ftp://host/x"}, "", "--ref-allow ftp://host/x: targets are not read from ftp:// URLs"},
		{[]string{"s3://"}, "", "--ref-allow s3://: no bucket or host"},
		{[]string{"https://u:p@host/"}, "", "a URL must not hold credentials (give the bearer token in ZARRFS_HTTP_BEARER_TOKEN instead)"},
		{[]string{"https://host/?sig=1"}, "", "no query or fragment"},
		{[]string{filepath.Join(dir, "nope")}, "", "--ref-allow " + filepath.Join(dir, "nope") + ": " + filepath.Join(dir, "nope") + ": no such folder"},
		{nil, "sometimes", `--http-redirects "sometimes": want same-host or any`},
	} {
		f := &sourceFlags{deadlines: deadlineFlags{timeout: 30 * time.Second, stall: 10 * time.Second},
			chunkVersions: "object", httpRedirects: tc.redir, virtual: virtualFlags{refAllow: tc.allow}}
		err := f.validateRemote("x")
		if err == nil {
			err = f.virtual.validate()
		}
		if err == nil || !strings.Contains(err.Error(), tc.want) || !isUsage(err) {
			t.Errorf("%v %q: %v (usage error %v), want a usage error with %q", tc.allow, tc.redir, err, isUsage(err), tc.want)
		}
	}
	f := &virtualFlags{refAllow: []string{dir, "gcs://b/p/", "s3a://b/"}}
	if err := f.validate(); err != nil || f.refAllow[1] != "gs://b/p/" || f.refAllow[2] != "s3://b/" || !f.allowsS3() {
		t.Errorf("valid places: %v, %v", f.refAllow, err)
	}
}

func isUsage(err error) bool {
	var u usageError
	return errors.As(err, &u)
}
