"""The native executor: straight-line runs of ops executed by C++.

Most of a small op's time in the generated Python code is torch's Python
binding (argument parsing, overload resolution, wrapping the result), not
the kernel. `segment.cpp` runs a straight-line run of ops ("a segment") as
one C++ call that makes the very ATen calls those bindings make, so the
kernels, the results (bit for bit) and the autograd graph are eager's;
`lower.py` decides which ops a segment may hold and with what operands, and
codegen emits

    v_a = seg_1(v_x, v_w)
    if v_a is None:
        <the same ops as Python statements>

so that whatever the C++ side will not run exactly as eager would (a tensor
subclass, a torch function mode, an error) runs in Python (the segment
returns None), and errors are eager's, naming the user's line as before.

The extension is compiled from `segment.cpp` on first use with the machine's
C++ compiler against the installed torch (about 15 s, once: the library is
cached under `$D2S_CACHE_DIR`, default `~/.cache/d2s`, keyed by the source,
torch and Python versions). `python -m runtime.native` builds it ahead of
time. Without a compiler, or with `D2S_NATIVE=0`, programs run as Python
code, as before (same results; a warning says why, once).
"""

import functools
import hashlib
import importlib.util
import os
import subprocess
import sys
import sysconfig
import tempfile
import threading
import warnings

import torch

from . import families

_HERE = os.path.dirname(os.path.abspath(__file__))
_SOURCE = os.path.join(_HERE, "segment.cpp")
_HEADERS = [os.path.join(_HERE, n) for n in ("autograd_compat.h", "lstm_cell.h", "gru_cell.h", "flow.h")]  # included by segment.cpp: part of the cache key
_MODULE_NAME = "d2s_native"
_lock = threading.Lock()
_state = {"tried": False, "module": None, "error": None}


class NativeBuildError(RuntimeError):
    """The C++ extension could not be compiled or loaded."""


def enabled():
    """Whether programs may use native segments (`D2S_NATIVE=0` turns them off)."""
    return os.environ.get("D2S_NATIVE", "1") != "0"


def cache_dir():
    base = os.environ.get("D2S_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "d2s")
    return os.path.join(base, "native")


def _torch_dirs():
    root = os.path.dirname(os.path.abspath(torch.__file__))
    return os.path.join(root, "include"), os.path.join(root, "lib")


def _command(source, target):
    include, lib = _torch_dirs()
    abi = int(getattr(torch._C, "_GLIBCXX_USE_CXX11_ABI", True))
    compiler = os.environ.get("CXX", "c++")
    return [compiler, "-O2", "-std=c++20", "-fPIC", "-shared", "-w", f"-D_GLIBCXX_USE_CXX11_ABI={abi}",
            *families.compiler_definitions(),
            "-I", include, "-I", os.path.join(include, "torch", "csrc", "api", "include"),
            "-I", sysconfig.get_paths()["include"], source, "-o", target,
            "-L", lib, "-lc10", "-ltorch", "-ltorch_cpu", "-ltorch_python", f"-Wl,-rpath,{lib}"]


@functools.lru_cache(maxsize=None)
def library_path():
    """Where the library for this source, torch and Python is cached (hashed
    once per process: `load` and `build` both ask)."""
    source = b""
    for path in [_SOURCE] + _HEADERS:
        with open(path, "rb") as f:
            source += f.read()
    key = hashlib.sha256(b"\0".join([source, torch.__version__.encode(), sys.version.encode(),
                                     " ".join(_command("S", "T")).encode()])).hexdigest()[:20]
    return os.path.join(cache_dir(), f"{_MODULE_NAME}-{key}.so")


def build(verbose=False):
    """Compile the extension if it is not cached; returns the library's path.
    Concurrent builders (processes, threads) wait for one build; the file
    appears atomically (written aside, then renamed)."""
    target = library_path()
    if os.path.exists(target):
        return target
    os.makedirs(os.path.dirname(target), exist_ok=True)
    import fcntl  # POSIX only; elsewhere the import error is the build error
    with open(target + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if os.path.exists(target):
            return target
        fd, tmp = tempfile.mkstemp(suffix=".so", dir=os.path.dirname(target))
        os.close(fd)
        try:
            if verbose:
                print(f"[d2s] building the native executor into {target}", file=sys.stderr)
            try:
                done = subprocess.run(_command(_SOURCE, tmp), capture_output=True, text=True)
            except OSError as e:
                raise NativeBuildError(f"no C++ compiler ({e})") from None
            if done.returncode != 0:
                raise NativeBuildError("compiling runtime/native/segment.cpp failed:\n" + done.stderr[-4000:])
            os.replace(tmp, target)
        finally:
            if os.path.exists(tmp):
                os.remove(tmp)
    return target


def _load_module(path):
    spec = importlib.util.spec_from_file_location(_MODULE_NAME, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def load():
    """The extension module, building it on first use; None when native
    segments are off or cannot be built (a warning says why, once)."""
    if not enabled():
        return None
    if _state["tried"]:
        return _state["module"]
    with _lock:
        if not _state["tried"]:
            try:
                path = library_path()
                if not os.path.exists(path):
                    print("[d2s] compiling the native executor (once per torch version, ~15 s; "
                          "D2S_NATIVE=0 turns it off)", file=sys.stderr, flush=True)
                _state["module"] = _load_module(build())
            except Exception as e:  # noqa: BLE001 - any failure means: run as Python code
                _state["error"] = e
                warnings.warn(f"d2s: the native executor is unavailable, programs run as Python code "
                              f"(same results, slower): {e}", RuntimeWarning, stacklevel=2)
            _state["tried"] = True
    return _state["module"]


def loaded():
    """The module `load()` loaded, without reading the environment again:
    for calls made on every run of a program that give the same results
    with or without it (the training ops' engine calls). Until a load
    succeeded, `load()`."""
    module = _state["module"]
    return module if module is not None else load()


def unavailable_reason():
    """Why `load()` returned None (after it was called), or None."""
    if not enabled():
        return "D2S_NATIVE=0"
    return None if _state["module"] is not None else _state["error"]
