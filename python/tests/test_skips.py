"""make test prints every skip with its reason (README.md): pytest's summary
groups skips raised at one place with one reason into one line, so each GPU
skip names its test."""

import sys

import pytest

from conftest import need_gpu


def test_gpu_skip_names_its_test(monkeypatch):
    monkeypatch.setitem(sys.modules, "cupy", None)  # import cupy fails
    with pytest.raises(pytest.skip.Exception) as e:
        need_gpu()
    assert "test_skips.py::test_gpu_skip_names_its_test: needs an NVIDIA GPU" in str(e.value)
