package targets

import (
	"errors"
	"fmt"
	"net/url"
	"path"
	"path/filepath"
	"strings"
)

// ErrOutOfScope is returned (wrapped in a *ScopeError) for a target that
// lies outside every place its reference set may read.
var ErrOutOfScope = errors.New("target outside what the reference set may read")

// Scope is the one rule for what a virtual store may reach: its targets
// must lie in one of its Places. A reference set's author names the
// targets; only the user names the places, so a reference set from
// anywhere reads nothing else: no local file outside its folder, no other
// bucket or host with the user's credentials.
//
// The zero Scope allows nothing.
type Scope struct {
	// Places are the folders (absolute local paths) and URL prefixes
	// ("s3://bucket/", "https://host:port/data/") targets may lie in.
	Places []Place
	// LocalHint and RemoteHint say how to allow a refused local or
	// remote target, for errors ("--ref-base", "--ref-allow").
	LocalHint, RemoteHint string
}

// Place is a folder or URL prefix of a Scope.
type Place struct {
	// Prefix is an absolute local folder, or a URL with scheme and host
	// (its path, when it has one, a prefix of the targets' paths).
	Prefix string
	// Name says in errors where Prefix comes from: "the reference set's
	// folder", "--ref-allow".
	Name string
}

// place is a Place parsed: a local folder, or the origin and path prefix
// of a URL.
type place struct {
	Place
	local  string // cleaned absolute folder; "" for a URL prefix
	origin string // scheme://host[:port], default port dropped
	path   string // cleaned path prefix without the trailing "/", "" for all
}

// ScopeError is a target refused by the Scope.
type ScopeError struct {
	Target string // the target, as resolved (redacted)
	Where  string // the places of its kind, for the message
	Hint   string
}

func (e *ScopeError) Error() string {
	msg := "target " + e.Target + " is outside " + e.Where
	if e.Hint != "" {
		msg += " (" + e.Hint + ")"
	}
	return msg
}

func (e *ScopeError) Unwrap() error { return ErrOutOfScope }

func parsePlaces(ps []Place) ([]place, error) {
	out := make([]place, 0, len(ps))
	for _, p := range ps {
		pl := place{Place: p}
		if s := scheme(p.Prefix); s == "" || s == "file" {
			dir := strings.TrimPrefix(p.Prefix, "file://")
			if !filepath.IsAbs(dir) {
				return nil, fmt.Errorf("%s %s: not an absolute folder", p.Name, p.Prefix)
			}
			pl.local = filepath.Clean(dir)
		} else {
			origin, rest, err := splitURL(p.Prefix)
			if err != nil {
				return nil, fmt.Errorf("%s %s: %w", p.Name, redact(p.Prefix), err)
			}
			pl.origin, pl.path = origin, strings.TrimSuffix(rest, "/")
		}
		out = append(out, pl)
	}
	return out, nil
}

// splitURL returns the normalized origin of a URL (lower-case scheme and
// host, no default port) and its cleaned path without the leading "/".
// Credentials, queries and fragments are refused.
func splitURL(raw string) (origin, p string, err error) {
	u, err := url.Parse(raw)
	if err != nil {
		return "", "", errors.New("not a valid URL")
	}
	if u.User != nil {
		return "", "", errors.New("a URL must not hold credentials")
	}
	if u.RawQuery != "" || u.Fragment != "" {
		return "", "", errors.New("a URL must have no query or fragment")
	}
	host := strings.ToLower(u.Host)
	if host == "" {
		return "", "", errors.New("no host")
	}
	s := strings.ToLower(u.Scheme)
	if port := u.Port(); (s == "https" && port == "443") || (s == "http" && port == "80") {
		host = strings.TrimSuffix(host, ":"+port)
	}
	p = strings.TrimPrefix(u.Path, "/")
	if p != "" {
		p = path.Clean(p)
		if p == "." {
			p = ""
		}
	}
	return s + "://" + host, p, nil
}

// within reports whether the cleaned path p lies at or below prefix.
func within(p, prefix string) bool {
	return prefix == "" || p == prefix || strings.HasPrefix(p, prefix+"/")
}

// localPlace returns the folder of the scope that holds the local file p
// (absolute and clean).
func (r *Resolver) localPlace(p string) (string, error) {
	var names []string
	for _, pl := range r.places {
		if pl.local == "" {
			continue
		}
		if rel, err := filepath.Rel(pl.local, p); err == nil && rel != "." && rel != ".." && !strings.HasPrefix(rel, "../") {
			return pl.local, nil
		}
		names = append(names, pl.Name+" "+pl.local)
	}
	return "", r.refuse(p, names, "no local file", r.opts.Scope.LocalHint)
}

// checkRemote refuses a remote target (origin and cleaned key) that lies in
// no URL prefix of the scope.
func (r *Resolver) checkRemote(abs, origin, key string) error {
	var names []string
	for _, pl := range r.places {
		if pl.local != "" {
			continue
		}
		if pl.origin == origin && within(key, pl.path) {
			return nil
		}
		names = append(names, pl.Name+" "+pl.Prefix)
	}
	return r.refuse(redact(abs), names, "no remote object", r.opts.Scope.RemoteHint)
}

func (r *Resolver) refuse(target string, names []string, none, hint string) error {
	where := strings.Join(names, " and ")
	if where == "" {
		where = "what this reference set may read: it reads " + none
	}
	return &ScopeError{Target: target, Where: where, Hint: hint}
}

// IsOutOfScope reports whether err is a target refused by the Scope.
func IsOutOfScope(err error) bool { return errors.Is(err, ErrOutOfScope) }
