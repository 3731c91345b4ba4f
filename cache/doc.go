// Package cache is zarrfs's byte-bounded, persistent, crash-safe cache on
// local disk: one budget, two tiers. The blob tier holds decoded .npy blobs
// as plain files laid out like the mount's tree (Dir/blobs/<layout>/<path>),
// so a mount passes reads through to them and GPUDirect Storage reads them
// directly; the chunk tier holds compressed source chunks of remote stores
// (Dir/chunks/ab/<hash>). The cache knows nothing of what the bytes mean.
//
// # On disk
//
//	Dir/lock          OFD lock: every open Cache holds it shared; recovery
//	                  and journal compaction hold it exclusive
//	Dir/journal       the index: one checksummed line per add or delete
//	Dir/blobs/...     complete blobs, never rewritten in place
//	Dir/chunks/...    complete chunks
//	Dir/tmp/<id>/     fills in progress of the live instance <id>, which
//	                  holds Dir/tmp/<id>.lock for its lifetime
//
// # Permissions
//
// A cache directory belongs to one user: Open refuses one owned by another
// uid, creates everything owner-only (0700/0600) whatever the umask, and
// tightens what is wider; blobs are read-only (0400), so that a write
// through a direct mode link cannot change one. Options.BlobMode and
// BlobGroup open the decoded blobs alone, and the directories leading to them, to a group or to all,
// for readers that open blob files themselves (access.go).
//
// # Crash safety
//
// A fill writes a temp file under Dir/tmp/<id>, the cache checks its size,
// records its checksum (checksum.go), appends an add record to the journal and hard-links
// the file into place. A file at a final path is therefore always complete
// as far as any process can see; a kill leaves
// at worst a temp file (removed by the next Open in any process, since its
// owner's lock is gone) or a record whose link never happened (forgotten on
// first use or at recovery). Deletion appends its record before the unlink.
// Open, when no other instance is running, verifies size and checksum of
// every entry added by an instance that did not shut down cleanly since the
// journal was last compacted, removes leftovers of interrupted deletions,
// and compacts the journal. Nothing is fsynced while a reader waits: an
// instance's entries become trusted only when it compacts the journal or
// closes cleanly, and it syncs the filesystem (syncfs) first, so after a
// power loss the untrusted ones are verified and those whose bytes never
// reached the disk are dropped. After a clean Close there is nothing to verify
// and a restart is one read of the journal: 0.17 s for 100,000 blobs on a
// loaded two-core machine, half what merely walking and stat'ing the same
// tree takes (BenchmarkOpen).
//
// # Identity: stable paths, replaceable contents
//
// A blob's path (Dir/blobs/<layout>/<path>) is what direct mode links to
// and what `zarrfs warm` and `zarrfs path` print, so it depends only on
// what a source's tree looks like, never on data that may change under it.
// What the bytes were built from (the identities of the source chunks
// read, see package layout) is the key's Identity, recorded in the
// blob's journal line next to its checksum. GetBlob serves an indexed blob
// only when the recorded identity is the one asked for; otherwise the blob
// is stale and the fill replaces it: the new file is renamed over the old
// one, so the path never names a missing or partial file and a reader
// that has the old version open keeps reading it. The record of the
// replacement goes first, as for any add: a kill between record and
// rename leaves the old bytes under the new record, which recovery's
// checksum rejects.
//
// Equal identities in one layout directory name equal bytes, so a blob
// asked for under a new path with the identity of one the directory holds
// (the samples of a store that grew past a power of ten are renamed from
// 7.npy to 07.npy) is hard-linked there instead of filled.
//
// A caller that learns a blob's identity only by filling it (the versions
// of the chunks come with the responses that fetch them) gives GetBlob a
// learn function for a path the index does not hold (Holds): the blob is
// published under the identity learn names after the fill, and GetBlob of
// the same path with a known identity waits for such a fill rather than
// run one of its own.
//
// What the caller knows it will not read again (Blobs lists a directory's
// paths and identities) it can Demote, to be evicted before anything else, or
// RemoveBlob now; `zarrfs cache gc` does the latter.
//
// # Budget and eviction
//
// Entries are kept in one LRU list ordered by use, with exact byte counts
// (see evictLocked for why not ristretto). A fill reserves its size before
// it writes and evicts least recently used entries until indexed plus
// reserved bytes fit the budget, so the directory stays within the budget
// unless pinned entries alone exceed it; the excess goes when the pins do.
// Eviction deletes the file. Without an explicit budget, the budget is what
// the cache's filesystem can hold (entries plus free space at Open, less
// headroom for the journal), counted in filesystem blocks.
//
// # A full filesystem
//
// A blob larger than the filesystem fails before it is filled; one that
// fits only after evicting gets the room first. A fill, a chunk or a
// journal record that still meets ENOSPC (something else filled the disk)
// makes room by evicting least recently used entries and tries again, for
// as long as the room can be found, whoever made it (concurrent fills
// evict too): it fails with ENOSPC only when nothing is left to evict. An
// eviction whose deletion record cannot be written unlinks the file anyway:
// an indexed entry without its file is forgotten on first use and at
// recovery, so nothing wrong is ever served. Recovery and compaction make
// room the same way, and when nothing can go, recovery keeps the journal as
// it is rather than fail.
//
// # Concurrency
//
// All methods of Cache are safe for concurrent use. Concurrent GetBlob (or
// GetChunk) calls for one key share one fill. A Handle pins its blob: while
// it is open, no Cache in any process evicts or unlinks the file (each
// Handle holds flock LOCK_SH on its descriptor; an evictor needs LOCK_EX).
// Several processes (a running mount and `zarrfs warm`) may open one Dir at
// once: files appear only by atomic link, every instance appends to the one
// journal and reads the others' records before it looks up a missing key or
// evicts, so they share one index and one budget (each may overshoot by the
// fills the others have in flight). A Handle's methods are safe for
// concurrent use; Close once.
package cache
