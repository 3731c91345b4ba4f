package codec

// SSE2 unshuffles (shuffle_amd64.s). Each interleaves groups of 16 elements
// (8 for typesize 8) whose byte planes lie stride bytes apart; the caller
// guarantees that every plane has groups*16 (or *8) readable bytes and dst
// room for all the elements.
const haveUnshuffleAsm = true

//go:noescape
func unshuffle2SSE2(dst, src *byte, stride, groups int)

//go:noescape
func unshuffle4SSE2(dst, src *byte, stride, groups int)

//go:noescape
func unshuffle8SSE2(dst, src *byte, stride, groups int)

// The same with non-temporal stores (shuffle_amd64.s); dst 16-byte aligned.

//go:noescape
func unshuffle2NT(dst, src *byte, stride, groups int)

//go:noescape
func unshuffle4NT(dst, src *byte, stride, groups int)

//go:noescape
func unshuffle8NT(dst, src *byte, stride, groups int)
