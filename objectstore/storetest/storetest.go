// Package storetest is the conformance suite every objectstore.Store must
// pass: whole reads, byte ranges (suffix and out of range included), the
// not-found class kept apart from every other failure, listings, refusal of
// keys that leave the store, cancellation and concurrent use.
//
// Run calls newStore from many subtests, possibly in parallel; each call
// must return a fresh store holding exactly the given files.
package storetest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"

	"github.com/zarrfs/zarrfs/objectstore"
)

// Files returns the fixture the suite uses: nested "directories", an empty
// object, odd names, and objects large enough that ranges matter.
func Files() map[string][]byte {
	rng := rand.New(rand.NewPCG(1, 2))
	big := make([]byte, 300_000)
	for i := range big {
		big[i] = byte(rng.Uint32())
	}
	seq := make([]byte, 1000)
	for i := range seq {
		seq[i] = byte(i % 251)
	}
	return map[string][]byte{
		"zarr.json":          []byte(`{"zarr_format":3,"node_type":"group"}`),
		"a/zarr.json":        []byte(`{"zarr_format":3,"node_type":"array"}`),
		"a/c/0/0":            seq,
		"a/c/0/1":            []byte("chunk 0/1"),
		"a/c/1/0":            []byte("chunk 1/0"),
		"b/deep/er/x":        []byte("x"),
		"empty":              {},
		"big":                big,
		"dots.in.name":       []byte("dots"),
		"with space and-_~=": []byte("odd name"),
	}
}

// Options adapt the suite to what a kind of store cannot do.
type Options struct {
	// NoListing: the store cannot list (a web server). Every List and
	// ListVersions must then fail with objectstore.ErrNoListing, a
	// permanent error that is never not-found, and versions are checked
	// read against read (StatVersion, GetVersion, GetRangeVersion).
	NoListing bool
}

// Run runs the suite. newStore builds a store holding the given files.
func Run(t *testing.T, newStore func(t *testing.T, files map[string][]byte) objectstore.Store) {
	RunWith(t, Options{}, newStore)
}

// RunWith runs the suite with options.
func RunWith(t *testing.T, o Options, newStore func(t *testing.T, files map[string][]byte) objectstore.Store) {
	files := Files()
	s := newStore(t, files)
	ctx := context.Background()

	runReads(t, ctx, s, files)
	runRanges(t, ctx, s, files, o)
	runListing(t, ctx, s, files, o)
	t.Run("Versions", func(t *testing.T) { runVersions(t, s, files, o) })
	runConcurrent(t, ctx, s, files, o)
}

// runReads checks the whole-object reads.
func runReads(t *testing.T, ctx context.Context, s objectstore.Store, files map[string][]byte) {
	t.Run("ID", func(t *testing.T) {
		if s.ID() == "" {
			t.Fatal("empty ID")
		}
	})

	t.Run("Get", func(t *testing.T) {
		for _, k := range sortedKeys(files) {
			got, err := s.Get(ctx, k)
			if err != nil {
				t.Errorf("Get(%q): %v", k, err)
				continue
			}
			if !bytes.Equal(got, files[k]) {
				t.Errorf("Get(%q): %d bytes, want %d (content differs)", k, len(got), len(files[k]))
			}
		}
	})

	t.Run("SizeLimit", func(t *testing.T) {
		// An object larger than the request's limit is refused, not read;
		// one within it is read as usual. Ranges are sized by the caller.
		big := int64(len(files["big"]))
		if b, err := objectstore.GetLimit(ctx, s, "big", big-1); !errors.Is(err, objectstore.ErrTooLarge) || objectstore.IsTransient(err) {
			t.Errorf("GetLimit(big) over the limit: %d bytes, %v; want a permanent ErrTooLarge", len(b), err)
		}
		if gi, ok := s.(objectstore.GetterInto); ok {
			if _, err := gi.GetInto(ctx, "big", nil, big-1); !errors.Is(err, objectstore.ErrTooLarge) {
				t.Errorf("GetInto(big) over the limit: %v", err)
			}
		}
		if v, ok := objectstore.AsVersioned(s); ok {
			if _, _, err := v.GetVersion(ctx, "big", nil, big-1); !errors.Is(err, objectstore.ErrTooLarge) {
				t.Errorf("GetVersion(big) over the limit: %v", err)
			}
		}
		if b, err := objectstore.GetLimit(ctx, s, "big", big); err != nil || int64(len(b)) != big {
			t.Errorf("GetLimit(big) at the limit: %d bytes, %v", len(b), err)
		}
		if b, err := s.GetRange(ctx, "big", 0, big); err != nil || int64(len(b)) != big {
			t.Errorf("GetRange(big) under a smaller limit: %d bytes, %v", len(b), err)
		}
	})

	t.Run("NotFound", func(t *testing.T) {
		for _, k := range []string{"missing", "a/c/9/9", "nodir/x", "a", "a/c", "a/zarr.json/x"} {
			_, err := s.Get(ctx, k)
			if !objectstore.IsNotFound(err) {
				t.Errorf("Get(%q): err = %v, want ErrNotFound", k, err)
				continue
			}
			checkError(t, err, k)
			if objectstore.IsTransient(err) || objectstore.IsPermission(err) {
				t.Errorf("Get(%q): not-found error also classed transient or permission: %v", k, err)
			}
			if _, err := s.GetRange(ctx, k, 0, 1); !objectstore.IsNotFound(err) {
				t.Errorf("GetRange(%q): err = %v, want ErrNotFound", k, err)
			}
			if _, err := s.GetRange(ctx, k, -1, 1); !objectstore.IsNotFound(err) {
				t.Errorf("GetRange(%q, suffix): err = %v, want ErrNotFound", k, err)
			}
		}
	})
}

// runRanges checks the range reads.
func runRanges(t *testing.T, ctx context.Context, s objectstore.Store, files map[string][]byte, o Options) {
	t.Run("GetRange", func(t *testing.T) {
		big, seq := files["big"], files["a/c/0/0"]
		n := int64(len(big))
		tests := []struct {
			name        string
			key         string
			off, length int64
			want        []byte
		}{
			{"head", "big", 0, 10, big[:10]},
			{"middle", "big", 1234, 50_000, big[1234:51234]},
			{"tail exact", "big", n - 7, 7, big[n-7:]},
			{"last byte", "big", n - 1, 1, big[n-1:]},
			{"whole", "big", 0, n, big},
			{"suffix", "big", -1, 16, big[n-16:]},
			{"suffix whole", "big", -1, n, big},
			{"suffix small object", "a/c/0/0", -1, 4, seq[len(seq)-4:]},
			{"zero length", "big", 100, 0, []byte{}},
			{"zero length at end", "big", n, 0, []byte{}},
			{"empty object zero length", "empty", 0, 0, []byte{}},
		}
		for _, tc := range tests {
			t.Run(tc.name, func(t *testing.T) {
				got, err := s.GetRange(ctx, tc.key, tc.off, tc.length)
				if err != nil {
					t.Fatalf("GetRange(%q, %d, %d): %v", tc.key, tc.off, tc.length, err)
				}
				if !bytes.Equal(got, tc.want) {
					t.Fatalf("GetRange(%q, %d, %d): %d bytes, want %d (content differs)", tc.key, tc.off, tc.length, len(got), len(tc.want))
				}
			})
		}
	})

	t.Run("RangeOutOfBounds", func(t *testing.T) {
		n := int64(len(files["big"]))
		tests := []struct {
			name        string
			key         string
			off, length int64
		}{
			{"runs past end", "big", n - 5, 10},
			{"starts past end", "big", n + 10, 5},
			{"starts at end", "big", n, 1},
			{"suffix longer than object", "a/c/0/1", -1, 100},
			{"negative length", "big", 0, -1},
			{"empty object", "empty", 0, 1},
			{"zero length past end", "big", n + 1, 0},
		}
		for _, tc := range tests {
			t.Run(tc.name, func(t *testing.T) {
				got, err := s.GetRange(ctx, tc.key, tc.off, tc.length)
				if err == nil {
					t.Fatalf("GetRange(%q, %d, %d) = %d bytes, want an error", tc.key, tc.off, tc.length, len(got))
				}
				if objectstore.IsNotFound(err) || objectstore.IsTransient(err) {
					t.Fatalf("GetRange(%q, %d, %d): %v: must be neither not-found nor transient", tc.key, tc.off, tc.length, err)
				}
				if tc.length >= 0 && !errors.Is(err, objectstore.ErrRange) {
					t.Errorf("GetRange(%q, %d, %d): %v: a range past the end must wrap ErrRange", tc.key, tc.off, tc.length, err)
				}
				checkError(t, err, tc.key)
			})
		}
	})
}

// runListing checks the listing, bad keys and cancelled calls.
func runListing(t *testing.T, ctx context.Context, s objectstore.Store, files map[string][]byte, o Options) {
	t.Run("List", func(t *testing.T) {
		if o.NoListing {
			for _, p := range []string{"", "a", "a/c", "missing"} {
				got, err := s.List(ctx, p)
				if !errors.Is(err, objectstore.ErrNoListing) || objectstore.IsNotFound(err) || objectstore.IsTransient(err) {
					t.Errorf("List(%q) = %q, %v; want a permanent ErrNoListing", p, got, err)
				} else if p != "" {
					checkError(t, err, p)
				}
			}
			if _, err := s.List(ctx, "//a"); !errors.Is(err, objectstore.ErrInvalidKey) {
				t.Errorf("List(//a): %v, want ErrInvalidKey", err)
			}
			return
		}
		tests := []struct {
			prefix string
			want   []string
		}{
			{"", []string{"a/", "b/", "big", "dots.in.name", "empty", "with space and-_~=", "zarr.json"}},
			{"//a", nil}, // invalid: absolute
			{"a", []string{"c/", "zarr.json"}},
			{"a/", []string{"c/", "zarr.json"}},
			{"a/c", []string{"0/", "1/"}},
			{"a/c/0", []string{"0", "1"}},
			{"b", []string{"deep/"}},
			{"b/deep/er/", []string{"x"}},
			{"./a", []string{"c/", "zarr.json"}},
		}
		for _, tc := range tests {
			got, err := s.List(ctx, tc.prefix)
			if tc.want == nil {
				if !errors.Is(err, objectstore.ErrInvalidKey) {
					t.Errorf("List(%q) = %q, %v; want ErrInvalidKey", tc.prefix, got, err)
				}
				continue
			}
			if err != nil {
				t.Errorf("List(%q): %v", tc.prefix, err)
				continue
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("List(%q) = %q, want %q", tc.prefix, got, tc.want)
			}
		}
		for _, p := range []string{"missing", "a/missing/", "a/c/9"} {
			if got, err := s.List(ctx, p); !objectstore.IsNotFound(err) {
				t.Errorf("List(%q) = %q, %v; want ErrNotFound", p, got, err)
			}
		}
		if got, err := s.List(ctx, "a/zarr.json"); err == nil {
			t.Errorf("List of an object = %q, want an error", got)
		}
	})

	t.Run("InvalidKeys", func(t *testing.T) {
		for _, k := range []string{"../../etc/passwd", "/etc/passwd", "a/../../x", "..", "a/..", "", "a\\b", "nul\x00byte", "//etc/passwd"} {
			if _, err := s.Get(ctx, k); !errors.Is(err, objectstore.ErrInvalidKey) {
				t.Errorf("Get(%q): err = %v, want ErrInvalidKey", k, err)
			} else if objectstore.IsNotFound(err) || objectstore.IsTransient(err) {
				t.Errorf("Get(%q): invalid-key error also classed as %v", k, err)
			}
			if _, err := s.GetRange(ctx, k, 0, 1); !errors.Is(err, objectstore.ErrInvalidKey) {
				t.Errorf("GetRange(%q): err = %v, want ErrInvalidKey", k, err)
			}
			if k == "" || o.NoListing {
				continue // names the root, which List accepts
			}
			if _, err := s.List(ctx, k); !errors.Is(err, objectstore.ErrInvalidKey) {
				t.Errorf("List(%q): err = %v, want ErrInvalidKey", k, err)
			}
		}
	})

	t.Run("Cancelled", func(t *testing.T) {
		cctx, cancel := context.WithCancel(ctx)
		cancel()
		if _, err := s.Get(cctx, "big"); !errors.Is(err, context.Canceled) {
			t.Errorf("Get with a cancelled context: err = %v, want context.Canceled", err)
		} else if objectstore.IsNotFound(err) || objectstore.IsTransient(err) {
			t.Errorf("cancelled Get classed as not-found or transient: %v", err)
		}
		if _, err := s.GetRange(cctx, "big", 0, 10); !errors.Is(err, context.Canceled) {
			t.Errorf("GetRange with a cancelled context: err = %v, want context.Canceled", err)
		}
		if _, err := s.List(cctx, "a"); !o.NoListing && !errors.Is(err, context.Canceled) {
			t.Errorf("List with a cancelled context: err = %v, want context.Canceled", err)
		}
	})
}

// runConcurrent checks reads from many goroutines at once.
func runConcurrent(t *testing.T, ctx context.Context, s objectstore.Store, files map[string][]byte, o Options) {
	t.Run("Concurrent", func(t *testing.T) {
		keys := sortedKeys(files)
		var wg sync.WaitGroup
		errs := make(chan error, 1000)
		for g := range 16 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				rng := rand.New(rand.NewPCG(uint64(g), 7))
				for range 25 {
					k := keys[rng.IntN(len(keys))]
					want := files[k]
					switch rng.IntN(4) {
					case 0:
						got, err := s.Get(ctx, k)
						if err != nil || !bytes.Equal(got, want) {
							errs <- fmt.Errorf("Get(%q): %d bytes, %v", k, len(got), err)
						}
					case 1:
						if len(want) == 0 {
							continue
						}
						off := rng.Int64N(int64(len(want)))
						n := rng.Int64N(int64(len(want))-off) + 1
						got, err := s.GetRange(ctx, k, off, n)
						if err != nil || !bytes.Equal(got, want[off:off+n]) {
							errs <- fmt.Errorf("GetRange(%q, %d, %d): %d bytes, %v", k, off, n, len(got), err)
						}
					case 2:
						if _, err := s.Get(ctx, k+".missing"); !objectstore.IsNotFound(err) {
							errs <- fmt.Errorf("Get(%q): %v, want not found", k+".missing", err)
						}
					default:
						if o.NoListing {
							got, err := s.GetRange(ctx, "a/c/0/0", -1, 5)
							if err != nil || !bytes.Equal(got, files["a/c/0/0"][995:]) {
								errs <- fmt.Errorf("GetRange(a/c/0/0, suffix): %d bytes, %v", len(got), err)
							}
							continue
						}
						got, err := s.List(ctx, "a/c")
						if err != nil || !slices.Equal(got, []string{"0/", "1/"}) {
							errs <- fmt.Errorf("List(a/c) = %q, %v", got, err)
						}
					}
				}
			}()
		}
		wg.Wait()
		close(errs)
		n := 0
		for err := range errs {
			if n++; n <= 10 {
				t.Error(err)
			}
		}
	})
}

// checkError asserts that err names the store and the key it concerns.
func checkError(t *testing.T, err error, key string) {
	t.Helper()
	var e *objectstore.Error
	if !errors.As(err, &e) {
		t.Errorf("error %v (%T) is not an *objectstore.Error", err, err)
		return
	}
	if e.Store == "" || e.Op == "" {
		t.Errorf("error %v lacks the store or the op", err)
	}
	if c, cerr := objectstore.CleanKey(key, false); cerr == nil && e.Key != c {
		t.Errorf("error %v names key %q, want %q", err, e.Key, c)
	}
}

func sortedKeys(m map[string][]byte) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
