package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"

	"github.com/zarrfs/zarrfs/objectstore"
	"github.com/zarrfs/zarrfs/objectstore/icechunk"
	"github.com/zarrfs/zarrfs/objectstore/kerchunk"
	"github.com/zarrfs/zarrfs/objectstore/targets"
)

// virtualFlags are the flags of virtual stores (kerchunk reference sets,
// Icechunk repositories).
type virtualFlags struct {
	ref      string
	refBase  string
	refAllow []string
	// refGiven: --ref was on the command line, which says the source is
	// an Icechunk repository (a remote prefix is read as one only then).
	refGiven bool
}

func (f *virtualFlags) register(cmd *cobra.Command) {
	cmd.Flags().StringVar(&f.ref, "ref", "main", "Icechunk repositories: the branch, tag or snapshot id to read")
	cmd.Flags().StringVar(&f.refBase, "ref-base", "", "virtual stores: the folder or URL that relative target URLs resolve against, and where targets may be read from instead of the reference set's own place (its folder, an Icechunk repository's root, a remote one's bucket or host)")
	cmd.Flags().StringSliceVar(&f.refAllow, "ref-allow", nil, "virtual stores: more folders and URL prefixes (s3://BUCKET/, gs://BUCKET/PATH/, https://HOST/PATH/) the targets of a reference set may be read from, with the credentials of these flags; comma-separated or repeated")
}

// validate checks --ref-base and --ref-allow once, before anything is
// opened: a usage error names the flag.
func (f *virtualFlags) validate() error {
	for i, a := range f.refAllow {
		p, err := place(a)
		if err != nil {
			return usagef("--ref-allow %s: %v", a, err)
		}
		f.refAllow[i] = p
	}
	if f.refBase != "" && isURL(f.refBase) {
		if _, err := place(f.refBase); err != nil {
			return usagef("--ref-base %s: %v", f.refBase, err)
		}
	}
	return nil
}

// allowsS3 reports whether --ref-allow names a bucket: the S3 flags then
// mean something for any source, whose targets may lie there.
func (f *virtualFlags) allowsS3() bool { return f.allows("s3") }

// allows reports whether --ref-allow names a place of scheme s (its
// aliases too).
func (f *virtualFlags) allows(s string) bool {
	for _, a := range f.refAllow {
		if sc := urlScheme(a); sc == s || schemeAliases[sc] == s {
			return true
		}
	}
	return false
}

// checkPlain refuses the virtual store flags for a source that opened as
// a plain store: they would do nothing, and the user who gave them
// believes the source is a reference set or a repository.
func (f *virtualFlags) checkPlain(cmd *cobra.Command, src string) error {
	if cmd == nil {
		return nil
	}
	for _, name := range []string{"ref", "ref-base", "ref-allow"} {
		if fl := cmd.Flags().Lookup(name); fl != nil && fl.Changed {
			return usagef("--%s: %s is a plain Zarr store, not a kerchunk reference set or an Icechunk repository, which --%s applies to", name, src, name)
		}
	}
	return nil
}

// place checks a folder or URL prefix the user allows targets in and
// returns it absolute: a local folder that exists, or a URL of a scheme
// targets are read from, with a host and without credentials or query.
func place(a string) (string, error) {
	if !isURL(a) {
		p, err := filepath.Abs(strings.TrimPrefix(a, "file://"))
		if err != nil {
			return "", err
		}
		if fi, err := os.Stat(p); err != nil || !fi.IsDir() {
			return "", fmt.Errorf("%s: no such folder", p)
		}
		return p, nil
	}
	s := urlScheme(a)
	if alias, ok := schemeAliases[s]; ok {
		a, s = alias+a[len(s):], alias
	}
	switch s {
	case "s3", "gs", "http", "https":
	default:
		return "", fmt.Errorf("targets are not read from %s:// URLs (want s3, gs, http or https)", s)
	}
	u, err := url.Parse(a)
	switch {
	case err != nil:
		return "", errors.New("not a valid URL")
	case u.Host == "":
		return "", errors.New("no bucket or host")
	case u.User != nil:
		return "", fmt.Errorf("a URL must not hold credentials (%s)", credentialsHint(s))
	case u.RawQuery != "" || u.Fragment != "":
		return "", errors.New("a URL must have no query or fragment")
	}
	return a, nil
}

// credentialsHint says where the credentials of a scheme come from.
func credentialsHint(scheme string) string {
	switch scheme {
	case "s3":
		return "S3 credentials come from the AWS credential chain"
	case "gs":
		return "GCS credentials come from Application Default Credentials"
	}
	return "give the bearer token in " + bearerTokenEnv + " instead"
}

// isURL reports whether s is a URL other than a file:// one.
func isURL(s string) bool {
	sc := urlScheme(s)
	return sc != "" && sc != "file"
}

// remoteOpeners opens the root of each kind of remote store a virtual
// store's targets may lie in, by URL scheme: one line per kind. Only
// roots the Scope allows are opened (targets.Resolver).
func (f *sourceFlags) remoteOpeners() targets.Openers {
	return targets.Openers{
		"s3":    func(ctx context.Context, root string) (objectstore.Store, error) { return openS3(ctx, root, f) },
		"gs":    func(ctx context.Context, root string) (objectstore.Store, error) { return openGCS(ctx, root, f) },
		"http":  func(ctx context.Context, root string) (objectstore.Store, error) { return openHTTP(ctx, root, f) },
		"https": func(ctx context.Context, root string) (objectstore.Store, error) { return openHTTP(ctx, root, f) },
	}
}

// schemeAliases are fsspec's other spellings of the schemes above.
var schemeAliases = map[string]string{"s3a": "s3", "gcs": "gs"}

// openVirtual opens src as a virtual store when it is one: "reference://"
// followed by a path or URL (a kerchunk reference set), a ".json"
// reference file, a local folder holding a Parquet reference set or an
// Icechunk repository, or a remote one the command line names
// (openRemoteVirtual). ok is false for any other source, which opens as a
// plain store.
func (f *sourceFlags) openVirtual(ctx context.Context, src string) (st objectstore.Store, ok bool, err error) {
	if f.source == "" {
		f.source = src
	}
	rest, explicit := strings.CutPrefix(src, "reference://")
	if explicit {
		src = rest
		if src == "" {
			return nil, true, usagef("reference://: no reference set named")
		}
	}
	if s := urlScheme(src); s != "" && s != "file" {
		return f.openRemoteVirtual(ctx, src, explicit)
	}
	p := strings.TrimPrefix(src, "file://")
	fi, err := os.Stat(p)
	if err != nil {
		// A missing ".json" is a missing reference file, not a missing
		// store directory.
		isJSON := strings.HasSuffix(p, ".json")
		if abs, aerr := filepath.Abs(p); aerr == nil && errors.Is(err, fs.ErrNotExist) && (explicit || isJSON) {
			if isJSON {
				return nil, true, fmt.Errorf("%s: no such file", abs)
			}
			return nil, true, fmt.Errorf("%s: no such file or directory", abs)
		}
		if explicit {
			return nil, true, fmt.Errorf("%s: %w", src, err)
		}
		return nil, false, nil // the plain store reports it
	}
	// The folder to open, and the reference file in it ("" when the
	// folder is the reference set or repository itself).
	folder, name, repo := p, "", false
	switch {
	case fi.Mode().IsRegular() && (explicit || strings.HasSuffix(p, ".json")):
		folder, name = filepath.Dir(p), filepath.Base(p)
	case fi.IsDir() && !explicit && isIcechunkDir(p):
		repo = true
	case fi.IsDir() && isParquetRefs(filepath.Join(p, ".zmetadata")):
	case explicit && fi.IsDir():
		return nil, true, fmt.Errorf("%s: not a Parquet reference folder (no .zmetadata with a record_size)", src)
	case explicit:
		return nil, true, fmt.Errorf("%s: not a reference file or folder", src)
	default:
		return nil, false, nil
	}
	abs, err := filepath.Abs(folder)
	if err != nil {
		return nil, true, err
	}
	dir, err := objectstore.OpenPosixOptions(abs, objectstore.PosixOptions{FollowSymlinks: f.follow})
	if err != nil {
		return nil, true, err
	}
	// Relative targets resolve against the folder holding the reference
	// set: a JSON file's own, the one above a Parquet folder (as fsspec
	// resolves them) or a repository. Targets may lie in the reference
	// set's own folder (a Parquet set's, a repository's root) only.
	base := abs
	if name == "" {
		base = filepath.Dir(abs)
	}
	home := targets.Place{Prefix: abs, Name: "the reference set's folder"}
	if repo {
		home.Name = "the repository"
		st, err = f.openIcechunk(ctx, dir, base, home)
	} else {
		st, err = f.openKerchunk(ctx, dir, name, base, home)
	}
	return st, true, err
}

// openRemoteVirtual opens a virtual store held by a remote store, from
// what the command line says it is, with no request to find out: a key
// ending in ".json" is a kerchunk JSON reference set, reference://URL of a
// prefix is a Parquet reference folder, and a prefix with --ref is an
// Icechunk repository. Any other remote source is a plain store (ok
// false): probing it would cost requests (a listing among them) before
// every mount of a plain store, which at archive scale must be live from
// its consolidated metadata alone.
func (f *sourceFlags) openRemoteVirtual(ctx context.Context, src string, explicit bool) (objectstore.Store, bool, error) {
	scheme := urlScheme(src)
	open, known := f.remoteOpeners()[scheme]
	if !known {
		if explicit {
			return nil, true, usagef("%s: %s:// sources are not read", src, scheme)
		}
		return nil, false, nil
	}
	trimmed := src
	if i := strings.Index(src, "://"); strings.Contains(src[i+3:], "/") {
		trimmed = strings.TrimRight(src, "/") // the prefix, not the scheme's slashes
	}
	parent, name := path.Split(trimmed)
	parent = strings.TrimSuffix(parent, "/")
	if strings.HasSuffix(parent, ":/") {
		parent = trimmed // a bucket's root: nothing above it
	}
	virtual := strings.HasSuffix(trimmed, ".json") || explicit || f.virtual.refGiven
	if !virtual {
		return nil, false, nil
	}
	home, err := remoteHome(src)
	if err != nil {
		return nil, true, usagef("%s: %v", src, err)
	}
	switch {
	case strings.HasSuffix(trimmed, ".json"):
		dir, err := open(ctx, parent)
		if err != nil {
			return nil, true, err
		}
		st, err := f.openKerchunk(ctx, dir, name, parent, home)
		return st, true, err
	case explicit:
		// Relative targets of a Parquet folder are relative to the folder
		// that holds it, as fsspec resolves them.
		dir, err := open(ctx, trimmed)
		if err != nil {
			return nil, true, err
		}
		st, err := f.openKerchunk(ctx, dir, "", parent, home)
		return st, true, err
	case f.virtual.refGiven:
		repo, err := open(ctx, trimmed)
		if err != nil {
			return nil, true, err
		}
		st, err := f.openIcechunk(ctx, repo, parent, home)
		return st, true, err
	}
	return nil, false, nil
}

// remoteHome is where the targets of a remote virtual store may lie by
// default: its own bucket (s3, gs) or its own scheme, host and port.
func remoteHome(src string) (targets.Place, error) {
	s := urlScheme(src)
	if alias, ok := schemeAliases[s]; ok {
		src, s = alias+src[len(s):], alias
	}
	u, err := url.Parse(src)
	if err != nil || u.Host == "" {
		return targets.Place{}, errors.New("not a URL with a bucket or host")
	}
	if s == "s3" || s == "gs" {
		return targets.Place{Prefix: s + "://" + u.Host + "/", Name: "the reference set's bucket"}, nil
	}
	return targets.Place{Prefix: s + "://" + u.Host + "/", Name: "the reference set's host"}, nil
}

// openKerchunk opens the reference set at key name of dir ("" for a
// Parquet folder), whose relative URLs resolve against base (a local
// folder or a URL) and whose targets lie in home, unless --ref-base says
// otherwise.
func (f *sourceFlags) openKerchunk(ctx context.Context, dir objectstore.Store, name, base string, home targets.Place) (objectstore.Store, error) {
	tg, err := f.targetResolver(base, home)
	if err != nil {
		closeStore(dir)
		return nil, err
	}
	st, err := kerchunk.Open(ctx, dir, name, kerchunk.Options{Targets: tg})
	if err != nil {
		tg.Close()
		closeStore(dir)
		return nil, err
	}
	return st, nil
}

// targetResolver resolves the targets of a virtual store: relative URLs
// against --ref-base, else base; and, the one rule of what a reference
// set reaches, only targets in --ref-base, else in home (the reference
// set's own folder, repository, bucket or host), or in a place --ref-allow
// names. The reference set's author names the targets; only the user names
// the places. --follow-symlinks lets links found inside a local place lead
// out of it, never a target's own path.
func (f *sourceFlags) targetResolver(base string, home targets.Place) (*targets.Resolver, error) {
	opts := targets.Options{Openers: f.remoteOpeners(), Aliases: schemeAliases, Base: base,
		FollowSymlinks: f.follow,
		Scope:          targets.Scope{LocalHint: "--ref-base", RemoteHint: "--ref-allow"}}
	if rb := f.virtual.refBase; rb != "" {
		if !isURL(rb) {
			p, err := place(rb)
			if err != nil {
				return nil, usagef("--ref-base %s: %v", rb, err)
			}
			rb = p
		}
		opts.Base = rb
		home = targets.Place{Prefix: rb, Name: "--ref-base"}
	}
	opts.Scope.Places = append(opts.Scope.Places, home)
	for _, a := range f.virtual.refAllow {
		opts.Scope.Places = append(opts.Scope.Places, targets.Place{Prefix: a, Name: "--ref-allow"})
	}
	return targets.New(opts)
}

// urlScheme is the lower-case scheme of a URL, "" for a path.
func urlScheme(s string) string {
	i := strings.Index(s, "://")
	if i <= 0 {
		return ""
	}
	return strings.ToLower(s[:i])
}

func isParquetRefs(p string) bool {
	fi, err := os.Stat(p)
	if err != nil || !fi.Mode().IsRegular() || fi.Size() > 1<<30 {
		return false
	}
	b, err := os.ReadFile(p)
	return err == nil && hasRecordSize(b)
}

// hasRecordSize tells fsspec's Parquet .zmetadata from consolidated Zarr
// metadata: it names a record_size.
func hasRecordSize(doc []byte) bool {
	var m map[string]json.RawMessage
	if json.Unmarshal(doc, &m) != nil {
		return false
	}
	_, ok := m["record_size"]
	return ok
}

// openIcechunk opens the Icechunk repository at repo's root at --ref.
// Its virtual chunks are read only from places the user authorized, as
// icechunk requires of its readers: --ref-base, else the repository's own
// root (local) or bucket or host (remote), and --ref-allow.
func (f *sourceFlags) openIcechunk(ctx context.Context, repo objectstore.Store, base string, home targets.Place) (objectstore.Store, error) {
	tg, err := f.targetResolver(base, home)
	if err != nil {
		closeStore(repo)
		return nil, err
	}
	st, err := icechunk.Open(ctx, repo, icechunk.Options{Ref: f.virtual.ref, Targets: tg})
	if err != nil {
		tg.Close()
		closeStore(repo)
		return nil, err
	}
	return st, nil
}

// isIcechunkDir reports whether a local folder holds an Icechunk
// repository: a repo info file (spec 2) or refs and snapshots (spec 1).
func isIcechunkDir(p string) bool {
	if fi, err := os.Stat(filepath.Join(p, "repo")); err == nil && fi.Mode().IsRegular() {
		return true
	}
	a, err1 := os.Stat(filepath.Join(p, "refs"))
	b, err2 := os.Stat(filepath.Join(p, "snapshots"))
	return err1 == nil && err2 == nil && a.IsDir() && b.IsDir()
}
