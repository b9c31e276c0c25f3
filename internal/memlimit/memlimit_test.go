package memlimit

import (
	"errors"
	"math"
	"strings"
	"testing"
)

func TestParseBytes(t *testing.T) {
	for _, c := range []struct {
		in   string
		want int64
	}{
		{"0", 0}, {"-1", -1}, {"1500000", 1500000}, {"4GiB", 4 << 30}, {"4G", 4 << 30}, {"4gb", 4 << 30},
		{"512MiB", 512 << 20}, {"1.5K", 1536}, {" 2T ", 2 << 40},
	} {
		got, err := ParseBytes(c.in)
		if err != nil || got != c.want {
			t.Errorf("ParseBytes(%q) = %d, %v; want %d", c.in, got, err, c.want)
		}
	}
	for _, bad := range []string{"", "x", "-2", "4X", "GiB", "1e400", "NaN", "99999999P", "0.9", "1e-9", "0.5B"} {
		if _, err := ParseBytes(bad); err == nil {
			t.Errorf("ParseBytes(%q) accepted", bad)
		}
	}
}

func TestCheck(t *testing.T) {
	if err := Check("pools", 100, 100); err != nil {
		t.Fatal(err)
	}
	err := Check("page pools", 3<<30, 1<<30)
	if !errors.Is(err, ErrTooLarge) || !strings.Contains(err.Error(), "3.0 GiB") || !strings.Contains(err.Error(), "1.0 GiB") {
		t.Fatalf("got %v", err)
	}
	// NoLimit: any size this machine could hold passes; one beyond its
	// RAM plus swap is refused (its allocation could only crash).
	if err := Check("x", 1<<20, NoLimit); err != nil {
		t.Fatal(err)
	}
	if err := Check("x", math.MaxInt64, NoLimit); !errors.Is(err, ErrTooLarge) || !strings.Contains(err.Error(), "even with no memory limit") {
		t.Fatalf("8 EiB with no limit: %v", err)
	}
	if err := Check("x", -1, NoLimit); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("overflowed size accepted: %v", err)
	}
	if err := Check("x", 1, -7); err == nil {
		t.Fatal("limit -7 accepted")
	}
	// Auto: a petabyte never fits this machine; a byte always does.
	if err := Check("x", 1<<50, Auto); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("1 PiB fits? %v", err)
	}
	if err := Check("x", 1, Auto); err != nil {
		t.Fatal(err)
	}
	// A limit above the machine's memory does not let a petabyte through.
	if err := Check("x", 1<<50, 1<<60); !errors.Is(err, ErrTooLarge) || !strings.Contains(err.Error(), "available now") {
		t.Fatalf("limit above the machine: %v", err)
	}
	// Sizes that round to the same text say their bytes.
	if err := Check("x", 2300000000, 2299999999); err == nil || !strings.Contains(err.Error(), "(2300000000 bytes)") {
		t.Fatalf("rounded sizes: %v", err)
	}
}

func TestMulAdd(t *testing.T) {
	if Mul(1<<20, 1<<20, 1<<20) != 1<<60 || Mul(1<<32, 1<<32) != -1 || Mul(3, -1) != -1 {
		t.Fatal("Mul")
	}
	if Add(1, 2, 3) != 6 || Add(math.MaxInt64, 1) != -1 || Add(1, -1) != -1 {
		t.Fatal("Add")
	}
}

func TestParseMeminfo(t *testing.T) {
	got, err := parseMeminfo([]byte("MemTotal: 100 kB\nMemFree: 5 kB\nMemAvailable:   2048 kB\n"))
	if err != nil || got != 2048*1024 {
		t.Fatalf("%d %v", got, err)
	}
	if _, err := parseMeminfo([]byte("MemTotal: 1 kB\n")); err == nil {
		t.Fatal("no MemAvailable accepted")
	}
}

func TestParseTotal(t *testing.T) {
	got, err := parseTotal([]byte("MemTotal: 100 kB\nMemAvailable: 5 kB\nSwapTotal:  28 kB\n"))
	if err != nil || got != 128*1024 {
		t.Fatalf("%d %v", got, err)
	}
	if got, err := parseTotal([]byte("MemTotal: 100 kB\n")); err != nil || got != 100*1024 {
		t.Fatalf("no swap line: %d %v", got, err)
	}
	for _, bad := range []string{"SwapTotal: 1 kB\n", "MemTotal: x kB\n", "MemTotal: -1 kB\n", "MemTotal: 9223372036854775807 kB\n"} {
		if _, err := parseTotal([]byte(bad)); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

func TestParseVmSize(t *testing.T) {
	if got, ok := parseVmSize([]byte("Name: x\nVmPeak: 9 kB\nVmSize:\t 2048 kB\n")); !ok || got != 2048*1024 {
		t.Fatalf("%d %v", got, ok)
	}
	if _, ok := parseVmSize([]byte("Name: x\n")); ok {
		t.Fatal("no VmSize accepted")
	}
}

func TestBytes(t *testing.T) {
	for n, want := range map[int64]string{0: "0 B", 1023: "1023 B", 1536: "1.5 KiB", 6 << 30: "6.0 GiB"} {
		if got := Bytes(n); got != want {
			t.Errorf("Bytes(%d) = %q, want %q", n, got, want)
		}
	}
}
