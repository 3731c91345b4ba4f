package cache

import "testing"

func TestParseSize(t *testing.T) {
	tests := []struct {
		in   string
		want int64
		bad  bool
	}{
		{in: "0", want: 0},
		{in: "4096", want: 4096},
		{in: "9223372036854775807", want: 1<<63 - 1},
		{in: "200KiB", want: 200 << 10},
		{in: "200kib", want: 200 << 10},
		{in: "500GiB", want: 500 << 30},
		{in: "500 GiB", want: 500 << 30},
		{in: " 2TiB ", want: 2 << 40},
		{in: "10G", want: 10 << 30},
		{in: "10Gi", want: 10 << 30},
		{in: "1.5TB", want: 1_500_000_000_000},
		{in: "1.5KiB", want: 1536},
		{in: "2MB", want: 2_000_000},
		{in: "3k", want: 3072},
		{in: "7B", want: 7},
		{in: "1PiB", want: 1 << 50},
		{in: "", bad: true},
		{in: "GiB", bad: true},
		{in: "-1", bad: true},
		{in: "-1GiB", bad: true},
		{in: "12 parsecs", bad: true},
		{in: "1.2.3G", bad: true},
		{in: "9223372036854775808", bad: true},
		{in: "8192PiB", bad: true},
		{in: "NaN", bad: true},
		{in: "1e3", bad: true},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := ParseSize(tt.in)
			if tt.bad {
				if err == nil {
					t.Fatalf("ParseSize(%q) = %d, want an error", tt.in, got)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("ParseSize(%q) = %d, %v; want %d", tt.in, got, err, tt.want)
			}
		})
	}
}
