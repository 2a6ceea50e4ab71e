#!/usr/bin/env python3
"""Compiles the CUDA kernels on a machine without a GPU, as the engine does at start
(src/kernels/cuda/compile.rs: NVRTC, common.cuh prepended, compute_90a, C++17, fmad, each
module once per 16-bit type), then assembles them with ptxas for sm_90a and prints each
entry point's registers, stack frame, spills and static shared memory. A compile error or
a spill shows here in seconds, before any GPU time is spent; the GPU machine's driver
assembles the same PTX.

NVRTC and ptxas come from NVIDIA's PyPI wheels (nvidia-cuda-nvrtc, nvidia-cuda-nvcc, CUDA
13.0 as on the GPU machines), fetched with pip once into $INFLIGHT_NVTOOLS (default
~/.cache/inflight/nvtools).

    python3 scripts/kernel-resources.py                 # every module in kernels/
    python3 scripts/kernel-resources.py gemv rope       # some modules
    python3 scripts/kernel-resources.py --dir /tmp/variant/kernels gemv   # another version
Exit status 1 when a module does not compile.
"""
import argparse
import ctypes
import glob
import os
import re
import subprocess
import sys
import tempfile
import zipfile

CUDA = "13.0.88"
WHEELS = ("nvidia-cuda-nvrtc", "nvidia-cuda-nvcc")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def tools():
    """(libnvrtc path, ptxas path), fetching the wheels on first use."""
    home = os.environ.get("INFLIGHT_NVTOOLS") or os.path.expanduser("~/.cache/inflight/nvtools")
    lib = os.path.join(home, "nvidia/cu13/lib")
    ptxas = os.path.join(home, "nvidia/cu13/bin/ptxas")
    if not (os.path.exists(os.path.join(lib, "libnvrtc.so.13")) and os.path.exists(ptxas)):
        os.makedirs(home, exist_ok=True)
        with tempfile.TemporaryDirectory() as d:
            subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", d]
                           + [f"{w}=={CUDA}" for w in WHEELS], check=True)
            for whl in glob.glob(os.path.join(d, "*.whl")):
                with zipfile.ZipFile(whl) as z:
                    z.extractall(home)
        os.chmod(ptxas, 0o755)
    return lib, ptxas


def nvrtc(lib_dir):
    # libnvrtc opens its builtins library by name: load it first so that the name resolves.
    for builtins in glob.glob(os.path.join(lib_dir, "libnvrtc-builtins.so.*")):
        if ".alt." not in builtins:
            ctypes.CDLL(builtins, mode=ctypes.RTLD_GLOBAL)
    return ctypes.CDLL(os.path.join(lib_dir, "libnvrtc.so.13"))


def compile_ptx(lib, name, source, f16, timeline=False):
    """(PTX or None, NVRTC's log) of one module, with the engine's options."""
    prog = ctypes.c_void_p()
    if lib.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), f"{name}.cu".encode(), 0,
                              None, None):
        return None, "nvrtcCreateProgram failed"
    # src/kernels/cuda/compile.rs's options (ptx()), for the Hopper arch.
    opts = [b"--gpu-architecture=compute_90a", b"--std=c++17", b"--fmad=true"]
    if f16:
        opts.append(b"-DINFLIGHT_F16")
    if timeline:
        opts += [b"-DINFLIGHT_TIMELINE", b"-DINFLIGHT_MODULE_ID=0"]
    rc = lib.nvrtcCompileProgram(prog, len(opts), (ctypes.c_char_p * len(opts))(*opts))
    size = ctypes.c_size_t()
    lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
    log = ctypes.create_string_buffer(size.value)
    lib.nvrtcGetProgramLog(prog, log)
    ptx = None
    if rc == 0:
        lib.nvrtcGetPTXSize(prog, ctypes.byref(size))
        buf = ctypes.create_string_buffer(size.value)
        lib.nvrtcGetPTX(prog, buf)
        ptx = buf.value
    lib.nvrtcDestroyProgram(ctypes.byref(prog))
    return ptx, log.value.decode(errors="replace").strip()


def resources(ptxas, ptx):
    """Per entry point: (registers, stack bytes, spill stores, spill loads, static smem)."""
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "m.ptx")
        with open(path, "wb") as f:
            f.write(ptx)
        out = subprocess.run([ptxas, "-arch=sm_90a", "-v", path, "-o", os.path.join(d, "m.cubin")],
                             capture_output=True, text=True)
    if out.returncode:
        raise RuntimeError(out.stderr)
    rows, name = {}, None
    for line in out.stderr.splitlines():
        # ptxas's warnings, and its notes of lost performance (wgmma serialized: C7513, C7514), go
        # to stderr as they are.
        if "warning" in line.lower() or "Performance Loss" in line:
            print(line, file=sys.stderr)
        m = re.search(r"Compiling entry function '(\w+)'", line)
        if m:
            name = m.group(1)
            rows[name] = [0, 0, 0, 0, 0]
        elif name:
            m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", line)
            if m:
                rows[name][1:4] = [int(g) for g in m.groups()]
            m = re.search(r"Used (\d+) registers", line)
            if m:
                rows[name][0] = int(m.group(1))
                s = re.search(r"(\d+) bytes smem", line)
                rows[name][4] = int(s.group(1)) if s else 0
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("modules", nargs="*", help="module names (kernels/<name>.cu); default all")
    ap.add_argument("--dir", default=os.path.join(ROOT, "kernels"), help="the kernels folder")
    ap.add_argument("--timeline", action="store_true",
                    help="with the timeline marks (INFLIGHT_TIMELINE=1 in the engine)")
    args = ap.parse_args()
    modules = args.modules or sorted(os.path.basename(p)[:-3] for p in glob.glob(os.path.join(args.dir, "*.cu")))
    lib_dir, ptxas = tools()
    lib = nvrtc(lib_dir)
    common = open(os.path.join(args.dir, "common.cuh")).read()
    failed = False
    print("| entry point | registers | stack bytes | spill stores | spill loads | static smem |")
    print("|---|---|---|---|---|---|")
    for name in modules:
        source = common + f'\n#line 1 "{name}.cu"\n' + open(os.path.join(args.dir, f"{name}.cu")).read()
        for f16 in (False, True):
            ptx, log = compile_ptx(lib, name, source, f16, args.timeline)
            if ptx is None:
                failed = True
                print(f"{name}.cu ({'f16' if f16 else 'bf16'}) does not compile:\n{log}", file=sys.stderr)
                continue
            if log:
                print(f"{name}.cu: {log}", file=sys.stderr)
            for entry, (regs, stack, st, ld, smem) in sorted(resources(ptxas, ptx).items()):
                print(f"| {entry} | {regs} | {stack} | {st} | {ld} | {smem} |")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
