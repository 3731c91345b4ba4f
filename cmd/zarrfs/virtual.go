package main

import (
	"context"
	"encoding/json"
	"fmt"
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
	ref     string
	refBase string
	// refGiven: --ref was on the command line, which says the source is
	// an Icechunk repository (a remote prefix is read as one only then).
	refGiven bool
}

func (f *virtualFlags) register(cmd *cobra.Command) {
	cmd.Flags().StringVar(&f.ref, "ref", "main", "Icechunk repositories: the branch, tag or snapshot id to read")
	cmd.Flags().StringVar(&f.refBase, "ref-base", "", "virtual stores: the folder or URL relative target URLs are resolved against, and the folder local targets may be read from (default: the folder holding the reference set)")
}

// remoteOpeners opens the root of each kind of remote store a virtual
// store's targets may lie in, by URL scheme: one line per kind.
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
	// resolves them) or a repository.
	base := abs
	if name == "" {
		base = filepath.Dir(abs)
	}
	if repo {
		st, err = f.openIcechunk(ctx, dir, base)
	} else {
		st, err = f.openKerchunk(ctx, dir, name, base)
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
	switch {
	case strings.HasSuffix(trimmed, ".json"):
		dir, err := open(ctx, parent)
		if err != nil {
			return nil, true, err
		}
		st, err := f.openKerchunk(ctx, dir, name, parent)
		return st, true, err
	case explicit:
		// Relative targets of a Parquet folder are relative to the folder
		// that holds it, as fsspec resolves them.
		dir, err := open(ctx, trimmed)
		if err != nil {
			return nil, true, err
		}
		st, err := f.openKerchunk(ctx, dir, "", parent)
		return st, true, err
	case f.virtual.refGiven:
		repo, err := open(ctx, trimmed)
		if err != nil {
			return nil, true, err
		}
		st, err := f.openIcechunk(ctx, repo, parent)
		return st, true, err
	}
	return nil, false, nil
}

// openKerchunk opens the reference set at key name of dir ("" for a
// Parquet folder), whose relative URLs resolve against base (a local
// folder or a URL) unless --ref-base says otherwise.
func (f *sourceFlags) openKerchunk(ctx context.Context, dir objectstore.Store, name, base string) (objectstore.Store, error) {
	tg, err := f.targetResolver(base)
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

// targetResolver resolves the targets of a virtual store found at base:
// relative URLs against --ref-base (else base); local files only inside
// --ref-base when it is a local folder, else inside base when that is
// local, and nowhere for a remote virtual store; anywhere with
// --follow-symlinks.
func (f *sourceFlags) targetResolver(base string) (*targets.Resolver, error) {
	opts := targets.Options{Openers: f.remoteOpeners(), Aliases: schemeAliases, Base: base,
		FollowSymlinks: f.follow}
	if f.virtual.refBase != "" {
		opts.Base = f.virtual.refBase
	}
	if s := urlScheme(opts.Base); s == "" || s == "file" {
		local := strings.TrimPrefix(opts.Base, "file://")
		if fi, err := os.Stat(local); err != nil || !fi.IsDir() {
			if f.virtual.refBase != "" {
				return nil, usagef("--ref-base %s: not a folder", f.virtual.refBase)
			}
		}
		opts.LocalRoot = local
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

// openIcechunk opens the Icechunk repository at repo's root at --ref;
// its virtual chunks' local targets may lie in --ref-base, else in the
// folder holding the repository (base) when that is local.
func (f *sourceFlags) openIcechunk(ctx context.Context, repo objectstore.Store, base string) (objectstore.Store, error) {
	tg, err := f.targetResolver(base)
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
