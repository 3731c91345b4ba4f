import errno
import os
import signal
import subprocess

import numpy as np
import pytest

import zarrfs
from conftest import need
from zarrfs._mount import mount_source


def test_flag_args():
    assert zarrfs.flag_args({"cache_size": "1GiB", "direct": True, "allow_other": False, "lease": None,
                             "view": ["a.yaml", "b.yaml"], "rank": 1, "readahead": 0}) == [
        "--cache-size", "1GiB", "--direct", "--view", "a.yaml", "--view", "b.yaml", "--rank", "1",
        "--readahead", "0"]


def test_mount_reads_and_unmounts(zarrfs_bin, fuse, index_store, tmp_path):
    mnt = tmp_path / "mnt"  # does not exist yet: Mount makes it, and removes it after
    with zarrfs.Mount(index_store, str(mnt), cache=str(tmp_path / "cache"), readahead=0) as m:
        assert m.line.startswith("zarrfs: mounted") and m.running
        assert mount_source(str(mnt)).startswith("fuse.zarrfs")
        with open(f"/proc/{m._proc.pid}/cmdline") as f:
            assert f.read().split("\0")[:-1] == m.args, "Mount.args is not the command it ran"
        x = np.load(mnt / "x" / "07.npy")
        assert x.shape == (2, 3) and x[0, 0] == 7
    assert mount_source(str(mnt)) is None
    assert not mnt.exists()


def test_mount_on_a_temporary_directory(zarrfs_bin, fuse, index_store, tmp_path):
    with zarrfs.Mount(index_store, cache=str(tmp_path / "cache")) as m:
        path = m.path
        assert os.path.isdir(os.path.join(path, "x"))
    assert not os.path.exists(path)


def test_bad_source_raises_the_daemons_error(zarrfs_bin, fuse, tmp_path):
    with pytest.raises(zarrfs.MountError) as e:
        with zarrfs.Mount(str(tmp_path / "missing.zarr"), str(tmp_path / "mnt"), cache=str(tmp_path / "c")):
            pass
    assert str(e.value) == f"zarrfs: {tmp_path}/missing.zarr: no such directory"
    assert e.value.returncode == 1
    assert not (tmp_path / "mnt").exists()


def test_not_a_store_raises_the_daemons_error(zarrfs_bin, fuse, tmp_path):
    with pytest.raises(zarrfs.MountError, match=r"^zarrfs: file://.*: no Zarr metadata"):
        zarrfs.Mount(str(tmp_path), str(tmp_path / "mnt"), cache=str(tmp_path / "c")).start()


def test_usage_error_raises_the_daemons_error(zarrfs_bin, fuse, index_store, tmp_path):
    with pytest.raises(zarrfs.MountError) as e:
        zarrfs.Mount(index_store, str(tmp_path / "mnt"), cache=str(tmp_path / "c"), rank=3, world=2).start()
    assert str(e.value).startswith("zarrfs: --rank 3 --world 2")
    assert e.value.returncode == 2


def test_flag_mistake_raises_the_daemons_error(zarrfs_bin, fuse, index_store, tmp_path):
    # A flag the daemon does not know is a usage error whose line starts
    # "zarrfs: " as every error line does: MountError carries it, not a
    # message of its own around it.
    with pytest.raises(zarrfs.MountError) as e:
        zarrfs.Mount(index_store, str(tmp_path / "mnt"), cache=str(tmp_path / "c"), bogus_flag=True).start()
    assert str(e.value) == "zarrfs: mount: unknown flag: --bogus-flag (see zarrfs mount --help)"
    assert e.value.returncode == 2


def test_mountpoint_is_a_file(zarrfs_bin, fuse, index_store, tmp_path):
    f = tmp_path / "file"
    f.write_text("")
    with pytest.raises(zarrfs.MountError, match=f"^zarrfs: {f}: not a directory$"):
        zarrfs.Mount(index_store, str(f), cache=str(tmp_path / "c")).start()


def test_busy_mountpoint(mount, index_store, tmp_path):
    # The kernel would stack a second mount on a live one; Mount refuses and
    # says what is mounted there.
    m = mount(index_store)
    with pytest.raises(zarrfs.MountError, match=r"already a zarrfs mount \(of file://.*index\.zarr\); "
                                              r"unmount it first \(zarrfs unmount .*\)") as e:
        zarrfs.Mount(index_store, m.path, cache=str(tmp_path / "other")).start()
    assert "fusermount3" not in str(e.value)
    assert np.load(os.path.join(m.path, "x", "00.npy"))[0, 0] == 0


def cli_error(zarrfs_bin, source, mnt, tmp_path):
    """The error line `zarrfs mount` prints for mnt, and its exit status."""
    import subprocess

    out = subprocess.run([zarrfs_bin, "mount", source, str(mnt), "--cache", str(tmp_path / "cli-cache")],
                         capture_output=True, text=True, timeout=60)
    return out.stderr.strip(), out.returncode


def test_non_empty_mountpoint_refused_as_the_cli_does(zarrfs_bin, fuse, index_store, tmp_path):
    mnt = tmp_path / "full"
    mnt.mkdir()
    (mnt / "notes.txt").write_text("mine")
    with pytest.raises(zarrfs.MountError) as e:
        zarrfs.Mount(index_store, str(mnt), cache=str(tmp_path / "c")).start()
    assert str(e.value) == f'zarrfs: {mnt}: not empty (holds "{mnt}/notes.txt"): a mount would hide its files; choose an empty directory'
    assert e.value.returncode == 1
    assert (str(e.value), 1) == cli_error(zarrfs_bin, index_store, mnt, tmp_path)
    assert (mnt / "notes.txt").read_text() == "mine" and mount_source(str(mnt)) is None


def test_other_filesystem_refused_as_the_cli_does(zarrfs_bin, fuse, index_store, tmp_path):
    import subprocess

    mnt = tmp_path / "tmpfs"
    mnt.mkdir()
    need("a tmpfs mount", os.geteuid() == 0 and subprocess.call(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)]) == 0,
         "root and mount(8), to mount one")
    try:
        with pytest.raises(zarrfs.MountError) as e:
            zarrfs.Mount(index_store, str(mnt), cache=str(tmp_path / "c")).start()
        assert str(e.value) == f"zarrfs: {mnt}: already a mount point (tmpfs tmpfs): a mount there would hide it; choose another directory"
        assert (str(e.value), 1) == cli_error(zarrfs_bin, index_store, mnt, tmp_path)
        assert mount_source(str(mnt)) == "tmpfs tmpfs"
    finally:
        subprocess.call(["umount", "-l", str(mnt)])


def test_non_positive_timeouts_refused(tmp_path):
    # Refused, not turned into "no wait" or a default.
    for t in (0, -1):
        with pytest.raises(ValueError, match="timeout"):
            zarrfs.Mount("src", str(tmp_path / "mnt"), timeout=t)
    with pytest.raises(ValueError, match="timeout"):
        zarrfs.Mount("src", str(tmp_path / "mnt")).stop(timeout=0)


def test_missing_binary(monkeypatch, tmp_path):
    monkeypatch.setenv("ZARRFS_BIN", str(tmp_path / "nothing"))
    with pytest.raises(FileNotFoundError, match="ZARRFS_BIN"):
        zarrfs.Mount("src", str(tmp_path / "mnt")).start()


def test_sample_dir_names_match_the_listing(mount, index_store):
    m = mount(index_store)
    d = zarrfs.SampleDir(os.path.join(m.path, "x"))
    assert d.names == sorted(os.listdir(d.path)) and len(d) == 23 and d.width == 2
    assert d.sample_shape == (2, 3) and d.dtype == np.float32 and not d.sharded
    assert list(d.coords()[:2]) == [np.datetime64("2000-01-01T00", "ns"), np.datetime64("2000-01-01T06", "ns")]
    for rank in range(3):
        r = mount(index_store, rank=rank, world=3, shard="interleaved")
        rd = zarrfs.SampleDir(os.path.join(r.path, "x"))
        assert rd.sharded and (rd.rank, rd.world, rd.mode) == (rank, 3, "interleaved")
        assert rd.names == sorted(os.listdir(rd.path))
        assert list(rd.indices) == list(range(rank, 23, 3))
        first, step, count = zarrfs.shard_of(23, rank, 3, "interleaved")
        assert (rd.first, rd.step, rd.count) == (first, step, count)


def test_shard_of_matches_contiguous_mounts(mount, index_store):
    for rank in range(2):
        r = mount(index_store, rank=rank, world=2)
        rd = zarrfs.SampleDir(os.path.join(r.path, "x"))
        first, step, count = zarrfs.shard_of(23, rank, 2)
        assert list(rd.indices) == list(range(first, first + count))


def test_import_without_optional_packages():
    # zarrfs and zarrfs.dali import nothing optional at import time.
    import subprocess
    import sys

    code = ("import sys\n"
            "for m in ('torch', 'nvidia', 'nvidia.dali', 'xarray', 'cupy', 'kvikio'): sys.modules[m] = None\n"
            "import zarrfs, zarrfs.dali\n"
            "try:\n    import zarrfs.torch\nexcept ImportError as e:\n    print('torch:', e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "torch: zarrfs.torch needs PyTorch (pip install torch)"



def test_daemon_gone_before_stop(zarrfs_bin, fuse, index_store, tmp_path):
    m = zarrfs.Mount(index_store, str(tmp_path / "mnt"), cache=str(tmp_path / "c")).start()
    m._proc.send_signal(signal.SIGTERM)  # as if stopped from elsewhere: it unmounts and exits 0
    m._proc.wait(timeout=30)
    with pytest.raises(zarrfs.MountError, match="exited with status 0 before it was stopped"):
        m.stop()
    assert mount_source(str(tmp_path / "mnt")) is None


def test_unmounted_from_outside_raises_no_log_line(zarrfs_bin, fuse, index_store, tmp_path):
    """A daemon unmounted from elsewhere exits 0, its last line an INFO
    record that says nothing of why: the error is the mount's own line,
    with a log line appended only if it is an error."""
    mnt = str(tmp_path / "mnt")
    m = zarrfs.Mount(index_store, mnt, cache=str(tmp_path / "c")).start()
    subprocess.run(["umount", mnt] if os.geteuid() == 0 else ["fusermount3", "-u", mnt], check=True)
    m._proc.wait(timeout=30)
    with pytest.raises(zarrfs.MountError) as e:
        m.stop()
    assert "level=INFO" in e.value.stderr.splitlines()[-1]
    assert str(e.value) == f"zarrfs: {mnt}: the daemon exited with status 0 before it was stopped"
    m._stderr.append('time=2026-01-02T03:04:05Z level=ERROR msg="delivery socket" err="accept: too many open files"')
    m._stderr.append('time=2026-01-02T03:04:06Z level=INFO msg="unmounted externally"')
    assert m._error_line("zarrfs: stopped") == ('zarrfs: stopped: time=2026-01-02T03:04:05Z level=ERROR '
                                                'msg="delivery socket" err="accept: too many open files"')


def test_stale_mountpoint_is_cleared(zarrfs_bin, fuse, index_store, tmp_path):
    mnt = str(tmp_path / "mnt")
    m = zarrfs.Mount(index_store, mnt, cache=str(tmp_path / "c")).start()
    m._proc.kill()  # SIGKILL: the kernel keeps a dead mount
    m._proc.wait(timeout=30)
    m._proc = None
    with pytest.raises(OSError) as e:
        os.listdir(mnt)
    assert e.value.errno == errno.ENOTCONN
    with zarrfs.Mount(index_store, mnt, cache=str(tmp_path / "c")) as again:
        assert np.load(os.path.join(again.path, "x", "03.npy"))[0, 0] == 3
    assert mount_source(mnt) is None
