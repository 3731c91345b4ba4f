//go:build !amd64

package codec

const haveUnshuffleAsm = false

func unshuffle2SSE2(dst, src *byte, stride, groups int) { panic("unreachable") }
func unshuffle4SSE2(dst, src *byte, stride, groups int) { panic("unreachable") }
func unshuffle8SSE2(dst, src *byte, stride, groups int) { panic("unreachable") }
func unshuffle2NT(dst, src *byte, stride, groups int)   { panic("unreachable") }
func unshuffle4NT(dst, src *byte, stride, groups int)   { panic("unreachable") }
func unshuffle8NT(dst, src *byte, stride, groups int)   { panic("unreachable") }
