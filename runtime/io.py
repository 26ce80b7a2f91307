"""Saving and loading inference models.

A saved model is a directory with two files:

    program.json          {"format": "d2s.inference_model", "format_version": 2,
                           "producer": {"d2s": "0.1.0", "torch": "2.x"},
                           "feed": [names], "fetch": [names],
                           "outputs": <runtime.output_tree> (optional),
                           "program": <runtime.serialization.program_to_dict>}
    params.safetensors    one tensor per persistable variable of the program

Loading treats the directory as untrusted: it validates every field, every op
type against the registry (the allowlist) and every parameter against its
declared variable before anything is bound or run, and it never unpickles.
Saving writes a fresh directory next to the target and swaps it in, so an
interrupted save leaves the previous model loadable.
"""

import functools
import json
import os
from collections import namedtuple

import torch

from .atomic_dir import write_atomically
from .errors import ModelFormatError, ProgramError
from .executor import resolve_persistables
from .ir import Variable, default_main_program, dtype_name
from .modes import mode_from_ops
from .optable import get_op_def
from .prune import prune_program
from .run_modes import check_autocast_attr
from . import output_tree
from .format_rules import check_key, check_name, check_size, current_limits, escape, safe_names
from .serialization import FORMAT_VERSION, READABLE_VERSIONS, program_from_dict, program_to_dict

PROGRAM_FILE = "program.json"
PARAMS_FILE = "params.safetensors"
FORMAT_NAME = "d2s.inference_model"

SavedModel = namedtuple("SavedModel", "program feed_names fetch_names params format_version producer "
                                     "mode alternate state outputs state_updates both_modes paths one_mode",
                        defaults=(None, None, None, None, (), False, (), None))
SavedModel.__doc__ = """A validated model directory, parameters not yet bound
(`params`: name -> tensor). What `python -m d2s inspect` shows. `mode` is
"train" or "eval", the mode the program was traced in, or None (not
recorded: a loaded layer takes what its ops say, runtime/modes.py); `alternate` is the
program of the other mode, an `Alternate`, when it differs; `state` is
{"parameters": {key: name}, "buffers": {key: name}}, the saved module's
state-dict keys in order, each with the variable (params name) holding its
tensor, or None. `outputs` is what a call returns around the fetches
(runtime/output_tree.py), or None: the fetches, one tensor or a tuple.
`state_updates` are (persistable name, fetch index) pairs: after a run,
the module state that persistable holds becomes that fetch's value.
`both_modes`: the program was traced in both modes and came out the same,
so it serves both whatever its ops (runtime/modes.py). `paths` are
`Alternate`s of `mode` too: programs converted for other sides of the
decisions `program` holds (d2s/save_paths.py), tried in order when a run
raises DecisionFailed. `one_mode`: why the program of the other mode is
missing (it could not be converted), or None; a loaded layer then refuses
to switch to that mode, whatever its ops."""

Alternate = namedtuple("Alternate", "mode program feed_names fetch_names outputs state_updates",
                       defaults=(None, ()))
MODES = ("train", "eval")
MAX_PATHS = 64  # paths of one saved model (d2s saves at most 8)


# -- saving ---------------------------------------------------------------------------

def save_inference_model(dirname, feeded_var_names, target_vars, executor, main_program=None):
    """Save what `main_program` needs to compute `target_vars` from the feeds.

    The program is pruned to the ops the targets depend on (plus ops with
    side effects such as `print` / `assert`); backward and optimizer ops are
    dropped, and only the parameters the pruned program still reads are
    written. Values come from the tensors the program is bound to (or the
    global scope), detached and copied to CPU.

    The save is atomic: both files are written and fsynced in a temporary
    directory beside `dirname`, which then replaces `dirname`. If anything
    fails first, `dirname` is untouched. An existing `dirname` is replaced
    only if it holds nothing but a saved model.
    """
    del executor  # values are resolved from the program's bindings / the global scope
    program = main_program if main_program is not None else default_main_program()
    # The mode it was traced in, else (built under program_guard) what its ops say.
    save_model(dirname, (program, feeded_var_names, target_vars), mode=program.mode or mode_from_ops(program))


def save_model(dirname, main, mode=None, alternate=None, state=None, both_modes=False, paths=(), one_mode=None):
    """`save_inference_model` for one program or a train/eval pair.

    `main` and `alternate` are (program, feeds, targets[, outputs[,
    state_updates]]): `outputs` the tree of what a call returns around the
    targets (runtime/output_tree.py), `state_updates` (persistable name,
    target index) pairs, the module state a run replaces with that target's
    value for the next run; `mode` ("train" or
    "eval") is the mode `main` was built in, and `alternate`, if given, was
    built in the other one. `state` is {"parameters": {name: tensor},
    "buffers": {name: tensor}}, a module's state in state-dict order, saved
    so that a loaded layer has the same state-dict keys even for entries the
    programs do not read. `both_modes`: `main` was traced in both modes and
    came out the same (no `alternate` then). `paths`: parts like `main`,
    converted for other sides of its decisions (d2s/save_paths.py).
    `one_mode`: why `main` serves `mode` only (the other mode's program
    could not be converted), or None.
    """
    params, held_as = {}, {}
    doc = {"format": FORMAT_NAME, "format_version": FORMAT_VERSION, "producer": producer_versions()}
    if mode is not None:
        doc["mode"] = mode
    doc.update(_saved_part(main, params, held_as))
    if alternate is not None:
        doc["alternate"] = {"mode": MODES[1 - MODES.index(mode)], **_saved_part(alternate, params, held_as)}
    if both_modes:
        doc["both_modes"] = True
    if one_mode is not None:
        doc["one_mode"] = one_mode
    if paths:
        doc["paths"] = [_saved_part(p, params, held_as) for p in paths]
    if state is not None:
        doc["state"] = _saved_state(state, params, held_as)
    text = _dump_document(doc)
    # Never write what `load_inference_model` would reject.
    written = json.loads(text)
    _parse_document(written, "program being saved")
    _parse_modes_and_state(written, "program being saved", None)
    write_atomically(dirname, {PROGRAM_FILE: text}, {PARAMS_FILE: functools.partial(_save_params, params)})


def _saved_state(state, params, held_as):
    """The "state" field: per kind, each state-dict key as the name of the
    variable that holds its tensor, or [key, name] where they differ (a key
    that is no valid name: `add_module('conv-1', ...)`). A key the programs
    read is saved as their variable (found by the tensor itself, so tied
    weights stay one tensor); any other gets a free valid name, its tensor
    added to `params` (which holds the programs' variables on entry)."""
    from_programs = set(params)
    fresh = safe_names([key for values in state.values() for key in values])
    taken = from_programs | set(fresh.values())
    out = {}
    for kind, values in state.items():
        out[kind] = []
        for key, value in values.items():
            # By the tensor, never by name: an unread buffer `const_0` is not the lifted constant `const_0`.
            name, _ = held_as.get(id(value), (None, None))
            if name is None:
                name = fresh[key]
                if name in from_programs:  # a lifted constant's name (`const_0`): another tensor's
                    n = 1
                    while f"{name}_{n}" in taken:
                        n += 1
                    name = f"{name}_{n}"
                    taken.add(name)
                params[name] = value.detach().to("cpu", copy=True).contiguous()
                held_as[id(value)] = (name, value)
            out[kind].append(key if name == key else [key, name])
    return out


def _save_params(params, path):
    from safetensors.torch import save_file

    save_file(params, path, metadata={"format": FORMAT_NAME, "format_version": str(FORMAT_VERSION)})


def refuse_live_ops(program):
    """An op holding a live Python object (a custom autograd.Function) runs
    in memory but cannot be written: a saved program names only table ops."""
    for block in program.blocks:
        for op in block.ops:
            what = get_op_def(op.type).live_object
            if what:
                where = f"{op.origin[0]}:{op.origin[1]}: " if op.origin else ""
                held = next((a for a in op.attrs.get("args", ()) if hasattr(a, "function")), None)
                raise ValueError(
                    f"{where}cannot save: the program calls {what} ({held!r}), user code that a saved "
                    "program cannot name (loading runs only torch's own ops); the declarative model runs and "
                    "trains in memory, or write the function with torch ops and let autograd derive its "
                    "backward to save it")


def _saved_part(part, params, held_as):
    """{"feed", "fetch", "outputs", "state_updates", "program"} for one
    (program, feeds, targets[, outputs[, state_updates]]), pruned to what
    the targets need; its parameter values are added to `params`, and the
    tensors they are bound to to `held_as` (id -> (variable name, tensor))."""
    program, feeds, targets, *rest = part
    outputs, updates = (list(rest) + [None, None])[:2]
    feed_names = [v.name if isinstance(v, Variable) else v for v in feeds]
    targets = list(targets) if isinstance(targets, (list, tuple)) else [targets]
    fetch_names = [v.name if isinstance(v, Variable) else v for v in targets]
    _check_endpoints(program, feed_names, fetch_names)
    refuse_live_ops(program)
    pruned = prune_program(program, feed_names, fetch_names)
    try:
        pruned.verify()
    except ProgramError as exc:
        raise ValueError(f"cannot save: the pruned program is not valid: {exc}") from exc
    param_vars = pruned.persistable_vars()
    values = resolve_persistables(program, [v.name for v in param_vars])
    for var, value in zip(param_vars, values):
        held_as.setdefault(id(value), (var.name, value))  # the tensor kept: its id stays its own
        value = _param_value(var, value)
        held = params.setdefault(var.name, value)
        if held is not value and (held.shape != value.shape or held.dtype != value.dtype
                                  or not torch.equal(held, value)):
            # One file holds one value per name: two programs reading
            # different values under it would silently share one.
            raise ValueError(f"cannot save: two programs of this model hold different values under the name "
                             f"{var.name!r}")
    doc = {"feed": feed_names, "fetch": fetch_names}
    if outputs is not None:
        doc["outputs"] = output_tree.to_json(outputs, "this function")
    kept = pruned.global_block().vars
    updates = [[name, index] for name, index in updates or () if name in kept]  # state nothing kept reads: gone
    if updates:
        doc["state_updates"] = updates
    if program.autocast:  # traced under autocast: it runs only there (runtime/run_modes.py)
        doc["autocast"] = program.autocast
    if program.default_dtype not in (None, torch.float32):  # likewise (absent: float32, torch's own default)
        doc["default_dtype"] = dtype_name(program.default_dtype)
    return dict(doc, program=program_to_dict(pruned))


def _dump(value):
    return json.dumps(value, allow_nan=False)


def _dump_document(doc):
    """program.json's text: one line per variable and per op, so that the
    file reads (and diffs) like the program it holds."""
    lines = ["{"]
    lines += [f" {_dump(k)}: {_dump(v)}," for k, v in doc.items() if k not in ("program", "alternate", "paths")]
    if "alternate" in doc:
        head = {k: v for k, v in doc["alternate"].items() if k != "program"}
        lines.append(f' "alternate": {_dump(head)[:-1]},\n' + _dump_program(doc["alternate"]["program"]) + "},")
    if "paths" in doc:
        parts = []
        for path in doc["paths"]:
            head = {k: v for k, v in path.items() if k != "program"}
            parts.append(f'  {_dump(head)[:-1]},\n' + _dump_program(path["program"]) + "}")
        lines.append(' "paths": [\n' + ",\n".join(parts) + "],")
    lines.append(_dump_program(doc["program"]))
    return "\n".join(lines) + "\n}\n"


def _dump_program(program):
    dump = _dump
    blocks = []
    for block in program["blocks"]:
        head = {k: v for k, v in block.items() if k not in ("vars", "ops")}
        parts = [f"  {dump(head)[:-1]},"]
        for key in ("vars", "ops"):
            items = ",\n".join(f"    {dump(item)}" for item in block[key])
            parts.append(f'   "{key}": [\n{items}\n   ]' if items else f'   "{key}": []')
        blocks.append(parts[0] + "\n" + ",\n".join(parts[1:]) + "}")
    return ' "program": {"blocks": [\n' + ",\n".join(blocks) + "\n ]}"


def _check_endpoints(program, feed_names, fetch_names):
    block = program.global_block()
    for name in feed_names:
        var = block.vars.get(name)
        if var is None or not var.is_data:
            known = ", ".join(v.name for v in program.data_vars()) or "none"
            raise ValueError(f"feed {name!r} is not a data variable of the program (data variables: {known})")
    if len(set(feed_names)) != len(feed_names):
        raise ValueError(f"feed names repeat: {feed_names}")
    # No targets is a program with no outputs (a forward returning no tensor):
    # it saves and loads, and running it returns nothing.
    for name in fetch_names:
        if name not in block.vars:
            raise ValueError(f"target {name!r} is not a variable of the program's global block")


def _param_value(var, value):
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"persistable variable {var.name!r} is bound to a {type(value).__name__}, "
                        "not a tensor; it cannot be saved")
    if tuple(value.shape) != tuple(var.shape) or value.dtype != var.dtype:
        raise ValueError(f"persistable variable {var.name!r} is declared {var.dtype_name}{list(var.shape)} "
                         f"but its value is {str(value.dtype).replace('torch.', '')}{list(value.shape)}")
    # A private copy: safetensors refuses tensors that share storage, and the
    # model keeps training while the file is written.
    return value.detach().to("cpu", copy=True).contiguous()


def producer_versions():
    try:
        from importlib.metadata import version
        d2s_version = version("d2s")
    except Exception:  # noqa: BLE001 - running from a source tree without metadata
        d2s_version = "unknown"
    return {"d2s": d2s_version, "torch": torch.__version__.split("+")[0]}


# -- loading ---------------------------------------------------------------------------

def load_inference_model(dirname, executor, limits=None):
    """Load a model saved by `save_inference_model`.

    Returns `[program, feed_target_names, fetch_targets]` (`fetch_targets`
    are the program's Variables); run it with
    `executor.run(program, feed={name: array}, fetch_list=fetch_targets)`.

    Everything is validated before anything is bound or run; a directory
    that is missing, truncated, of an unknown format version, names an op
    outside the allowlist, or whose parameters do not match the program
    raises ModelFormatError.

    The parameters are bound to the returned program (`program.bound`), not
    written into the global scope: two loaded models -- or a model and the
    program it was saved from -- may use the same parameter names without
    overwriting each other's values. They are placed on `executor`'s device.

    `limits` (a `runtime.format_rules.LoadLimits`) bounds the file size and
    the counts of blocks, variables and ops; the defaults suit any model
    d2s writes, raise them for a bigger one you trust.
    """
    device = getattr(getattr(executor, "place", None), "device", None)
    model = read_model(dirname, device, limits)
    program = model.program
    program.mode = model.mode
    for name, value in model.params.items():
        program.bind(name, value)
    if device is not None:
        program.device = device
    block = program.global_block()
    return [program, list(model.feed_names), [block.vars[n] for n in model.fetch_names]]


def read_model(dirname, device=None, limits=None):
    """The validated contents of a model directory as a SavedModel (params
    loaded, on `device` if given, not bound). Raises ModelFormatError."""
    dirname = os.fspath(dirname)
    if not os.path.isdir(dirname):
        raise ModelFormatError(f"{dirname}: no saved model here (not a directory)")
    program_path = os.path.join(dirname, PROGRAM_FILE)
    params_path = os.path.join(dirname, PARAMS_FILE)
    for path in (program_path, params_path):
        if not os.path.isfile(path):
            raise ModelFormatError(f"{dirname}: missing {os.path.basename(path)}; not a complete saved model")
    doc = _read_json(program_path, current_limits(limits).max_file_bytes)
    program, feed_names, fetch_names, outputs, updates = _parse_document(doc, program_path, limits)
    mode, alternate, state = _parse_modes_and_state(doc, program_path, limits)
    paths = _parse_paths(doc, mode, program_path, limits)
    programs = [program] + ([alternate.program] if alternate else []) + [p.program for p in paths]
    params = _read_params(params_path, programs, state, device)
    return SavedModel(program, feed_names, fetch_names, params, doc["format_version"], doc["producer"],
                      mode, alternate, state, outputs, updates, doc.get("both_modes", False), paths,
                      doc.get("one_mode"))


def _parse_paths(doc, mode, where, limits):
    """The `paths` of the main program: (Alternate of `mode`, ...)."""
    paths = doc.get("paths", [])
    if not isinstance(paths, list) or not all(isinstance(p, dict) for p in paths):
        raise ModelFormatError(f"{where}: \"paths\" must be a list of program parts")
    if len(paths) > MAX_PATHS:
        raise ModelFormatError(f"{where}: {len(paths)} paths; a saved model holds at most {MAX_PATHS}")
    return tuple(Alternate(mode, *_parse_part(p, f"{where}: path {i + 1}", limits)) for i, p in enumerate(paths))


def _reject_constant(name):
    raise ValueError(f"{name} is not valid JSON")


def _read_json(path, max_bytes):
    # Checked before reading: a huge file is refused without parsing it.
    check_size(f"{path}: size in bytes", os.path.getsize(path), max_bytes, "max_file_bytes")
    try:
        with open(path, "rb") as f:
            raw = f.read(max_bytes + 1)
        check_size(f"{path}: size in bytes", len(raw), max_bytes, "max_file_bytes")
        return json.loads(raw.decode("utf-8"), parse_constant=_reject_constant)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:  # JSONDecodeError is a ValueError
        raise ModelFormatError(f"{path}: not valid JSON ({type(exc).__name__}: {exc})") from None
    except OSError as exc:  # unreadable (permissions, a FIFO that fails, ...)
        raise ModelFormatError(f"{path}: cannot read it ({exc.strerror or exc})") from None


def _parse_document(doc, where, limits=None):
    """(program, feed names, fetch names, outputs, state updates) from program.json's contents."""
    if not isinstance(doc, dict):
        raise ModelFormatError(f"{where}: expected a JSON object at the top level")
    version = doc.get("format_version")
    if doc.get("format") != FORMAT_NAME or version is None:
        raise ModelFormatError(f"{where}: not a d2s model (expected \"format\": \"{FORMAT_NAME}\" "
                               "and a \"format_version\")")
    if type(version) is int and 0 < version < READABLE_VERSIONS[0]:
        raise ModelFormatError(f"{where}: format version {version} is older than the versions this d2s reads "
                               f"({READABLE_VERSIONS[0]} to {FORMAT_VERSION}; version 2 saves symbolic shapes); "
                               "save the model again with this d2s")
    if type(version) is not int or version not in READABLE_VERSIONS:
        raise ModelFormatError(f"{where}: format version {version!r} is not supported; this d2s reads "
                               f"versions {READABLE_VERSIONS[0]} to {FORMAT_VERSION} (a newer d2s may read it)")
    producer = doc.get("producer")
    if not isinstance(producer, dict) or len(producer) > 16 or not all(
            isinstance(v, str) and len(k) <= 64 and len(v) <= 64 and (k + v).isprintable()
            for k, v in producer.items()):
        # `inspect` prints them: no newlines or direction characters.
        raise ModelFormatError(f"{where}: \"producer\" must be an object of short printable version strings")
    return _parse_part(doc, where, limits)


def _parse_part(doc, where, limits):
    """(program, feed names, fetch names, outputs, state updates) of one program part."""
    names = {}
    for key in ("feed", "fetch"):
        value = doc.get(key)
        if not isinstance(value, list) or not all(isinstance(n, str) for n in value):
            raise ModelFormatError(f"{where}: \"{key}\" must be a list of variable names")
        if len(set(value)) != len(value):
            raise ModelFormatError(f"{where}: \"{key}\" lists a name twice: {value}")
        names[key] = value
    try:
        program = program_from_dict(doc.get("program"), limits)
        program.verify()
    except (ModelFormatError, ProgramError) as exc:
        raise ModelFormatError(f"{where}: invalid program: {exc}") from None
    program.autocast = _parse_autocast(doc, where)
    program.default_dtype = _parse_default_dtype(doc, where)
    block = program.global_block()
    for name in names["feed"]:
        if name not in block.vars or not block.vars[name].is_data:
            raise ModelFormatError(f"{where}: feed {name!r} is not a data variable of the program")
    for name in names["fetch"]:
        if name not in block.vars:
            raise ModelFormatError(f"{where}: fetch {name!r} is not a variable of the program's global block")
    return (program, names["feed"], names["fetch"], _parse_outputs(doc, names["fetch"], where, limits),
            _parse_state_updates(doc, program, names["fetch"], where))


def _parse_autocast(doc, where):
    """The autocast state a part was traced in (`Program.autocast`), or None."""
    value = doc.get("autocast")
    if value is None:
        return None
    problem = check_autocast_attr(value)
    if problem is None and not (value and all(entry[2] for entry in value)
                                and len({entry[0] for entry in value}) == len(value)):
        problem = "must list each device type autocast is on for once, enabled"
    if problem is not None:
        raise ModelFormatError(f"{where}: \"autocast\" {problem}")
    return value


def _parse_default_dtype(doc, where):
    """The default dtype a part was traced under (`Program.default_dtype`)."""
    value = doc.get("default_dtype", "float32")
    if value not in _DEFAULT_DTYPES:
        raise ModelFormatError(f"{where}: \"default_dtype\" must be one of {sorted(_DEFAULT_DTYPES)}, got {value!r}")
    return _DEFAULT_DTYPES[value]


# What torch.set_default_dtype accepts.
_DEFAULT_DTYPES = {dtype_name(d): d for d in (torch.float16, torch.bfloat16, torch.float32, torch.float64)}


def _parse_outputs(doc, fetch_names, where, limits):
    """The output tree of one program part, or None when it has none."""
    if "outputs" not in doc:
        return None
    return output_tree.from_json(doc["outputs"], len(fetch_names), where, current_limits(limits).max_vars)


def _parse_state_updates(doc, program, fetch_names, where):
    """(persistable name, fetch index) pairs: each a persistable variable of
    the global block, updated once, from a fetch of its own dtype and shape."""
    updates = doc.get("state_updates", [])
    if not isinstance(updates, list):
        raise ModelFormatError(f"{where}: \"state_updates\" must be a list of [name, fetch index] pairs")
    block, seen = program.global_block(), set()
    for pair in updates:
        if not (isinstance(pair, list) and len(pair) == 2 and isinstance(pair[0], str) and type(pair[1]) is int
                and 0 <= pair[1] < len(fetch_names)):
            raise ModelFormatError(f"{where}: state update {pair!r:.60} is not a [name, fetch index] pair")
        var, source = block.vars.get(pair[0]), block.vars[fetch_names[pair[1]]]
        if var is None or not var.persistable or pair[0] in seen:
            raise ModelFormatError(f"{where}: state update of {escape(pair[0])}: not a persistable variable "
                                   "of the global block, or updated twice")
        if list(var.shape) != list(source.shape) or var.dtype != source.dtype:
            raise ModelFormatError(f"{where}: state update of {escape(pair[0])} from a fetch of another "
                                   "dtype or shape")
        seen.add(pair[0])
    return tuple((name, index) for name, index in updates)


def _parse_modes_and_state(doc, where, limits):
    """(mode, Alternate or None, state or None) from the optional fields."""
    mode = doc.get("mode")
    if mode is not None and mode not in MODES:
        raise ModelFormatError(f"{where}: \"mode\" must be \"train\" or \"eval\", got {mode!r:.40}")
    alternate = doc.get("alternate")
    if alternate is not None:
        if not isinstance(alternate, dict) or mode is None or alternate.get("mode") not in MODES \
                or alternate.get("mode") == mode:
            raise ModelFormatError(f"{where}: \"alternate\" must hold the program of the mode other than "
                                   f"\"mode\" ({mode!r:.20})")
        alternate = Alternate(alternate["mode"], *_parse_part(alternate, f"{where}: alternate", limits))
    if doc.get("both_modes", False) not in (True, False) or doc.get("both_modes") and alternate is not None:
        raise ModelFormatError(f"{where}: \"both_modes\" must be true or false, and false with an \"alternate\"")
    one_mode = doc.get("one_mode")
    if one_mode is not None and (not isinstance(one_mode, str) or len(one_mode) > 2000 or mode is None
                                 or alternate is not None or doc.get("both_modes")):
        raise ModelFormatError(f"{where}: \"one_mode\" must be a short text, with a \"mode\" and without "
                               "\"alternate\" or \"both_modes\"")
    state = doc.get("state")
    if state is not None:
        state = _parse_state(state, where, limits)
    return mode, alternate, state


def _parse_state(state, where, limits):
    """{"parameters": {key: name}, "buffers": {key: name}} from the "state"
    field: each entry a name (the key is the variable's name) or [key, name]."""
    if not isinstance(state, dict) or set(state) != {"parameters", "buffers"}:
        raise ModelFormatError(f"{where}: \"state\" must be {{\"parameters\": [...], \"buffers\": [...]}}")
    out, kind_of = {}, {}
    for kind in ("parameters", "buffers"):
        if not isinstance(state[kind], list):
            raise ModelFormatError(f"{where}: state {kind} must be a list of names")
        check_size(f"{where}: number of state entries", len(state[kind]), current_limits(limits).max_vars,
                   "max_vars")
        out[kind] = {}
        for entry in state[kind]:
            key, name = entry if isinstance(entry, list) and len(entry) == 2 else (entry, entry)
            check_name(name, f"{where}: state {kind}", limits)
            check_key(key, f"{where}: state {kind}", limits)
            if any(key in keys for keys in out.values()):
                raise ModelFormatError(f"{where}: \"state\" lists the key {escape(key)} twice")
            # One tensor may hold several keys (tied weights), but it is a parameter or a buffer.
            if kind_of.setdefault(name, kind) != kind:
                raise ModelFormatError(f"{where}: state variable {escape(name)} is both a parameter and a buffer")
            out[kind][key] = name
    return out


def _read_params(path, programs, state, device):
    """The tensors of params.safetensors, checked against the programs'
    persistable variables (and the saved state's names). safetensors reads
    raw tensor bytes only: no code runs and nothing is unpickled."""
    from safetensors import safe_open

    expected = {}
    for program in programs:
        for var in program.persistable_vars():
            known = expected.setdefault(var.name, var)
            if (known.dtype, known.shape) != (var.dtype, var.shape):
                raise ModelFormatError(f"{path}: parameter {var.name!r} is declared differently by the train "
                                       "and eval programs")
    state_only = list(dict.fromkeys(n for names in (state or {}).values() for n in names.values()
                                    if n not in expected))
    try:
        with safe_open(path, framework="pt", device="cpu") as f:
            stored = list(f.keys())
            missing = sorted(set(expected) - set(stored))
            if state_only and not set(state_only) <= set(stored):
                missing += sorted(set(state_only) - set(stored))
            extra = sorted(set(stored) - set(expected) - set(state_only))
            if missing:
                raise ModelFormatError(f"{path}: missing parameter(s) {missing[:10]} the program needs")
            if extra:
                raise ModelFormatError(f"{path}: parameter(s) {extra[:10]} are not variables of the program")
            # A fresh copy of each: safetensors hands back views at the file's
            # byte offsets, so a tensor may start off a 64-byte boundary, and
            # CPU kernels (dot, mv, grouped conv) then take other vector paths
            # and round differently from the eager model the program came from.
            tensors = {name: f.get_tensor(name).clone() for name in list(expected) + state_only}
    except ModelFormatError:
        raise
    except Exception as exc:  # noqa: BLE001 - safetensors raises its own error types
        raise ModelFormatError(f"{path}: not a readable safetensors file (truncated or corrupt?): {exc}") from None
    for name, var in expected.items():
        value = tensors[name]
        if tuple(value.shape) != tuple(var.shape) or value.dtype != var.dtype:
            raise ModelFormatError(
                f"{path}: parameter {name!r} is {str(value.dtype).replace('torch.', '')}{list(value.shape)} "
                f"but the program declares {var.dtype_name}{list(var.shape)}")
    if device is not None:
        tensors = {n: t.to(device) for n, t in tensors.items()}
    return tensors
