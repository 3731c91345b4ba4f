package gpu

import (
	"testing"
	"time"
	"unsafe"
)

// waitArenas waits until the pool has n arenas (registration runs in the
// background).
func waitArenas(t *testing.T, p *hostPool, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for p.stats().Arenas < n {
		if time.Now().After(deadline) {
			t.Fatalf("%d arenas after 10s, want %d", p.stats().Arenas, n)
		}
		time.Sleep(time.Millisecond)
	}
}

// A limit under one arena still lends: the pool maps what the limit
// allows, in whole units.
func TestHostPoolUnderOneArena(t *testing.T) {
	d := &Decoder{}
	const unit = 8 << 20
	d.host.unit = unit
	d.host.limit = unit/2 + hostUnit/2
	d.host.idle = time.Hour
	d.host.start()
	defer d.releaseHost()
	waitArenas(t, &d.host, 1)
	if st := d.host.stats(); st.Mapped != unit/2 {
		t.Errorf("mapped %d bytes under a limit of %d, want %d", st.Mapped, d.host.limit, unit/2)
	}
	if b := d.HostAlloc(1 << 20); !d.pinned(b) {
		t.Error("a pool under one arena lent no pinned memory")
	}
}

// TestHostPool checks the lending bookkeeping of HostAlloc without a GPU:
// a Decoder with no context maps arenas but registers nothing.
func TestHostPool(t *testing.T) {
	d := &Decoder{}
	var unpinned int
	const unit = 8 << 20
	d.host.unit = unit
	d.host.limit = unit
	d.host.idle = time.Hour
	d.host.unregister = func([]byte) { unpinned++ }
	if b := d.HostAlloc(10); d.pinned(b) {
		t.Fatal("a pool not started lent pinned memory")
	}
	d.host.start()
	waitArenas(t, &d.host, 1)
	a := d.HostAlloc(1000)
	b := d.HostAlloc(1 << 20)
	if len(a) != 1000 || len(b) != 1<<20 || cap(a) != hostUnit {
		t.Fatalf("lengths %d, %d, cap %d", len(a), len(b), cap(a))
	}
	if !d.pinned(a) || !d.pinned(b[100:200]) || !d.pinned(a[:cap(a)]) {
		t.Error("lent memory not recognised")
	}
	if d.pinned(make([]byte, 10)) || d.pinned(nil) {
		t.Error("memory outside the pool taken for pinned")
	}
	a[0], a[999] = 1, 2 // writable
	// Past the room and the bound: ordinary memory, and no growth past
	// the limit.
	c := d.HostAlloc(unit)
	if d.pinned(c) || len(c) != unit {
		t.Errorf("allocation past the room: pinned %v, len %d", d.pinned(c), len(c))
	}
	// Counted, with the one before the pool started; not those it lent.
	if m := d.Pinned().Missed; m != 10+unit {
		t.Errorf("lent unpinned: %d bytes counted, want %d", m, 10+unit)
	}
	time.Sleep(20 * time.Millisecond)
	if st := d.host.stats(); st.Arenas != 1 || st.Mapped > d.host.limit {
		t.Errorf("pool grew past its limit: %+v", st)
	}
	// A buffer held besides is lent again only once both gave it back.
	if !d.Retain(a) || d.Retain(c) || d.Retain(nil) {
		t.Error("Retain: its own buffer not held, or another's held")
	}
	d.HostFree(a)
	if st := d.host.stats(); st.Lent != int64(cap(a)+cap(b)) {
		t.Errorf("a buffer still held went back: %+v", st)
	}
	// A freed buffer is coalesced and serves the next request.
	d.HostFree(a)
	d.HostFree(a) // twice: ignored
	d.HostFree(c) // not lent: ignored
	d.HostFree(b)
	if st := d.host.stats(); st.Lent != 0 || len(d.host.arenas[0].free) != 1 {
		t.Errorf("after freeing everything: %+v, free spans %v", st, d.host.arenas[0].free)
	}
	a2 := d.HostAlloc(2000)
	if &a2[0] != &a[0] {
		t.Error("freed memory was not reused first fit")
	}
	big := d.HostAlloc(unit - hostUnit)
	if !d.pinned(big) || uintptr(unsafe.Pointer(&big[0])) != uintptr(unsafe.Pointer(&a2[0]))+hostUnit {
		t.Error("the rest of the arena was not lent in one piece")
	}
	// Close gives back what is not lent, keeps what is.
	d.HostFree(big)
	d.releaseHost()
	if !d.pinned(a2) || d.host.stats().Arenas != 1 {
		t.Error("releaseHost: an arena with a lent buffer must stay")
	}
	a2[0] = 3
	d.HostFree(a2)
	if b := d.HostAlloc(100); d.pinned(b) {
		t.Error("a closed pool lent pinned memory")
	}
}

// An idle pool gives its arenas back, and grows again on demand.
func TestHostPoolIdle(t *testing.T) {
	d := &Decoder{}
	d.host.unit = 8 << 20
	d.host.limit = 16 << 20
	d.host.idle = 50 * time.Millisecond
	d.host.start()
	defer d.releaseHost()
	waitArenas(t, &d.host, 1)
	b := d.HostAlloc(1 << 20)
	time.Sleep(200 * time.Millisecond)
	if st := d.host.stats(); st.Arenas != 1 {
		t.Fatalf("an arena with a lent buffer was given back: %+v", st)
	}
	d.HostFree(b)
	deadline := time.Now().Add(5 * time.Second)
	for d.host.stats().Mapped != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("idle pool still holds %+v", d.host.stats())
		}
		time.Sleep(10 * time.Millisecond)
	}
	if b := d.HostAlloc(100); d.pinned(b) {
		t.Error("pinned memory lent before an arena was registered again")
	}
	waitArenas(t, &d.host, 1)
	if b := d.HostAlloc(100); !d.pinned(b) {
		t.Error("the pool did not grow again on demand")
	}
}

// With onDemand the pool registers nothing until asked; TryHostAlloc then
// returns nil (not heap memory) until an arena is registered.
func TestHostPoolOnDemand(t *testing.T) {
	d := &Decoder{}
	const unit = 8 << 20
	d.host.unit, d.host.limit, d.host.idle, d.host.onDemand = unit, 4*unit, time.Hour, true
	d.host.start()
	defer d.releaseHost()
	time.Sleep(50 * time.Millisecond)
	if st := d.host.stats(); st.Mapped != 0 || st.Arenas != 0 {
		t.Fatalf("an on-demand pool mapped %d bytes before any request", st.Mapped)
	}
	if b := d.TryHostAlloc(1 << 20); b != nil {
		t.Fatal("TryHostAlloc lent memory with no arena registered")
	}
	waitArenas(t, &d.host, 1) // the request started one
	b := d.TryHostAlloc(1 << 20)
	if b == nil || !d.pinned(b) {
		t.Fatal("TryHostAlloc after the arena came: no pinned memory")
	}
	d.HostFree(b)
}

// A large staging buffer is an anonymous mapping registered with the
// driver (mapStaging), freed by unregistering and unmapping it; where the
// driver refuses the registration it is the driver's own allocation; a
// small one always is.
func TestStagingMapped(t *testing.T) {
	for _, refuse := range []bool{false, true} {
		f := newFakeGPU()
		l := f.libs()
		if refuse {
			l.cu.cuMemHostRegister = func(unsafe.Pointer, uint64, uint32) cuResult { return cuErrInvalidValue }
		}
		d, err := open(l, pipelineOptions())
		if err != nil {
			t.Fatal(err)
		}
		var big, small hostBuf
		if err := d.growHost(&big, 32<<20); err != nil {
			t.Fatal(err)
		}
		if err := d.growHost(&small, 1<<20); err != nil {
			t.Fatal(err)
		}
		f.mu.Lock()
		_, inHost := f.host[uintptr(big.p)]
		_, registered := f.registered[uintptr(big.p)]
		_, smallInHost := f.host[uintptr(small.p)]
		f.mu.Unlock()
		if big.mapped == refuse || registered == refuse || inHost != refuse || small.mapped || !smallInHost {
			t.Errorf("refused %v: big mapped %v, registered %v, driver's %v; small mapped %v, driver's %v",
				refuse, big.mapped, registered, inHost, small.mapped, smallInHost)
		}
		// The bytes are usable whichever way they came.
		b := big.bytes()
		b[0], b[len(b)-1] = 1, 2
		held, sizes := d.stagingHeld.Load(), big.size+small.size
		d.freeHost(&big)
		d.freeHost(&small)
		if got := d.stagingHeld.Load(); got != held-sizes || big.p != nil || small.p != nil {
			t.Errorf("staging held %d after freeing %d of %d", got, sizes, held)
		}
		f.mu.Lock()
		_, stillRegistered := f.registered[uintptr(unsafe.Pointer(&b[0]))]
		f.mu.Unlock()
		if stillRegistered {
			t.Error("freed staging still registered")
		}
		d.Close()
		for _, s := range f.Faults() {
			t.Error("fake GPU: " + s)
		}
	}
}

// HostReserve maps what it is asked for, within the limit, before it
// returns (registration runs in the background), and the memory is lent.
func TestHostReserve(t *testing.T) {
	d := &Decoder{}
	const unit = 8 << 20
	d.host.unit = unit
	d.host.limit = 3 * unit
	d.host.idle = time.Hour
	d.host.onDemand = true
	d.host.start()
	defer d.releaseHost()
	if st := d.host.stats(); st.Mapped != 0 {
		t.Fatalf("an on-demand pool mapped %d bytes before any request", st.Mapped)
	}
	d.HostReserve(2*unit+1, 10*time.Second)
	if st := d.host.stats(); st.Mapped < 2*unit+1 || d.host.growing {
		t.Fatalf("after HostReserve(%d): %d bytes mapped, growing %v", 2*unit+1, st.Mapped, d.host.growing)
	}
	b := d.HostAlloc(2 * unit)
	if !d.pinned(b) {
		t.Fatal("the reserved memory is not lent")
	}
	d.HostReserve(10*unit, 10*time.Second) // past the limit: up to it
	if st := d.host.stats(); st.Mapped != 3*unit {
		t.Fatalf("reserving past the limit mapped %d bytes, want the limit %d", st.Mapped, 3*unit)
	}
}

// HostTrim keeps a buffer's first bytes lent, in whole units, and lends
// the rest again at once; a buffer held by another too, or not the
// pool's, keeps its tail.
func TestHostTrim(t *testing.T) {
	d := &Decoder{}
	const unit = 8 << 20
	d.host.unit = unit
	d.host.limit = unit
	d.host.idle = time.Hour
	d.host.start()
	defer d.releaseHost()
	waitArenas(t, &d.host, 1)
	b := d.HostAlloc(4 << 20)
	kept := d.HostTrim(b, hostUnit+1)
	if len(kept) != hostUnit+1 || cap(kept) != hostUnit+1 || &kept[0] != &b[0] {
		t.Fatalf("trimmed to len %d cap %d", len(kept), cap(kept))
	}
	if lent := d.HostLent(); lent != 2*hostUnit {
		t.Fatalf("%d bytes lent after the trim, want the two units kept", lent)
	}
	// The tail is lent again: the next buffer starts where the kept units end.
	c := d.HostAlloc(1 << 20)
	if got := uintptr(unsafe.Pointer(&c[0])) - uintptr(unsafe.Pointer(&b[0])); got != 2*hostUnit {
		t.Fatalf("the next buffer lies %d bytes after the trimmed one, want %d", got, 2*hostUnit)
	}
	// Held twice: the tail stays.
	if !d.Retain(c) {
		t.Fatal("Retain refused a lent buffer")
	}
	if got := d.HostTrim(c, 10); len(got) != 10 || d.HostLent() != 2*hostUnit+1<<20 {
		t.Fatalf("a buffer held twice was trimmed: %d bytes lent", d.HostLent())
	}
	d.HostFree(c)
	d.HostFree(c)
	// Not the pool's: as it is.
	if got := d.HostTrim(make([]byte, 100), 10); len(got) != 10 {
		t.Fatalf("foreign memory trimmed to %d", len(got))
	}
	d.HostFree(kept)
	if lent := d.HostLent(); lent != 0 {
		t.Fatalf("%d bytes lent once every buffer is back", lent)
	}
	if a := d.host.arenas[0]; len(a.free) != 1 || a.free[0].n != unit {
		t.Fatalf("free spans %v once every buffer is back, want the arena whole", a.free)
	}
	// The most lent at once: the 4 MiB buffer before its trim (then the
	// kept units and the 1 MiB one never came near it).
	if p := d.Pinned(); p.Lent != 0 || p.LentPeak != 4<<20 || p.Pool != unit {
		t.Fatalf("Pinned %+v, want nothing lent, a peak of %d, a pool of %d", p, 4<<20, unit)
	}
	e := d.HostAlloc(unit - hostUnit) // past the peak: it moves
	if p := d.Pinned(); p.Lent != unit-hostUnit || p.LentPeak != unit-hostUnit {
		t.Fatalf("Pinned %+v with %d lent", p, unit-hostUnit)
	}
	d.HostFree(e)
}
