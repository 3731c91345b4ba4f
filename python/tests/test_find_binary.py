"""zarrfs.find_binary: $ZARRFS_BIN, then the checkout's bin/zarrfs, then PATH."""

import os

import pytest

from zarrfs import _mount, find_binary


def executable(path):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n")
    path.chmod(0o755)
    return str(path)


@pytest.fixture
def places(tmp_path, monkeypatch):
    """A checkout (go.mod) and a PATH folder, both without a binary yet."""
    checkout = tmp_path / "checkout"
    checkout.mkdir()
    (checkout / "go.mod").write_text("module github.com/zarrfs/zarrfs\n")
    on_path = tmp_path / "path"
    on_path.mkdir()
    monkeypatch.setattr(_mount, "_CHECKOUT", str(checkout))
    monkeypatch.setenv("PATH", str(on_path))
    monkeypatch.delenv("ZARRFS_BIN", raising=False)
    return checkout, on_path


def test_order(places, tmp_path, monkeypatch):
    checkout, on_path = places
    in_path = executable(on_path / "zarrfs")
    assert find_binary() == in_path
    built = executable(checkout / "bin" / "zarrfs")
    assert find_binary() == built, "the checkout's own build goes before PATH"
    chosen = executable(tmp_path / "elsewhere" / "zarrfs")
    monkeypatch.setenv("ZARRFS_BIN", chosen)
    assert find_binary() == chosen, "ZARRFS_BIN goes before both"


def test_not_a_checkout(places, monkeypatch, tmp_path):
    """bin/zarrfs beside an installed package (no go.mod) is not taken."""
    checkout, on_path = places
    os.remove(checkout / "go.mod")
    executable(checkout / "bin" / "zarrfs")
    with pytest.raises(FileNotFoundError) as e:
        find_binary()
    assert "make install" in str(e.value) and "ZARRFS_BIN" in str(e.value)
    assert "run make in" not in str(e.value)


def test_none_found_says_how_to_get_one(places):
    checkout, _ = places
    with pytest.raises(FileNotFoundError) as e:
        find_binary()
    msg = str(e.value)
    assert f"run make in {checkout}" in msg and "make install" in msg and "ZARRFS_BIN" in msg, msg


def test_bad_zarrfs_bin(places, monkeypatch, tmp_path):
    checkout, _ = places
    executable(checkout / "bin" / "zarrfs")
    monkeypatch.setenv("ZARRFS_BIN", str(tmp_path))  # a directory
    with pytest.raises(FileNotFoundError, match="ZARRFS_BIN=.*not an executable file"):
        find_binary()


def test_this_checkout():
    """Loaded from this repository, the package knows it as its checkout."""
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert _mount._CHECKOUT == repo
