package layout

import (
	"strings"
	"testing"

	"github.com/zarrfs/zarrfs/internal/testenv"
	"github.com/zarrfs/zarrfs/zarr"
)

func TestParseOutputDType(t *testing.T) {
	for _, tt := range []struct {
		in   string
		want zarr.DType
		ok   bool
	}{
		{"float32", f32, true}, {"float16", zarr.DType{Kind: 'f', Size: 2}, true}, {"<f8", zarr.DType{Kind: 'f', Size: 8}, true},
		{"f4", f32, true}, {"|u1", u8, true}, {"bool", zarr.DType{Kind: 'b', Size: 1}, true},
		{">f4", zarr.DType{}, false}, {"complex64", zarr.DType{}, false}, {"f3", zarr.DType{}, false}, {"", zarr.DType{}, false},
	} {
		got, err := ParseOutputDType(tt.in)
		if (err == nil) != tt.ok || (tt.ok && got != tt.want) {
			t.Errorf("ParseOutputDType(%q) = %+v, %v", tt.in, got, err)
		}
	}
}

// Without python3 the tests that need it skip, or fail under CI.
func TestRequirePythonUnderCI(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	for ci, want := range map[string]string{"": "skip: ", "true": "fail: "} {
		t.Setenv("CI", ci)
		if got := testenv.Outcome(func(t testing.TB) { testenv.Python(t, "numpy") }); !strings.HasPrefix(got, want) {
			t.Errorf("CI=%q: requirePython without python3: %s, want %s...", ci, got, want)
		}
	}
}
