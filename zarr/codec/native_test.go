package codec

import (
	"bytes"
	"errors"
	"os"
	"testing"
)

// skipWithout skips a test of the native library lib, which this machine
// does not use (err says why), or fails it where env is set (CI, which has
// the library).
func skipWithout(t testing.TB, lib, env string, err error) {
	t.Helper()
	if os.Getenv(env) != "" {
		t.Fatalf("%s expected (%s), not used: %v", lib, env, err)
	}
	t.Skipf("%s not used on this machine: %v", lib, err)
}

// guarded runs decode into the first n bytes of a buffer followed by a
// guard, and checks that it wrote nothing past them and failed, if it
// did, with an error wrapping ErrCorrupt.
func guarded(t *testing.T, who string, n int, decode func(dst []byte) error) ([]byte, error) {
	t.Helper()
	buf := bytes.Repeat([]byte{0x5a}, n+16)
	err := decode(buf[:n])
	if err != nil && !errors.Is(err, ErrCorrupt) {
		t.Fatalf("%s: error does not wrap ErrCorrupt: %v", who, err)
	}
	for i, c := range buf[n:] {
		if c != 0x5a {
			t.Fatalf("%s: wrote past dst at +%d", who, i)
		}
	}
	return buf[:n], err
}

// agreeOn decodes n bytes with the Go decoder and with the native library
// (guarded) and fails the test if both accept with different bytes, or if
// want is set and either accepts with other bytes. It returns the native
// library's verdict.
func agreeOn(t *testing.T, what string, n int, want []byte, goDecode, native func(dst []byte) error) error {
	t.Helper()
	g, gerr := guarded(t, what+", Go decoder", n, goDecode)
	c, cerr := guarded(t, what+", native library", n, native)
	if gerr == nil && cerr == nil && !bytes.Equal(g, c) {
		t.Fatalf("%s: the decoders accept it with different bytes", what)
	}
	if want != nil {
		if gerr == nil && !bytes.Equal(g, want) {
			t.Fatalf("%s: the Go decoder accepts it with wrong bytes", what)
		}
		if cerr == nil && !bytes.Equal(c, want) {
			t.Fatalf("%s: the native library accepts it with wrong bytes", what)
		}
	}
	return cerr
}
