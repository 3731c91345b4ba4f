"""Starting and stopping `zarrfs mount` from Python."""

from __future__ import annotations

import collections
import logging
import os
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from typing import Any, List, Mapping, Optional, Union

log = logging.getLogger("zarrfs")


class MountError(RuntimeError):
    """`zarrfs mount` failed to start or to stop cleanly.

    ``str(err)`` is the daemon's own error line (``zarrfs: SOURCE: cause``,
    or ``zarrfs: mount: unknown flag: ...`` for a mistake in the flags)
    when it printed one, else a line of the same form; ``returncode`` is its exit status (None while it
    still runs) and ``stderr`` the last lines it wrote.
    """

    def __init__(self, message: str, returncode: Optional[int] = None, stderr: str = "") -> None:
        super().__init__(message)
        self.returncode = returncode
        self.stderr = stderr


# The checkout this module was loaded from, when it was (an editable install
# or python/src on PYTHONPATH): python/src/zarrfs/_mount.py is four levels
# below it. A checkout has go.mod at its root, and `make` builds bin/zarrfs.
_CHECKOUT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def _checkout_binary() -> Optional[str]:
    if not os.path.isfile(os.path.join(_CHECKOUT, "go.mod")):
        return None
    p = os.path.join(_CHECKOUT, "bin", "zarrfs")
    return p if os.path.isfile(p) and os.access(p, os.X_OK) else None


def find_binary() -> str:
    """The `zarrfs` executable, looked for in this order:

    1. ``$ZARRFS_BIN``, when set: an explicit choice, so it is an error if it
       names no executable file;
    2. ``bin/zarrfs`` of the source checkout this package was installed from
       (``pip install -e ./python``), where ``make`` builds it: the binary of
       the same version as this code;
    3. ``zarrfs`` on ``PATH`` (``make install`` puts it in /usr/local/bin).
    """
    p = os.environ.get("ZARRFS_BIN")
    if p:
        if not (os.path.isfile(p) and os.access(p, os.X_OK)):
            raise FileNotFoundError(f"ZARRFS_BIN={p}: not an executable file")
        return p
    p = _checkout_binary() or shutil.which("zarrfs")
    if p is None:
        where = (f"run make in {_CHECKOUT} (it builds bin/zarrfs there), "
                 if os.path.isfile(os.path.join(_CHECKOUT, "go.mod")) else "")
        raise FileNotFoundError(
            "zarrfs binary not found: " + where + "install it on PATH (make install in a clone of "
            "the zarrfs repository, or copy a built zarrfs to /usr/local/bin), or set ZARRFS_BIN to its path")
    return p


def flag_args(flags: Mapping[str, Any]) -> List[str]:
    """Command-line arguments for keyword flags.

    ``cache_size="1GiB"`` gives ``--cache-size 1GiB``; ``direct=True`` gives
    ``--direct`` (False and None give nothing); a list or tuple repeats the
    flag (``view=["a.yaml", "b.yaml"]``).
    """
    args: List[str] = []
    for key, value in flags.items():
        name = "--" + key.replace("_", "-")
        if value is None or value is False:
            continue
        if value is True:
            args.append(name)
        elif isinstance(value, (list, tuple)):
            for v in value:
                args += [name, os.fspath(v) if isinstance(v, os.PathLike) else str(v)]
        else:
            args += [name, os.fspath(value) if isinstance(value, os.PathLike) else str(value)]
    return args


def mount_source(mountpoint: str) -> Optional[str]:
    """The filesystem mounted exactly at mountpoint ("fuse.zarrfs file:///..."), or None."""
    target = os.path.realpath(mountpoint)
    try:
        with open("/proc/self/mountinfo") as f:
            lines = f.readlines()
    except OSError:
        return None
    found = None
    for line in lines:
        left, _, right = line.partition(" - ")
        fields = left.split()
        if len(fields) < 5:
            continue
        mp = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), fields[4])
        if mp == target:
            r = right.split()
            found = " ".join(r[:2]) if len(r) >= 2 else right.strip()
    return found


class Mount:
    """Runs ``zarrfs mount SOURCE MOUNTPOINT [flags]`` for the life of a ``with`` block.

    >>> with zarrfs.Mount("/data/era5.zarr", "/mnt/era5", cache="/nvme/zarrfs",
    ...                   cache_size="500GiB", direct=True, view=["train.yaml"]) as m:
    ...     np.load(f"{m.path}/t/0042.npy")

    Keyword flags become command-line flags (see :func:`flag_args`). Entering
    waits until the daemon prints its "mounted" line; if it exits first,
    :class:`MountError` carries its error line. The daemon refuses a
    mountpoint that holds files or is the top of another mount (a live
    zarrfs mount, or another filesystem), as ``zarrfs mount`` does; a stale
    one, left by a killed daemon, it clears. ``mountpoint=None`` mounts on a
    new temporary directory, removed on exit, as is a mountpoint this object
    created. Leaving the block sends SIGTERM and waits for a clean unmount.
    The daemon's log lines go to the ``zarrfs`` logger.
    """

    def __init__(self, source: "Union[str, os.PathLike[str]]", mountpoint: "Optional[Union[str, os.PathLike[str]]]" = None, *,
                 binary: Optional[str] = None, timeout: float = 60.0, **flags: Any) -> None:
        if timeout <= 0:
            raise ValueError(f"timeout {timeout}: want a positive number of seconds")
        self.source = os.fspath(source)
        self._given = mountpoint
        self.path: Optional[str] = os.fspath(mountpoint) if mountpoint is not None else None
        self.binary = binary
        self.timeout = timeout
        self.flags = flags
        self.line: Optional[str] = None  # the daemon's "mounted" line
        self._proc: "Optional[subprocess.Popen[str]]" = None
        self._made: Optional[str] = None
        self._stderr: "collections.deque[str]" = collections.deque(maxlen=200)
        self._threads: List[threading.Thread] = []

    @property
    def args(self) -> List[str]:
        """The command line this mount runs."""
        return self._command(self.binary or find_binary())

    def _command(self, binary: str) -> List[str]:
        return [binary, "mount", self.source, self.path or "MOUNTPOINT"] + flag_args(self.flags)

    def start(self) -> "Mount":
        if self._proc is not None:
            raise MountError(f"{self.path}: already started")
        binary = self.binary or find_binary()
        if self.path is None:
            self.path = self._made = tempfile.mkdtemp(prefix="zarrfs-")
        elif not os.path.lexists(self.path):
            os.makedirs(self.path)
            self._made = self.path
        # Whether the mountpoint may take a mount (empty, not the top of
        # another mount, or a stale zarrfs mount to clear) the daemon
        # decides, so that zarrfs.Mount refuses exactly what zarrfs mount
        # refuses, with the same line.
        cmd = self._command(binary)
        log.debug("starting %s", " ".join(cmd))
        proc = self._proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                             stderr=subprocess.PIPE, text=True, errors="replace",
                                             start_new_session=True)
        assert proc.stdout is not None and proc.stderr is not None
        stdout, stderr = proc.stdout, proc.stderr
        lines: "collections.deque[str]" = collections.deque()
        got_line = threading.Event()

        def read_stdout() -> None:
            for line in stdout:
                line = line.rstrip("\n")
                lines.append(line)
                got_line.set()
                log.info("%s", line)
            got_line.set()

        def read_stderr() -> None:
            for line in stderr:
                line = line.rstrip("\n")
                self._stderr.append(line)
                log.info("%s", line)

        for fn in (read_stdout, read_stderr):
            t = threading.Thread(target=fn, daemon=True, name=f"zarrfs-{fn.__name__}")
            t.start()
            self._threads.append(t)

        deadline = time.monotonic() + self.timeout
        while True:
            while lines:
                line = lines.popleft()
                if "mounted" in line:
                    self.line = line
                    return self
            if proc.poll() is not None:
                for t in self._threads:
                    t.join(timeout=5)
                while lines:
                    self._stderr.appendleft(lines.popleft())
                rc = proc.returncode
                self._proc, self._threads = None, []
                self._cleanup_dir()
                raise MountError(self._error_line(f"zarrfs: mount: exited with status {rc} before mounting"),
                                 returncode=rc, stderr=self.stderr)
            left = deadline - time.monotonic()
            if left <= 0:
                self._kill()
                self._proc, self._threads = None, []
                self._cleanup_dir()
                raise MountError(self._error_line(f"zarrfs: mount: not mounted within {self.timeout:g}s"),
                                 stderr=self.stderr)
            got_line.wait(min(left, 0.1))
            got_line.clear()

    @property
    def stderr(self) -> str:
        """The last lines the daemon wrote to stderr."""
        return "\n".join(self._stderr)

    def _error_line(self, default: str) -> str:
        # A failing command's error is its last line starting "zarrfs: "
        # (every error line, usage errors included); log lines are
        # key=value records, of which only an error says why (the last
        # line of a daemon unmounted from outside is some INFO record).
        for line in reversed(self._stderr):
            if line.startswith("zarrfs: "):
                return line
        for line in reversed(self._stderr):
            if " level=ERROR " in f" {line} ":
                return f"{default}: {line.strip()}"
        return default

    def stop(self, timeout: float = 30.0) -> None:
        """Unmount: SIGTERM, then wait for the daemon to exit (SIGKILL after timeout)."""
        if timeout <= 0:
            raise ValueError(f"timeout {timeout}: want a positive number of seconds")
        p = self._proc
        if p is None:
            return
        try:
            if p.poll() is not None:
                # The mount went away under the reader (a signal from
                # elsewhere, an unmount from outside, a crash): say so, since
                # reads then failed with ENOENT or ENOTCONN.
                for t in self._threads:
                    t.join(timeout=5)
                raise MountError(self._error_line(
                    f"zarrfs: {self.path}: the daemon exited with status {p.returncode} before it was stopped"),
                    returncode=p.returncode, stderr=self.stderr)
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self._kill()
                raise MountError(f"zarrfs: {self.path}: the daemon did not exit within {timeout:g}s of SIGTERM; killed it",
                                 stderr=self.stderr)
            for t in self._threads:
                t.join(timeout=5)
            if p.returncode != 0:
                raise MountError(self._error_line(f"zarrfs: mount: exited with status {p.returncode}"),
                                 returncode=p.returncode, stderr=self.stderr)
        finally:
            self._proc, self._threads = None, []
            self._cleanup_dir()

    def _kill(self) -> None:
        p = self._proc
        if p is not None and p.poll() is None:
            p.kill()
            p.wait()
        if self.path and mount_source(self.path) is not None:
            # A killed daemon leaves its mount behind; detach it.
            for cmd in (["fusermount3", "-uz", self.path], ["umount", "-l", self.path]):
                if shutil.which(cmd[0]) and subprocess.call(cmd, stderr=subprocess.DEVNULL) == 0:
                    break

    def _cleanup_dir(self) -> None:
        if self._made is not None:
            try:
                os.rmdir(self._made)
            except OSError:
                pass
            self._made = None
            if self._given is None:
                self.path = None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def __enter__(self) -> "Mount":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = "mounted" if self.running else "stopped"
        return f"Mount({self.source!r}, {self.path!r}, {state})"

