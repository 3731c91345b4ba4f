"""The reader's side of a mount's delivery socket: a ring of slots shared with
the daemon, which decodes samples into them (docs/design.md §13).

On a GPU the ring is one device allocation of the daemon, opened here with
cuIpcOpenMemHandle (ctypes on libcuda.so.1, in torch's context) and wrapped
as tensors through ``__cuda_array_interface__``; each slot has an
interprocess event the daemon records once the slot is written, and a
consumer event of the loader's, recorded when the loader lets go of the
slot (``release``), before it is asked for again: the daemon's writes into
the slot wait for the trainer's kernels that read it, and for no others. In the test mode
(``zarrfs mount --delivery host``) the ring is a memfd the daemon passes
over the socket, mapped here as CPU tensors.

The protocol is newline-delimited JSON; deliver/proto.go in the Go module
is its reference.
"""

from __future__ import annotations

import array
import ctypes
import hashlib
import heapq
import json
import mmap
import os
import socket
import threading
import weakref
from typing import Any, Dict, List, Optional, Set, Tuple

import numpy as np

# Error codes of the daemon's replies.
UNAVAILABLE = "unavailable"

# The longest request line the daemon reads, its newline included: it
# answers a longer one with an error and closes the connection
# (deliver.MaxRequest).
MAX_LINE = 1 << 20


class DeliveryUnavailable(RuntimeError):
    """The mount cannot put samples into this process's memory (it decodes
    on no GPU, on another GPU, or delivers nothing); read its files instead.
    ``full``: it refused the ring for room alone (its --gpu-memory, or its
    rings' share of --memory, cannot hold the ring now); fewer slots may fit."""

    def __init__(self, msg: str, full: bool = False) -> None:
        super().__init__(msg)
        self.full = full


class DeliveryError(RuntimeError):
    """The delivery socket failed: the daemon went away, or stopped answering."""


class RingLost(DeliveryError):
    """The daemon lost the ring (a GPU context it rebuilt after a device
    error freed it); the daemon lives, and a new ring may be opened."""


# The reply code of a fill into a lost ring.
RING_LOST = "ring_lost"


def registry_dir() -> str:
    """The registry folder of this user's mounts: where a mount's sockets are
    (cmd/zarrfs registryDirs' first, which depends on the user only)."""
    uid = os.geteuid()
    if uid == 0:
        return "/run/zarrfs/mounts"
    run = f"/run/user/{uid}"
    try:
        st = os.stat(run)
        if os.path.isdir(run) and st.st_uid == uid:
            return os.path.join(run, "zarrfs", "mounts")
    except OSError:
        pass
    return os.path.join("/tmp", f"zarrfs-{uid}", "mounts")


def socket_path(mountpoint: str) -> str:
    """The delivery socket of the mount at mountpoint (its registry record's
    name, a hash of the resolved mountpoint, with .ring.sock)."""
    mp = os.path.realpath(mountpoint)
    h = hashlib.sha256(mp.encode()).hexdigest()[:16]
    return os.path.join(registry_dir(), h + ".ring.sock")


def _cuda() -> ctypes.CDLL:
    lib = ctypes.CDLL("libcuda.so.1")
    lib.cuIpcOpenMemHandle_v2.argtypes = [ctypes.POINTER(ctypes.c_uint64), _IpcHandle, ctypes.c_uint]
    lib.cuIpcCloseMemHandle.argtypes = [ctypes.c_uint64]
    lib.cuDeviceGet.argtypes = [ctypes.POINTER(ctypes.c_int), ctypes.c_int]
    lib.cuDeviceGetPCIBusId.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.c_int]
    lib.cuGetErrorName.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]
    return lib


class _IpcHandle(ctypes.Structure):
    _fields_ = [("reserved", ctypes.c_char * 64)]


def _check(lib: ctypes.CDLL, what: str, r: int) -> None:
    if r != 0:
        name = ctypes.c_char_p()
        lib.cuGetErrorName(r, ctypes.byref(name))
        raise DeliveryError(f"{what}: {(name.value or b'CUDA error').decode()} ({r})")


def pci_bus_id(index: int) -> str:
    """The PCI bus id of CUDA device index of this process (its numbering,
    after CUDA_VISIBLE_DEVICES), which names the same GPU in the daemon."""
    lib = _cuda()
    dev = ctypes.c_int()
    _check(lib, "cuDeviceGet", lib.cuDeviceGet(ctypes.byref(dev), index))
    buf = ctypes.create_string_buffer(64)
    _check(lib, "cuDeviceGetPCIBusId", lib.cuDeviceGetPCIBusId(buf, 64, dev.value))
    return buf.value.decode().lower()


class _DeviceArray:
    """A device pointer as ``__cuda_array_interface__``, for torch.as_tensor
    (zero copy); it holds the ring, so the mapping outlives every tensor."""

    def __init__(self, ptr: int, shape: Tuple[int, ...], typestr: str, owner: Any) -> None:
        self.owner = owner
        # No "stream": the loader orders reads itself (the slot's event).
        self.__cuda_array_interface__ = {"shape": shape, "typestr": typestr, "data": (ptr, False),
                                         "version": 2, "strides": None}


class Ring:
    """One connection to a mount's delivery socket and the ring it opened.

    ``memory`` is "cuda" (device memory of ``device``, a torch.device) or
    "host" (the test mode). Every wait on the socket is bounded by
    ``timeout`` seconds; a daemon that goes away raises DeliveryError, one
    that cannot deliver raises DeliveryUnavailable.
    """

    def __init__(self, sock_path: str, rel_dir: str, memory: str, slots: int, batch: int,
                 device: Any = None, timeout: float = 300.0) -> None:
        self.memory, self.slots, self.batch, self.timeout = memory, slots, batch, timeout
        self.device = device
        self._buf = bytearray()
        self._closed = False
        if not os.path.exists(sock_path):
            raise DeliveryUnavailable(f"no delivery socket {sock_path}: the mount predates delivery, "
                                      "delivers nothing (--delivery off) or belongs to another user")
        req: Dict[str, Any] = {"op": "open", "dir": rel_dir, "memory": memory, "slots": slots, "batch": batch}
        # Per slot: recorded when the loader lets go of the slot (release).
        self.consumers: List[Any] = []
        # Slots with a fill asked for whose reply is not read yet: an epoch
        # dropped with fills under way leaves them to the next, which reads
        # their replies before it asks for those slots again.
        self.owed: Set[int] = set()
        # Held by the one producer reading the replies.
        self.turn = threading.Lock()
        if memory == "cuda":
            req["pci_bus_id"] = pci_bus_id_of(device)
            self.consumers, req["consumer_events"] = _consumer_events(device, slots)
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(min(timeout, 30.0))
        try:
            self.sock.connect(sock_path)
        except OSError as e:
            self.sock.close()
            raise DeliveryUnavailable(f"{sock_path}: {e.strerror or e}") from None
        try:
            self.send(req)
            rep, fds = self._recv(with_fds=True)
        except BaseException:
            self.sock.close()
            raise
        if not rep.get("ok"):
            self.sock.close()
            for fd in fds:
                os.close(fd)
            msg = rep.get("error", "refused")
            if rep.get("code") == UNAVAILABLE:
                raise DeliveryUnavailable(msg, full=bool(rep.get("full")))
            raise DeliveryError(msg)
        self.info = rep
        self.slot_bytes = int(rep["slot_bytes"])
        self.sample_bytes = int(rep["sample_bytes"])
        self.ring_bytes = int(rep["ring_bytes"])
        self.shape = tuple(int(x) for x in rep["shape"])
        self.dtype = np.dtype(rep["dtype"])
        self.events: List[Any] = []
        self.ptr = 0
        self._map: Optional[mmap.mmap] = None
        try:
            if memory == "host":
                if len(fds) != 1:
                    raise DeliveryError(f"open reply with {len(fds)} files, want the ring's memfd")
                self._map = mmap.mmap(fds[0], self.ring_bytes, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
                self.host = np.frombuffer(self._map, dtype=np.uint8)
            else:
                self._open_cuda(rep)
        except BaseException:
            # The mapping (if opened) goes before the socket, as in close.
            Ring._free(self.sock, self.memory, self.ptr, self.device)
            raise
        finally:
            for fd in fds:
                os.close(fd)
        # Closing waits for nothing: the mapping goes before the socket, so
        # the daemon frees the ring only once this process stopped using it.
        self._finalizer = weakref.finalize(self, Ring._free, self.sock, self.memory, self.ptr, self.device)

    def _open_cuda(self, rep: Dict[str, Any]) -> None:
        """Maps the ring and opens its events; a driver or torch that cannot
        (no CUDA IPC on the platform) raises DeliveryUnavailable, with the
        ring's pointer kept for the caller to close."""
        import torch
        h = _IpcHandle()
        # Into the struct itself: reading a c_char array field returns a copy.
        ctypes.memmove(ctypes.addressof(h), bytes.fromhex(rep["handle"]), 64)
        ptr = ctypes.c_uint64()
        try:
            lib = _cuda()
            with torch.cuda.device(self.device):
                torch.cuda.synchronize(self.device)  # the primary context current on this thread
                lazy = 1  # CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS
                _check(lib, "cuIpcOpenMemHandle", lib.cuIpcOpenMemHandle_v2(ctypes.byref(ptr), h, lazy))
                self.ptr = ptr.value
                self.events = [torch.cuda.Event.from_ipc_handle(self.device, bytes.fromhex(e))  # type: ignore[no-untyped-call]
                               for e in rep["events"]]
        except (RuntimeError, OSError) as e:
            raise DeliveryUnavailable(f"the ring's CUDA IPC handles do not open here: {e}") from None

    @staticmethod
    def _free(sock: socket.socket, memory: str, ptr: int, device: Any) -> None:
        if memory == "cuda" and ptr:
            try:
                import torch
                with torch.cuda.device(device):
                    torch.cuda.synchronize(device)
                    _cuda().cuIpcCloseMemHandle(ptr)
            except Exception:  # the process is exiting: the driver frees it
                pass
        try:
            sock.close()
        except OSError:
            pass
        # A host mapping stays until the tensors over it go (numpy holds it).

    def close(self) -> None:
        self._finalizer()

    def release(self, k: int) -> None:
        """Lets go of slot k, as of now on the current stream: the daemon's
        next writes into slot k wait for the kernels queued there so far
        (slot k's consumer event; nothing to wait for in host memory)."""
        if self.consumers:
            import torch
            self.consumers[k].record(torch.cuda.current_stream(self.device))

    def release_all(self) -> None:
        """Lets go of every slot (an epoch's end: its batches are done with)."""
        for k in range(len(self.consumers)):
            self.release(k)

    def slot(self, k: int, n: int) -> "Any":
        """Samples 0..n-1 of slot k as a tensor of shape (n, *shape), backed by the ring."""
        import torch
        off = k * self.slot_bytes
        nbytes = n * self.sample_bytes
        if self.memory == "host":
            flat = self.host[off:off + nbytes]
            return torch.from_numpy(flat).view(_torch_dtype(self.dtype)).view((n,) + self.shape)
        arr = _DeviceArray(self.ptr + off, (n,) + self.shape, self.dtype.str, self)
        return torch.as_tensor(arr, device=self.device)

    def send(self, msg: Dict[str, Any]) -> None:
        data = request_line(msg)
        # A poll for replies may have left a short timeout on the socket.
        self.sock.settimeout(self.timeout)
        try:
            self.sock.sendall(data)
        except socket.timeout:
            raise DeliveryError("the mount's daemon does not read its delivery socket") from None
        except OSError as e:
            # The daemon closes a connection it refuses a request on, after
            # saying why: that reply, not the broken pipe, is the error.
            why = self._refusal()
            if why:
                raise DeliveryError(f"the mount's daemon refused a request: {why}") from None
            raise DeliveryError(f"the mount's daemon is gone (delivery socket: {e.strerror or e})") from None

    def _refusal(self) -> Optional[str]:
        """The error of a reply already sent on a connection that broke, if any."""
        try:
            while True:
                rep, _ = self._recv(timeout=min(self.timeout, 1.0))
                if rep.get("error"):
                    return str(rep["error"])
        except (OSError, DeliveryError, ValueError):  # socket.timeout is an OSError
            return None

    def fill(self, k: int, files: List[str]) -> None:
        """Asks for files in slot k; its reply is owed until read."""
        self.send({"op": "fill", "slot": k, "files": files})
        self.owed.add(k)

    def recv(self, timeout: Optional[float] = None) -> Optional[Dict[str, Any]]:
        """The next reply, or None when none came within timeout (None: the ring's)."""
        try:
            rep, _ = self._recv(timeout=timeout)
        except socket.timeout:
            return None
        return rep

    def _recv(self, timeout: Optional[float] = None, with_fds: bool = False) -> Tuple[Dict[str, Any], List[int]]:
        self.sock.settimeout(self.timeout if timeout is None else timeout)
        try:
            line, fds = recv_line(self.sock, self._buf, with_fds)
        except socket.timeout:
            if timeout is None:
                raise DeliveryError(f"the mount's daemon did not answer in {self.timeout:g} s") from None
            raise
        except EOFError:
            raise DeliveryError("the mount's daemon closed the delivery socket (unmounted, or killed)") from None
        except OSError as e:
            raise DeliveryError(f"the mount's daemon is gone (delivery socket: {e.strerror or e})") from None
        return json.loads(line), fds


def recv_line(sock: socket.socket, buf: bytearray, with_fds: bool = False,
              limit: Optional[int] = None) -> Tuple[bytes, List[int]]:
    """Reads sock into buf until it holds a whole line, and takes it out of
    buf: returns it and the descriptors that came with the reads
    (with_fds). What was read stays in buf when it raises: OSError
    (socket.timeout among them: a later call goes on with the line),
    EOFError where the daemon closed the socket first, ValueError past
    limit bytes without a newline."""
    fds: List[int] = []
    while b"\n" not in buf:
        if limit is not None and len(buf) > limit:
            raise ValueError(f"a reply of more than {limit} bytes without its newline")
        if with_fds:
            data, anc, _, _ = sock.recvmsg(1 << 16, socket.CMSG_SPACE(4 * array.array("i").itemsize))
            for level, typ, payload in anc:
                if level == socket.SOL_SOCKET and typ == socket.SCM_RIGHTS:
                    a = array.array("i")
                    a.frombytes(payload[:len(payload) - len(payload) % a.itemsize])
                    fds += list(a)
        else:
            data = sock.recv(1 << 16)
        if not data:
            raise EOFError
        buf += data
    n = buf.index(b"\n")
    line = bytes(buf[:n])
    del buf[:n + 1]
    return line, fds


def request_line(msg: Dict[str, Any]) -> bytes:
    """A request as the socket carries it: compact JSON and a newline."""
    return (json.dumps(msg, separators=(",", ":")) + "\n").encode()


def longest_fill(names: List[str], slots: int, batch: int) -> int:
    """The bytes of the longest fill request a ring of slots batches over
    these file names may send: the batch longest names, in the last slot."""
    longest = heapq.nlargest(batch, names, key=lambda n: len(json.dumps(n)))
    return len(request_line({"op": "fill", "slot": slots - 1, "files": longest}))


def pci_bus_id_of(device: Any) -> str:
    """pci_bus_id of a torch device; a process without the CUDA driver
    raises DeliveryUnavailable."""
    try:
        import torch
        torch.cuda.init()  # type: ignore[no-untyped-call]
        return pci_bus_id(device.index)
    except (RuntimeError, OSError) as e:
        raise DeliveryUnavailable(f"no CUDA driver to share memory with the mount: {e}") from None


def _consumer_events(device: Any, slots: int) -> Tuple[List[Any], List[str]]:
    """A ring's consumer events, one per slot, each recorded once to be
    shared, and their handles (hex); a platform without CUDA interprocess
    events raises DeliveryUnavailable."""
    import torch
    events = []
    try:
        with torch.cuda.device(device):
            stream = torch.cuda.current_stream(device)
            for _ in range(slots):
                ev = torch.cuda.Event(enable_timing=False, interprocess=True)  # type: ignore[no-untyped-call]
                ev.record(stream)  # an event must be recorded to be shared
                events.append(ev)
            handles = [bytes(ev.ipc_handle()).hex() for ev in events]  # type: ignore[no-untyped-call]
    except (RuntimeError, OSError) as e:
        raise DeliveryUnavailable(f"CUDA interprocess events do not work here: {e}") from None
    return events, handles


def _torch_dtype(dt: np.dtype) -> Any:
    from .loader import _torch_dtype as f
    return f(dt)


def cache_holds(sample_dir: Any, share: Tuple[int, int, int], timeout: float) -> bool:
    """Whether the mount's cache holds, decoded, every sample of share
    ((first, step, count) of the directory's positions), asked on a
    connection of its own with no ring. A daemon that cannot say (gone,
    or from before the question) holds nothing."""
    root = sample_dir.root()
    first, step, count = share
    req = {"op": "holds", "dir": os.path.relpath(sample_dir.path, root),
           "share": {"first": first, "step": step, "count": count}}
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(min(timeout, 30.0))
            s.connect(socket_path(root))
            s.sendall(request_line(req))
            line, _ = recv_line(s, bytearray(), limit=MAX_LINE)
        rep = json.loads(line)
    except (OSError, EOFError, ValueError):
        return False
    return bool(rep.get("ok")) and rep.get("held") is True


def ring_for(sample_dir: Any, memory: str, slots: int, batch: int, device: Any, timeout: float) -> Ring:
    """Opens a ring for a SampleDir of a mount. A batch whose fill requests
    could pass the daemon's longest line raises DeliveryUnavailable."""
    # A directory's names are all of one width (sample_width): the first
    # batch's are as long as any, and listing every name costs half a second a
    # million samples.
    first = [os.path.basename(sample_dir.file(i)) for i in range(min(batch, len(sample_dir)))]
    n = longest_fill(first, slots, batch)
    if n > MAX_LINE:
        raise DeliveryUnavailable(f"a batch of {batch} samples makes fill requests of up to {n} bytes, over the "
                                  f"delivery socket's {MAX_LINE >> 20} MiB a request: use a smaller batch_size")
    root = sample_dir.root()
    rel = os.path.relpath(sample_dir.path, root)
    return Ring(socket_path(root), rel, memory, slots, batch, device=device, timeout=timeout)

