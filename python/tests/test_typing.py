"""The package ships its annotations (PEP 561) and they are complete and
consistent: mypy --strict finds nothing; and the xarray floor pyproject.toml
declares is the one the backend checks."""

import os
import re
import subprocess
import sys

from conftest import REPO, need_module

PKG = os.path.join(REPO, "python", "src", "zarrfs")
PYPROJECT = os.path.join(REPO, "python", "pyproject.toml")


def test_py_typed_is_shipped():
    assert os.path.isfile(os.path.join(PKG, "py.typed"))
    with open(PYPROJECT) as f:
        text = f.read()
    assert re.search(r'^\[tool\.setuptools\.package-data\]\nzarrfs = \["py\.typed"\]', text, re.M), \
        "pyproject.toml does not ship py.typed"


def test_annotations_pass_mypy_strict():
    need_module("mypy")
    out = subprocess.run([sys.executable, "-m", "mypy", "--strict", "--ignore-missing-imports", "--no-incremental", PKG],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr


def test_xarray_floor():
    need_module("xarray")
    from zarrfs import xarray_backend

    with open(PYPROJECT) as f:
        floors = set(re.findall(r'"xarray>=([0-9.]+)"', f.read()))
    want = "%d.%d" % xarray_backend.MIN_XARRAY
    assert floors == {want}, f"pyproject.toml's xarray floors {floors}, the backend needs {want}"
    assert xarray_backend._version("2023.3.0") < xarray_backend.MIN_XARRAY <= xarray_backend._version("2023.4.0")
    assert xarray_backend._version("2024.10.0rc1") > xarray_backend.MIN_XARRAY
