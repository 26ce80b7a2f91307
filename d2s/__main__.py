"""Command line for saved models; needs no model source code.

    python -m d2s inspect DIR
    python -m d2s run DIR --input x=x.npy [--input y=y.npy ...] [--output-dir OUT]
    python -m d2s show DIR [-o out.svg]       (Graphviz; .svg/.png/.pdf, or .dot for the text)
    python -m d2s export-onnx DIR out.onnx [--opset N]

`inspect` prints the format version, producer versions, feeds, fetches,
parameter count and the program text. `run` feeds .npy files (read with
`allow_pickle=False`) and writes `OUT/<fetch>.npy` or prints a summary of
each output. Mistakes in the command (an unknown or missing input, a wrong
shape or dtype, an unreadable file, an invalid model) exit with status 2 and
one line on stderr.

Only `runtime` and `ops` are used, so a model runs without any of the code
that produced it.
"""

import argparse
import os
import re
import shutil
import subprocess
import sys

import numpy as np
import torch

import ops  # noqa: F401 - fills the op registry the loader checks against
from runtime import Executor, ModelFormatError
from runtime.io import load_inference_model, read_model

from d2s.onnx import ExportError, export

EXIT_USAGE = 2


class UsageError(Exception):
    """A mistake in the command line; reported as one line, exit status 2."""


def _shown(name):
    """A name as printed: escaped if it holds anything non-printable, so no
    name can start a line of its own (the loader refuses such names; this
    holds even for a program built in memory)."""
    return name if name.isprintable() else ascii(name)


def _signature(var):
    # As the program text prints it: a symbol (`s0`, `2*s0`) or `any` for a run-time size.
    dims = ", ".join("any" if d == -1 else str(d) for d in var.dims)
    return f"{var.dtype_name}[{dims}]"


def _run_time_dims(var):
    return ", ".join(dict.fromkeys("any" if d == -1 else d for d in var.dims if not isinstance(d, int) or d == -1))


def inspect_model(dirname, out=None):
    out = out or sys.stdout
    model = read_model(dirname)
    block = model.program.global_block()
    n_elements = sum(t.numel() for t in model.params.values())
    producer = ", ".join(f"{k} {v}" for k, v in model.producer.items())
    print(f"model: {dirname}", file=out)
    print(f"format version: {model.format_version}", file=out)
    print(f"producer: {producer}", file=out)
    if model.mode is not None:
        also = f"; the {model.alternate.mode} program is saved too" if model.alternate else " only"
        print(f"mode: {model.mode}{also}", file=out)
    print("feeds:", file=out)
    for name in model.feed_names:
        print(f"  {_shown(name)}: {_signature(block.vars[name])}", file=out)
    print("fetches:", file=out)
    for name in model.fetch_names:
        print(f"  {_shown(name)}: {_signature(block.vars[name])}", file=out)
    if model.outputs is not None and model.outputs != ("fetch", 0):
        print(f"returns: {_structure(model.outputs, model.fetch_names)}", file=out)
    print(f"parameters: {n_elements:,} elements in {len(model.params)} tensors", file=out)
    print("program:", file=out)
    print(model.program.to_string(), end="", file=out)


def _structure(tree, fetch_names):
    """A returned structure in Python's notation, fetches by (escaped) name."""
    tag, body = tree
    if tag == "fetch":
        return _shown(fetch_names[body])
    if tag == "number":
        return f"{_shown(fetch_names[body])}.item()"
    if tag == "const":
        return repr(body)
    if tag is dict:
        return "{" + ", ".join(f"{k!r}: {_structure(v, fetch_names)}" for k, v in body.items()) + "}"
    items = [_structure(item, fetch_names) for item in body]
    if tag is list:
        return "[" + ", ".join(items) + "]"
    if tag is tuple:
        return "(" + ", ".join(items) + ("," if len(items) == 1 else "") + ")"
    if tag is torch.Size:
        return "torch.Size([" + ", ".join(items) + "])"
    fields = getattr(tag, "_fields", None)
    if fields:
        items = [f"{f}={item}" for f, item in zip(fields, items)]
    return f"{tag.__name__}(" + ", ".join(items) + ")"


def _parse_inputs(pairs):
    inputs = {}
    for pair in pairs:
        name, sep, path = pair.partition("=")
        if not sep or not name or not path:
            raise UsageError(f"--input expects NAME=FILE.npy, got {pair!r}")
        if name in inputs:
            raise UsageError(f"input {name!r} is given twice")
        inputs[name] = path
    return inputs


def _load_feed(name, path, var):
    import torch

    try:
        with open(path, "rb") as f:
            magic = f.read(6)
        if magic != b"\x93NUMPY" and not magic.startswith(b"PK"):
            raise ValueError("not a .npy file (write one with numpy.save)")
        array = np.load(path, allow_pickle=False)
    except (OSError, ValueError, EOFError) as exc:
        if "allow_pickle" in str(exc):
            exc = "it holds Python objects (pickled data), which are never loaded; save a numeric array"
        raise UsageError(f"cannot read input {name!r} from {path!r}: {exc}") from None
    if not isinstance(array, np.ndarray):
        raise UsageError(f"input {name!r}: {path!r} holds several arrays (.npz); give one .npy file")
    try:
        tensor = torch.from_numpy(np.ascontiguousarray(array))
    except TypeError:
        raise UsageError(f"input {name!r} has dtype {array.dtype}, which tensors cannot hold") from None
    if tensor.dim() != len(var.shape) or any(d not in (-1, s) for d, s in zip(var.shape, tensor.shape)):
        raise UsageError(f"input {name!r} has shape {list(array.shape)} but the model expects "
                         f"{_signature(var)} ({_run_time_dims(var)}: any size)")
    # float64 -> float32 or int -> float is what a user means (np.random
    # gives float64); float -> int or int -> bool would silently change values.
    if tensor.dtype != var.dtype and not torch.can_cast(tensor.dtype, var.dtype):
        raise UsageError(f"input {name!r} has dtype {array.dtype} but the model expects {var.dtype_name}")
    return tensor.to(var.dtype)


def run_model(dirname, input_pairs, output_dir=None, out=None):
    out = out or sys.stdout
    if output_dir is not None and os.path.exists(output_dir) and not os.path.isdir(output_dir):
        raise UsageError(f"--output-dir {output_dir!r} exists and is not a directory")
    executor = Executor()
    program, feed_names, fetch_vars = load_inference_model(dirname, executor)
    block = program.global_block()
    given = _parse_inputs(input_pairs)
    valid = ", ".join(feed_names) or "none"
    for name in given:
        if name not in feed_names:
            raise UsageError(f"the model has no input {name!r}; its inputs are: {valid}")
    for name in feed_names:
        if name not in given:
            raise UsageError(f"missing input {name!r} ({_signature(block.vars[name])}); "
                             f"pass --input {name}=FILE.npy")
    feed = {name: _load_feed(name, given[name], block.vars[name]) for name in feed_names}
    results = executor.run(program, feed=feed, fetch_list=fetch_vars)
    if output_dir is not None:
        try:
            os.makedirs(output_dir, exist_ok=True)
        except OSError as exc:
            raise UsageError(f"cannot create --output-dir {output_dir!r}: {exc.strerror}") from None
    for i, (var, value) in enumerate(zip(fetch_vars, results)):
        value = np.asarray(value)
        label = output_name(i, var.name)
        if output_dir is not None:
            path = os.path.join(output_dir, label + ".npy")
            np.save(path, value, allow_pickle=False)
            print(f"{label}: wrote {path} ({value.dtype}, shape {list(value.shape)})", file=out)
        else:
            print(_summary(label, value), file=out)


def output_name(index, fetch_name):
    """What an output is called on the command line and in OUT/: its fetch
    name, or `output_<index>` where that name is a generated temporary
    (`tmp_5` says nothing about the value)."""
    if re.fullmatch(r"tmp_[0-9]+", fetch_name):
        return f"output_{index}"
    return re.sub(r"[^\w.-]", "_", fetch_name)


GRAPHVIZ_HINT = ("Graphviz's `dot` program is not installed; install it (Debian/Ubuntu: apt-get install graphviz; "
                 "macOS: brew install graphviz; conda: conda install graphviz), or write the DOT text with -o FILE.dot")


def show_model(dirname, output=None, out=None):
    """Write a picture of the saved program (DOT text to stdout without -o)."""
    out = out or sys.stdout
    model = read_model(dirname)
    text = model.program.to_dot(model.feed_names, model.fetch_names)
    if output is None:
        print(text, end="", file=out)
        return
    fmt = os.path.splitext(output)[1].lstrip(".").lower()
    if fmt == "dot" or fmt == "gv":
        with open(output, "w", encoding="utf-8") as f:
            f.write(text)
    else:
        if fmt not in ("svg", "png", "pdf"):
            raise UsageError(f"-o {output!r}: use a .svg, .png, .pdf or .dot file name")
        dot = shutil.which("dot")
        if dot is None:
            raise UsageError(GRAPHVIZ_HINT)
        result = subprocess.run([dot, f"-T{fmt}", "-o", output], input=text, text=True, capture_output=True)
        if result.returncode != 0:
            last = (result.stderr.strip().splitlines() or ["no message"])[-1]
            raise UsageError(f"Graphviz failed to render {output!r}: {last}")
    print(f"wrote {output}", file=out)


def export_onnx(dirname, output, opset=None, out=None):
    """Write the saved model as ONNX (cond -> If, while -> Loop)."""
    out = out or sys.stdout
    try:
        import onnx  # noqa: F401
    except ImportError:
        raise UsageError('export-onnx needs the onnx package: pip install "d2s[onnx]"') from None
    print(f"loading {dirname}", file=out, flush=True)
    try:
        export(dirname, output, opset_version=opset, progress=lambda m: print(m, file=out, flush=True))
    except ExportError as exc:
        raise UsageError(str(exc)) from None
    print(f"wrote {output}", file=out)


def _summary(name, value):
    head = f"{name}: {value.dtype}, shape {list(value.shape)}"
    if value.size and (np.issubdtype(value.dtype, np.number) or value.dtype == np.bool_):
        numbers = value.astype(np.float64)
        head += f", min {numbers.min():.6g}, max {numbers.max():.6g}, mean {numbers.mean():.6g}"
    values = np.array2string(value, threshold=20, edgeitems=3, precision=6)
    return head + "\n  " + values.replace("\n", "\n  ")


def _parser():
    parser = argparse.ArgumentParser(prog="python -m d2s", description="Inspect and run saved d2s models.")
    commands = parser.add_subparsers(dest="command", required=True)
    inspect = commands.add_parser("inspect", help="print a saved model's program, feeds, fetches and parameters")
    inspect.add_argument("dir", help="directory written by save_inference_model")
    run = commands.add_parser("run", help="run a saved model on .npy inputs")
    run.add_argument("dir", help="directory written by save_inference_model")
    run.add_argument("--input", action="append", default=[], metavar="NAME=FILE.npy",
                     help="feed NAME from a .npy file (repeat for each input)")
    run.add_argument("--output-dir", metavar="OUT", help="write OUT/<fetch>.npy instead of printing")
    onnx = commands.add_parser("export-onnx", help="write a saved model as an ONNX model")
    onnx.add_argument("dir", help="directory written by save_inference_model")
    onnx.add_argument("output", help="the .onnx file to write")
    onnx.add_argument("--opset", type=int, default=None, help="ONNX opset version (default 18)")
    show = commands.add_parser("show", help="draw a saved model's program with Graphviz")
    show.add_argument("dir", help="directory written by save_inference_model")
    show.add_argument("-o", "--output", metavar="FILE", help="out.svg / .png / .pdf (needs Graphviz) or .dot; "
                                                             "default: DOT text on stdout")
    return parser


def main(argv=None):
    args = _parser().parse_args(argv)
    try:
        if args.command == "inspect":
            inspect_model(args.dir)
        elif args.command == "show":
            show_model(args.dir, args.output)
        elif args.command == "export-onnx":
            export_onnx(args.dir, args.output, args.opset)
        else:
            run_model(args.dir, args.input, args.output_dir)
    except ModelFormatError as exc:
        # Verification messages show the bad op among its neighbours on
        # further lines; the command line reports the first one.
        print(f"error: invalid model: {str(exc).splitlines()[0] if str(exc) else exc!r}", file=sys.stderr)
        return EXIT_USAGE
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except BrokenPipeError:
        # `python -m d2s inspect DIR | head`: the reader left; say nothing more.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
