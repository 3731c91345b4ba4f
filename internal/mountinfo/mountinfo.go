// Package mountinfo reads the mount table of /proc/self/mountinfo.
package mountinfo

import (
	"os"
	"strconv"
	"strings"
)

// Entry is one mount: where, what filesystem type, from what source, and
// the superblock options (for FUSE, user_id= names the mounting uid).
type Entry struct {
	Mountpoint, FSType, Source string
	Options                    []string
}

// Option returns the value of a superblock option key=value.
func (e Entry) Option(key string) (string, bool) {
	for _, o := range e.Options {
		if v, ok := strings.CutPrefix(o, key+"="); ok {
			return v, true
		}
	}
	return "", false
}

// Read returns this process's mounts in the table's order: where mounts
// stack, the last is on top.
func Read() ([]Entry, error) {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	var out []Entry
	for _, line := range strings.Split(string(b), "\n") {
		if e, ok := Parse(line); ok {
			out = append(out, e)
		}
	}
	return out, nil
}

// Parse reads one line of the table.
func Parse(line string) (Entry, bool) {
	pre, post, found := strings.Cut(line, " - ")
	f, g := strings.Fields(pre), strings.Fields(post)
	if !found || len(f) < 5 || len(g) < 2 {
		return Entry{}, false
	}
	e := Entry{Mountpoint: unescape(f[4]), FSType: g[0], Source: unescape(g[1])}
	if len(g) > 2 {
		e.Options = strings.Split(g[2], ",")
	}
	return e, true
}

// unescape undoes the kernel's octal escapes (\040 for a space).
func unescape(s string) string {
	if !strings.Contains(s, "\\") {
		return s
	}
	var sb strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+4 <= len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				sb.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		sb.WriteByte(s[i])
	}
	return sb.String()
}

// Containing returns the mount that holds path (absolute and clean, links
// resolved): the one with the longest mountpoint that is path or a folder
// above it, the last in the table where mounts stack.
func Containing(mounts []Entry, path string) (Entry, bool) {
	var found Entry
	best := -1
	for _, e := range mounts {
		mp := e.Mountpoint
		under := path == mp || mp == "/" || strings.HasPrefix(path, strings.TrimSuffix(mp, "/")+"/")
		if under && len(mp) >= best {
			found, best = e, len(mp)
		}
	}
	return found, best >= 0
}
