"""What every part of the ONNX exporter shares (onnx_export, onnx_checks,
onnx_ops): the error that names the op and the user's line, and ONNX's
element types for the IR's dtype names. The bottom of the exporter: it
imports nothing of ours, and `onnx` only when a table is first read.
"""


class OnnxExportError(ValueError):
    """The program cannot be expressed in ONNX: the message names the op
    and the user's line that created it."""


def _span(ops):
    lines = [op.origin[1] for op in ops if op.origin]
    where = f" (lines {min(lines)}-{max(lines)} of {ops[0].origin[0]})" if lines else ""
    return f"{ops[0].type!r} .. {ops[-1].type!r}{where}"


def _origin(op):
    if not op.origin:
        return "(no source location saved with the program)"
    filename, lineno, line = op.origin
    return f'created at File "{filename}", line {lineno}' + (f": {line.strip()}" if line else "")


def op_error(op, message):
    return OnnxExportError(f"cannot export op {op.type!r} to ONNX: {message}; {_origin(op)}")


_ELEM_NAMES = {"float32": "FLOAT", "float64": "DOUBLE", "float16": "FLOAT16", "bfloat16": "BFLOAT16",
               "int64": "INT64", "int32": "INT32", "int16": "INT16", "int8": "INT8", "uint8": "UINT8",
               "bool": "BOOL", "complex64": "COMPLEX64", "complex128": "COMPLEX128"}


class _LazyTable(dict):
    def __init__(self, build):
        super().__init__()
        self._build = build

    def __missing__(self, key):
        if not dict.__len__(self):
            self.update(self._build())
        return dict.__getitem__(self, key)


def _elem_table():
    from onnx import TensorProto
    return {name: getattr(TensorProto, attr) for name, attr in _ELEM_NAMES.items()}


def _numpy_table():
    import numpy as np
    return {"float32": np.float32, "float64": np.float64, "float16": np.float16, "int64": np.int64,
            "int32": np.int32, "int16": np.int16, "int8": np.int8, "uint8": np.uint8, "bool": np.bool_}


_ELEM = _LazyTable(_elem_table)
_NUMPY = _LazyTable(_numpy_table)


def elem_type(dtype_name):
    return _ELEM[dtype_name]
