package fs

import (
	"sync"

	gofs "github.com/hanwen/go-fuse/v2/fs"
)

// DefaultMaxInodes bounds the file inodes a mount keeps for the kernel.
const DefaultMaxInodes = 100_000

// inodeCap bounds the memory a mount spends on files the kernel has looked
// up. The kernel keeps every name it looked up (and go-fuse an inode of
// about a kilobyte for it) until it runs short of memory itself, so `ls -l`
// of a directory of a million samples would cost the daemon a gigabyte.
// Past max, the oldest names are invalidated: the kernel drops them and
// forgets their inodes, and looks them up again (from memory, cheaply) if
// it needs them. Invalidations are sent from a goroutine of their own,
// never from inside a FUSE request.
type inodeCap struct {
	max  int
	mu   sync.Mutex
	ring []named // oldest first, from head
	head int
	n    int
	wake chan struct{}
	done chan struct{}
	stop sync.Once // close runs from Unmount and from the server's end at once
}

type named struct {
	parent *gofs.Inode
	name   string
}

func newInodeCap(max int) *inodeCap {
	c := &inodeCap{max: max, ring: make([]named, 0, 1024), wake: make(chan struct{}, 1), done: make(chan struct{})}
	go c.run()
	return c
}

// add records that the kernel looked up name in parent.
func (c *inodeCap) add(parent *gofs.Inode, name string) {
	c.mu.Lock()
	if c.n < len(c.ring) {
		c.ring[(c.head+c.n)%len(c.ring)] = named{parent, name}
	} else {
		// Grow: unroll the ring into a larger slice.
		grown := make([]named, 0, max(2*len(c.ring), 1024))
		for i := range c.n {
			grown = append(grown, c.ring[(c.head+i)%len(c.ring)])
		}
		grown = append(grown, named{parent, name})
		c.ring, c.head = grown[:cap(grown)], 0
	}
	c.n++
	over := c.n > c.max
	c.mu.Unlock()
	if over {
		select {
		case c.wake <- struct{}{}:
		default:
		}
	}
}

// run invalidates the oldest names while more than max are held, down to
// nine tenths of it.
func (c *inodeCap) run() {
	for {
		select {
		case <-c.done:
			return
		case <-c.wake:
		}
		for {
			c.mu.Lock()
			if c.n <= c.max*9/10 {
				c.mu.Unlock()
				break
			}
			e := c.ring[c.head]
			c.ring[c.head] = named{}
			c.head = (c.head + 1) % len(c.ring)
			c.n--
			c.mu.Unlock()
			e.parent.NotifyEntry(e.name) // ENOENT when the kernel dropped it already
		}
	}
}

// held is how many looked-up names are recorded.
func (c *inodeCap) held() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n
}

func (c *inodeCap) close() {
	c.stop.Do(func() { close(c.done) })
}
