package integration

import (
	"bytes"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/zarrfs/zarrfs/integration/faultproxy"
	"github.com/zarrfs/zarrfs/integration/miniotest"
)

// refSet is a kerchunk JSON reference set (version 1) of one array "a" of
// 64 bytes whose one chunk is the first 64 bytes of target.
func refSet(target string) []byte {
	meta := func(v any) string { b, _ := json.Marshal(v); return string(b) }
	doc, _ := json.Marshal(map[string]any{"version": 1, "refs": map[string]any{
		".zgroup": meta(map[string]any{"zarr_format": 2}),
		"a/.zarray": meta(map[string]any{"shape": []int{64}, "chunks": []int{64}, "dtype": "|u1", "compressor": nil,
			"fill_value": 0, "order": "C", "filters": nil, "zarr_format": 2}),
		"a/.zattrs": meta(map[string]any{"_ARRAY_DIMENSIONS": []string{"x"}}),
		"a/0":       []any{target, 0, 64},
	}})
	return doc
}

// webHost serves a folder on addr ("127.0.0.2:0"), recording every request
// with its Authorization header; a path "/to/PORT/REST" answers 302 to
// REST on 127.0.0.2:PORT.
type webHost struct {
	URL  string
	mu   sync.Mutex
	seen []string
}

func startWebHost(t *testing.T, addr, dir string) *webHost {
	t.Helper()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Skipf("cannot listen on %s: %v", addr, err)
	}
	h := &webHost{URL: "http://" + ln.Addr().String()}
	files := http.FileServer(http.Dir(dir))
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.mu.Lock()
		h.seen = append(h.seen, r.Method+" "+r.URL.Path+" auth="+r.Header.Get("Authorization"))
		h.mu.Unlock()
		if rest, ok := strings.CutPrefix(r.URL.Path, "/to/"); ok {
			port, p, _ := strings.Cut(rest, "/")
			http.Redirect(w, r, "http://127.0.0.2:"+port+"/"+p, http.StatusFound)
			return
		}
		files.ServeHTTP(w, r)
	})}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return h
}

func (h *webHost) requests() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]string(nil), h.seen...)
}

func (h *webHost) port() string { return h.URL[strings.LastIndex(h.URL, ":")+1:] }

// warmedA warms src into a new cache and returns warm's exit code, its
// stderr and the bytes of a.npy's data ("" when it was not filled).
func warmedA(t *testing.T, src string, args ...string) (int, string, []byte) {
	t.Helper()
	cache := t.TempDir()
	_, stderr, code := run(t, append([]string{"warm", src, "--cache", cache}, args...)...)
	ms, _ := filepath.Glob(filepath.Join(cache, "blobs", "*", "a.npy"))
	if len(ms) == 0 {
		return code, stderr, nil
	}
	b, err := os.ReadFile(ms[0])
	if err != nil || len(b) < 4096+64 {
		t.Fatalf("a.npy: %d bytes, %v", len(b), err)
	}
	return code, stderr, b[4096 : 4096+64]
}

// A reference set reaches only its own folder, bucket or host and what
// the user names: hostile targets (local files, another bucket, another
// host) fail with the rule's message whoever serves the reference set and
// whatever --follow-symlinks says, reach no other server, and the bearer
// token goes to the source's own host alone.
func TestReferenceTrust(t *testing.T) {
	requireMountTools(t)
	root := t.TempDir()
	refs, secret := filepath.Join(root, "refs"), filepath.Join(root, "secret")
	os.MkdirAll(filepath.Join(secret, "pub"), 0o755)
	os.MkdirAll(refs, 0o755)
	data, private, public := make([]byte, 64), make([]byte, 64), make([]byte, 64)
	rand.Read(data)
	rand.Read(private)
	rand.Read(public)
	os.WriteFile(filepath.Join(refs, "data.bin"), data, 0o644)
	os.WriteFile(filepath.Join(secret, "secret.bin"), private, 0o644)
	os.WriteFile(filepath.Join(secret, "pub", "x.bin"), public, 0o644)

	own := startWebHost(t, "127.0.0.1:0", refs)     // serves the reference sets
	other := startWebHost(t, "127.0.0.2:0", secret) // "elsewhere"
	srv := miniotest.Start(t)
	s3Env(t, srv)
	srv.MakeBucket(t, "refs")
	srv.MakeBucket(t, "private")
	srv.UploadFiles(t, "private", "", map[string][]byte{"secret.bin": private})
	// Every S3 request goes through a proxy that records the buckets asked.
	proxy, err := faultproxy.New(srv.Endpoint)
	if err != nil {
		t.Fatal(err)
	}
	defer proxy.Close()
	var bucketsMu sync.Mutex
	var privateReqs []string
	proxy.SetRule(func(req *http.Request, _ int64) faultproxy.Fault {
		if strings.HasPrefix(req.URL.Path, "/private") {
			bucketsMu.Lock()
			privateReqs = append(privateReqs, req.Method+" "+req.URL.Path)
			bucketsMu.Unlock()
		}
		return faultproxy.Fault{Kind: faultproxy.Pass}
	})
	s3 := []string{"--s3-endpoint", proxy.URL}
	const token = "the-users-own-bearer-token"
	t.Setenv("ZARRFS_HTTP_BEARER_TOKEN", token)

	hostile := map[string]string{
		"etc":      "/etc/passwd",
		"fileurl":  "file:///etc/passwd",
		"dotdot":   "../../../../../../etc/passwd",
		"secret":   filepath.Join(secret, "secret.bin"),
		"host":     other.URL + "/secret.bin",
		"bucket":   "s3://private/secret.bin",
		"redirect": own.URL + "/to/" + other.port() + "/secret.bin",
	}
	files := map[string][]byte{"data.bin": data}
	for name, target := range hostile {
		os.WriteFile(filepath.Join(refs, name+".json"), refSet(target), 0o644)
		files[name+".json"] = refSet(target)
	}
	srv.UploadFiles(t, "refs", "", files)
	// The rule's words for each kind of target.
	want := func(served, name string) string {
		switch {
		case name == "redirect" && served != "http":
			return "is outside"
		case name == "redirect":
			return "redirected to another host"
		case name == "dotdot" && served != "local":
			return "leaves the store root" // a path of the reference set's own host or bucket
		case name == "host" || name == "bucket":
			return "(--ref-allow)"
		case served == "local":
			return "is outside the reference set's folder " + refs + " (--ref-base)"
		}
		return "it reads no local file (--ref-base)"
	}
	for _, served := range []string{"local", "http", "s3"} {
		for name := range hostile {
			src := map[string]string{"local": filepath.Join(refs, name+".json"), "http": own.URL + "/" + name + ".json",
				"s3": "s3://refs/" + name + ".json"}[served]
			for _, follow := range []bool{false, true} {
				var args []string
				if served == "s3" {
					args = append(args, s3...)
				}
				if follow {
					args = append(args, "--follow-symlinks")
				}
				code, stderr, got := warmedA(t, src, args...)
				if code != 1 || got != nil || !strings.Contains(stderr, want(served, name)) || strings.Contains(stderr, "symbolic link") {
					t.Errorf("%s %s (follow %v): exit %d, a.npy %q:\n%s\nwant exit 1, nothing filled and %q", served, name, follow, code, got, stderr, want(served, name))
				}
			}
		}
	}
	if r := other.requests(); len(r) != 0 {
		t.Errorf("the other host received %q", r)
	}
	bucketsMu.Lock()
	if len(privateReqs) != 0 {
		t.Errorf("the private bucket received %q", privateReqs)
	}
	bucketsMu.Unlock()

	// What the user names is read, and nothing beyond it.
	os.WriteFile(filepath.Join(refs, "ok.json"), refSet("data.bin"), 0o644)
	os.WriteFile(filepath.Join(refs, "pub.json"), refSet(other.URL+"/pub/x.bin"), 0o644)
	for _, tc := range []struct {
		name, src string
		args      []string
		want      []byte
	}{
		{"own folder", filepath.Join(refs, "ok.json"), nil, data},
		{"own host, with the token", own.URL + "/ok.json", nil, data},
		{"--ref-base", filepath.Join(refs, "secret.json"), []string{"--ref-base", secret}, private},
		{"--ref-allow a host", own.URL + "/host.json", []string{"--ref-allow", other.URL + "/"}, private},
		{"--ref-allow a path", own.URL + "/pub.json", []string{"--ref-allow", other.URL + "/pub/"}, public},
		{"--ref-allow a bucket", "s3://refs/bucket.json", append([]string{"--ref-allow", "s3://private/"}, s3...), private},
		{"--ref-allow a folder", filepath.Join(refs, "secret.json"), []string{"--ref-allow", secret}, private},
		{"--http-redirects any", own.URL + "/redirect.json", []string{"--http-redirects", "any"}, private},
	} {
		code, stderr, got := warmedA(t, tc.src, tc.args...)
		if code != 0 || !bytes.Equal(got, tc.want) {
			t.Errorf("%s: exit %d, %d bytes equal %v:\n%s", tc.name, code, len(got), bytes.Equal(got, tc.want), stderr)
		}
	}
	bucketsMu.Lock()
	if len(privateReqs) == 0 {
		t.Error("the proxy saw no request of the private bucket even when it was allowed: the check above proves nothing")
	}
	bucketsMu.Unlock()
	if len(other.requests()) == 0 {
		t.Error("the other host saw no request even when it was allowed: the check above proves nothing")
	}
	for _, r := range other.requests() {
		if !strings.HasSuffix(r, "auth=") {
			t.Errorf("the other host received the token: %q", r)
		}
	}
	var sawToken bool
	for _, r := range own.requests() {
		sawToken = sawToken || strings.HasSuffix(r, "auth=Bearer "+token)
	}
	if !sawToken {
		t.Error("the source's own host never received the token")
	}
	// An allowed path reaches nothing beside it.
	os.WriteFile(filepath.Join(refs, "beside.json"), refSet(other.URL+"/secret.bin"), 0o644)
	if code, stderr, got := warmedA(t, filepath.Join(refs, "beside.json"), "--ref-allow", other.URL+"/pub/"); code != 1 || got != nil ||
		!strings.Contains(stderr, "is outside --ref-allow "+other.URL+"/pub/") {
		t.Errorf("a target beside the allowed path: exit %d, %q:\n%s", code, got, stderr)
	}
	// Bad places are usage errors.
	for _, a := range []string{"ftp://x/", "s3://", filepath.Join(root, "nope"), "https://u:p@h/"} {
		if _, stderr, code := run(t, "warm", filepath.Join(refs, "ok.json"), "--cache", t.TempDir(), "--ref-allow", a); code != 2 ||
			!strings.Contains(stderr, "--ref-allow") || strings.Count(strings.TrimSpace(stderr), "\n") != 0 {
			t.Errorf("--ref-allow %s: exit %d, %q; want 2 and one line", a, code, stderr)
		}
	}
}

// A reference set in S3 whose targets are in S3 reads byte for byte under
// every --chunk-versions mode, its own bucket by default and another one
// named by --ref-allow.
func TestReferenceS3Targets(t *testing.T) {
	requireMountTools(t)
	srv := miniotest.Start(t)
	s3Env(t, srv)
	bucket, data := srv.NewBucket(t), make([]byte, 64)
	rand.Read(data)
	other := srv.NewBucket(t)
	srv.UploadFiles(t, other, "", map[string][]byte{"d/x.bin": data})
	srv.UploadFiles(t, bucket, "", map[string][]byte{
		"nc/data.bin":   data,
		"relative.json": refSet("nc/data.bin"),
		"absolute.json": refSet(fmt.Sprintf("s3://%s/nc/data.bin", bucket)),
		"other.json":    refSet(fmt.Sprintf("s3://%s/d/x.bin", other)),
	})
	for _, mode := range []string{"object", "metadata"} {
		for _, name := range []string{"relative", "absolute", "other"} {
			args := []string{"--s3-endpoint", srv.Endpoint, "--chunk-versions", mode}
			if name == "other" {
				args = append(args, "--ref-allow", "s3://"+other+"/d/")
			}
			code, stderr, got := warmedA(t, "s3://"+bucket+"/"+name+".json", args...)
			if code != 0 || !bytes.Equal(got, data) {
				t.Errorf("%s, --chunk-versions %s: exit %d, bytes equal %v:\n%s", name, mode, code, bytes.Equal(got, data), stderr)
			}
		}
	}
}
