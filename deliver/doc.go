// Package deliver puts a sample directory's samples straight into the
// memory of a reader's process: a ring of slots, one allocation that the
// daemon and the reader share (CUDA IPC on a GPU, a memfd in the test
// mode), filled batch by batch on the reader's request. It owns "a sample
// into a ring slot": the protocol on the mount's delivery socket, the
// ring's lifecycle (one per connection, freed when the connection closes),
// and the choice per sample between the device path (chunks decoded
// straight into the slot, nothing written to the cache) and the host path
// (the sample's blob opened through the cache, as a read of the mount
// would, and its bytes copied into the slot). docs/design.md §13 has the
// promises; docs/python.md the reader's side.
//
// The protocol is newline-delimited JSON on a Unix stream socket. The
// first request opens the ring (OpenRequest); the reply describes it
// (openReply) and, for host memory, carries the memfd as SCM_RIGHTS.
// Then each fill request names a slot and the sample files to put in it,
// and its reply says the slot is ready or why not, naming the file. A
// reader asks to refill a slot only once its consumer is done with it; on
// a GPU it first records the slot's consumer event, which the daemon's copies
// into the slot wait for, so a slot is never overwritten while the
// trainer's kernels still read it.
//
// Every sample comes out byte for byte as the mount's file would: the
// device path is taken only where it decodes every byte of the sample,
// and any sample it does not (a codec the device may not take alone, a
// cast, a chunk missing, a device failure) goes through the host path,
// whose error, if any, is the answer.
//
// Concurrency: a Server serves any number of connections; each fills its
// slots concurrently, one goroutine per fill request, and a slot's
// requests are serialized by the reader. Closing a connection cancels its
// fills and frees its ring once they have returned.
package deliver
