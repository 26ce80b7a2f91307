"""Rules a saved program must follow beyond `Program.verify()`: size limits
and the shape of names. A model directory is untrusted input; these rules
keep loading fast and bounded, and keep every name printable and usable as
a file name, a Python local and a state-dict key.

Limits (defaults in `LoadLimits`; override for one load with
`load_inference_model(dirname, executor, limits=LoadLimits(max_vars=10**6))`,
or process-wide with `runtime.format_rules.DEFAULT_LIMITS = LoadLimits(...)`):

    max_file_bytes   size of program.json, checked before it is read
    max_blocks, max_vars, max_ops   counts, checked before anything is built
    max_name_length  characters in one variable name

Names: dot-separated parts (`encode.weight`, `0.bias`, `h_2`), each part
ASCII letters/digits/underscores or a Python identifier already in NFKC
form; at most `max_name_length` characters. That excludes `../`, `/`, NUL,
newlines and every other control or format character (right-to-left
overrides included). Two names of one program may not become equal once
sanitised (`a.b` and `a_b` are both the local `v_a_b` and the file `a_b.npy`).

State-dict keys, which PyTorch lets be any text (`add_module('conv-1',
...)`), are not variable names: `safe_names` gives each persistable a valid,
distinct name, and a saved state records key and name (`check_key`).
"""

import dataclasses
import re
import unicodedata

from .errors import ModelFormatError


@dataclasses.dataclass(frozen=True)
class LoadLimits:
    max_file_bytes: int = 64 * 2**20
    max_blocks: int = 10_000
    max_vars: int = 500_000
    max_ops: int = 500_000
    max_name_length: int = 256


DEFAULT_LIMITS = LoadLimits()

_ASCII_PART = re.compile(r"[A-Za-z0-9_]+")


def current_limits(limits=None):
    return limits if limits is not None else DEFAULT_LIMITS


def check_size(what, count, limit, field):
    if count > limit:
        raise ModelFormatError(f"{what}: {count:,} exceeds the limit of {limit:,} "
                               f"(LoadLimits.{field}; raise it for a model you trust)")


def _valid_part(part):
    if _ASCII_PART.fullmatch(part):
        return True
    return part.isidentifier() and unicodedata.normalize("NFKC", part) == part


def check_name(name, where, limits=None):
    """Raise ModelFormatError unless `name` is a well-formed variable name."""
    limit = current_limits(limits).max_name_length
    if not isinstance(name, str) or not name:
        raise ModelFormatError(f"{where}: a variable name must be a non-empty string, got {name!r:.60}")
    if len(name) > limit:
        raise ModelFormatError(f"{where}: variable name {escape(name[:40])}... is {len(name)} characters "
                               f"long (limit {limit}, LoadLimits.max_name_length)")
    if not all(_valid_part(p) for p in name.split(".")):
        raise ModelFormatError(f"{where}: {escape(name)} is not a valid variable name (dot-separated "
                               "identifiers: no '/', '..', spaces, control or direction characters)")


def check_key(key, where, limits=None):
    """Raise ModelFormatError unless `key` can be a state-dict key of a
    loaded layer: PyTorch's module and parameter names are any text without
    '.', so each dot-separated part is non-empty printable text (spaces and
    '-' allowed; no control or direction characters). A key names a module
    attribute only; the tensor's variable and file name is a checked name."""
    limit = current_limits(limits).max_name_length
    if not isinstance(key, str) or not key or len(key) > limit:
        raise ModelFormatError(f"{where}: a state-dict key must be a string of 1 to {limit} characters, "
                               f"got {key!r:.60}")
    if not key.isprintable() or "" in key.split("."):
        raise ModelFormatError(f"{where}: {escape(key)} is not a valid state-dict key (printable text, "
                               "no empty part between dots)")


def sanitised(name):
    """The form a name takes as a Python local, a file name or a module key."""
    return re.sub(r"\W", "_", unicodedata.normalize("NFKC", name))


def safe_names(keys, limits=None):
    """{key: variable name} for state-dict keys: each name valid and no two
    equal once sanitised. PyTorch takes any module name (`add_module('conv-1',
    ...)`, and `level2_0` beside a ModuleList's `level2.0`); a key that is
    already a valid name keeps it, others get their invalid characters as
    `_`, and a collision a `_N` suffix. Valid keys are placed first so that
    one is never renamed for another's sake, and the result depends only on
    `keys` and their order: every trace of a module names it the same."""
    limit = current_limits(limits).max_name_length
    out, taken = {}, set()
    for key in keys:
        if _is_valid(key, limit) and sanitised(key) not in taken:
            out[key] = key
            taken.add(sanitised(key))
    for key in keys:
        if key in out:
            continue
        parts = [p if _valid_part(p) else re.sub(r"[^A-Za-z0-9_]", "_", p) or "_" for p in key.split(".")]
        base = ".".join(parts)[:limit - 8].rstrip(".")  # room for a suffix
        name, n = base, 0
        while sanitised(name) in taken:
            n += 1
            name = f"{base}_{n}"
        out[key] = name
        taken.add(sanitised(name))
    return out


def _is_valid(name, limit):
    return 0 < len(name) <= limit and all(_valid_part(p) for p in name.split("."))


def check_collisions(names, where):
    seen = {}
    for name in names:
        key = sanitised(name)
        if key in seen and seen[key] != name:
            raise ModelFormatError(f"{where}: variable names {escape(seen[key])} and {escape(name)} are the "
                                   "same once sanitised (as locals, file and parameter names); rename one")
        seen[key] = name


def escape(text):
    """`text` quoted with every non-printable character escaped, for
    messages and the CLI: a name can never start a new line of output or
    reverse the direction of the text after it."""
    return repr(str(text)) if text.isprintable() else ascii(str(text))
