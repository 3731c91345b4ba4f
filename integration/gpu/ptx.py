#!/usr/bin/env python3
"""Compile gpu/kernels/kernels.cu to PTX as the checked-in kernels.ptx is
made: with nvcc (nvcc -ptx -arch=sm_75 -O3) when it is on PATH or in
/usr/local/cuda/bin, else with NVRTC (--gpu-architecture=compute_75
-default-device, which writes the same code) from the nvidia-cuda-nvrtc
wheel that PyTorch's CUDA builds install. Prints the compiler used.

Usage: ptx.py KERNELS_CU OUT_PTX
Exits 1 when neither compiler is there or the compilation fails.
"""

import ctypes
import glob
import os
import shutil
import site
import subprocess
import sys


def nvcc():
    for p in (shutil.which("nvcc"), "/usr/local/cuda/bin/nvcc"):
        if p and os.access(p, os.X_OK):
            return p
    return None


def nvrtc_lib():
    dirs = site.getsitepackages() + [site.getusersitepackages()]
    for d in dirs:
        for pat in ("nvidia/cu*/lib/libnvrtc.so.*", "nvidia/cuda_nvrtc/lib/libnvrtc.so.*"):
            for p in sorted(glob.glob(os.path.join(d, pat))):
                if "builtins" not in p and "alt" not in os.path.basename(p):
                    return p
    return None


def with_nvrtc(lib_path, src, out):
    lib = ctypes.CDLL(lib_path)
    prog = ctypes.c_void_p()
    text = open(src, "rb").read()
    if lib.nvrtcCreateProgram(ctypes.byref(prog), text, b"kernels.cu", 0, None, None) != 0:
        raise RuntimeError("nvrtcCreateProgram failed")
    opts = [b"--gpu-architecture=compute_75", b"-default-device"]
    rc = lib.nvrtcCompileProgram(prog, len(opts), (ctypes.c_char_p * len(opts))(*opts))
    n = ctypes.c_size_t()
    lib.nvrtcGetProgramLogSize(prog, ctypes.byref(n))
    log = ctypes.create_string_buffer(n.value)
    lib.nvrtcGetProgramLog(prog, log)
    if rc != 0:
        raise RuntimeError(f"NVRTC failed ({rc}): {log.value.decode(errors='replace')}")
    lib.nvrtcGetPTXSize(prog, ctypes.byref(n))
    ptx = ctypes.create_string_buffer(n.value)
    lib.nvrtcGetPTX(prog, ptx)
    with open(out, "wb") as f:
        f.write(ptx.value)
    major, minor = ctypes.c_int(), ctypes.c_int()
    lib.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor))
    return f"NVRTC {major.value}.{minor.value} ({lib_path})"


def main():
    src, out = sys.argv[1], sys.argv[2]
    cc = nvcc()
    if cc:
        subprocess.run([cc, "-ptx", "-arch=sm_75", "-O3", "-o", out, src], check=True)
        ver = subprocess.run([cc, "--version"], capture_output=True, text=True).stdout.strip().splitlines()[-1]
        print(f"kernels: {os.path.getsize(out)} bytes of PTX with nvcc ({ver})")
        return
    lib = nvrtc_lib()
    if not lib:
        print("kernels: no nvcc and no NVRTC here: not compiled", file=sys.stderr)
        sys.exit(1)
    try:
        how = with_nvrtc(lib, src, out)
    except RuntimeError as e:
        print(f"kernels: {e}", file=sys.stderr)
        sys.exit(1)
    print(f"kernels: {os.path.getsize(out)} bytes of PTX with {how}")


if __name__ == "__main__":
    main()
