"""convert_function: globals, closures, caching, methods, lambdas, source
locations; and the ConversionErrors users see, naming variable, file and line."""

import dataclasses
import functools
import inspect
import re
import traceback

import pytest
import torch

import d2s
from d2s import conversion, operators
from runtime.errors import ConversionError

HERE = __file__
COUNTER = []


def line_of(fn, text):
    """The file line number of the first line of ``fn`` containing ``text``."""
    lines, first = inspect.getsourcelines(fn)
    return first + next(i for i, line in enumerate(lines) if text in line)


def appends_to_global(x):
    COUNTER.append(1)
    if x > 0:
        return x * 2
    return x


def test_converted_function_shares_globals():
    converted = conversion.convert_function(appends_to_global)
    COUNTER.clear()
    assert converted(3) == 6 and converted(-1) == -1
    assert COUNTER == [1, 1]
    assert "_d2s" not in appends_to_global.__globals__  # helpers are not injected into user globals


def test_converted_closure_shares_cells():
    state = {"n": 0}
    total = 0

    def add(v):
        nonlocal total
        for i in range(v):
            total += i
        state["n"] += 1
        return total

    converted = conversion.convert_function(add)
    assert converted(4) == 6
    assert total == 6 and state["n"] == 1  # the original cell changed
    assert add(3) == 9 and converted(1) == 9


def test_conversion_is_cached():
    assert conversion.convert_function(appends_to_global) is conversion.convert_function(appends_to_global)
    converted = conversion.convert_function(appends_to_global)
    assert conversion.convert_function(converted) is converted
    assert operators.convert_call(converted) is converted


_SAME_TEXT = """import torch


def f(x):
    y = x[x > 0].tolist()
    return y
"""


def test_same_function_text_in_two_files_is_converted_for_each_file(tmp_path):
    # Code objects of the same text at the same lines compare equal whatever
    # their file: the conversion cache gave b.py's function a.py's converted
    # code, so its errors, tracebacks and op origins named a.py.
    import importlib.util
    fns = []
    for name in ("same_a", "same_b"):
        path = tmp_path / f"{name}.py"
        path.write_text(_SAME_TEXT)
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        fns.append((module.f, str(path)))
    assert fns[0][0].__code__ == fns[1][0].__code__  # what made the cache share them
    for fn, path in fns:
        assert conversion.convert_function(fn).__code__.co_filename == path
        with pytest.raises(ConversionError) as info:
            d2s.declarative(fn)(torch.ones(2))
        assert info.value.filename == path and info.value.lineno == 5


def test_defaults_and_keyword_only_arguments_are_kept():
    def f(x, k=2, *, scale=3):
        if x > 0:
            return x * k * scale
        return x

    converted = conversion.convert_function(f)
    assert converted(1) == 6 and converted(1, 1, scale=1) == 1 and converted(-1) == -1


class Box:
    def __init__(self, k):
        self.k = k

    def scale(self, x):
        while x < 100:
            x = x * self.k
        return x


class Child(Box):
    def scale(self, x):
        return super().scale(x) + 1


def test_bound_methods_and_zero_argument_super():
    assert conversion.convert_function(Box(3).scale)(1) == 243
    assert conversion.convert_function(Child(2).scale)(1) == 129


def test_lambda_is_converted():
    f = lambda v: v * 2 if v > 0 else -v  # noqa: E731
    converted = conversion.convert_function(f)
    assert conversion.is_converted(converted)
    assert converted(3) == 6 and converted(-3) == 3


# Lambdas whose lines do not parse alone (inside a multi-line dict) and two
# lambdas with the same parameters on one line: found in the whole file.
HARD_LAMBDAS = {
    "in_dict": lambda x: x * 2 if isinstance(x, torch.Tensor) else x,
    "other": lambda x: x + 1,
}
SAME_LINE = (lambda x: x * 3 if isinstance(x, torch.Tensor) else x, lambda x: x * 5 if isinstance(x, torch.Tensor) else x)


@pytest.mark.parametrize("fn, factor", [(HARD_LAMBDAS["in_dict"], 2), (SAME_LINE[0], 3), (SAME_LINE[1], 5)],
                         ids=["multi_line_expression", "first_on_line", "second_on_line"])
def test_lambda_in_a_multi_line_expression_or_shared_line_is_converted(fn, factor):
    assert conversion.is_converted(conversion.convert_function(fn))
    x = torch.tensor([1.0, -2.0])
    assert torch.equal(d2s.declarative(fn)(x), x * factor)  # unconverted, isinstance was False: x itself


class Activation:
    """A plain object called like a function (not an nn.Module)."""

    def __init__(self, scale):
        self.scale = scale

    def __call__(self, x):
        if not isinstance(x, torch.Tensor):  # False for a graph tensor in unconverted code
            return x
        if x.sum() > 0:
            return x * self.scale
        return x - self.scale


def calls_an_object(x):
    return _ACTIVATION(x)


_ACTIVATION = Activation(3.0)


def test_a_callable_objects_call_is_converted():
    static = d2s.declarative(calls_an_object)
    for x in (torch.ones(2), -torch.ones(2)):
        assert torch.equal(static(x), calls_an_object(x))
    types = {op.type for block in static.program_cache.last.main_program.blocks for op in block.ops}
    assert len(static.program_cache) == 1 and "cond" in types


def _scale(t, k):
    return t * k if isinstance(t, torch.Tensor) else t  # False for a graph tensor in unconverted code


def _is_tensor(t):
    return isinstance(t, torch.Tensor)


def _rank(t):
    return 0 if isinstance(t, torch.Tensor) else 1


def _add_tensors(acc, t):
    return acc + t if isinstance(t, torch.Tensor) else acc


def _partial(x):
    return functools.partial(_scale, k=2.0)(x)


def _map(x):
    return list(map(_scale, [x], [3.0]))[0]


def _filter(x):
    return list(filter(_is_tensor, [1.0, x]))[0] * 2


def _sorted_key(x):
    return x + sorted([1.0, x * 2], key=_rank)[0]


def _max_key(x):
    return x + max([x * 2, 5.0], key=_rank)


def _reduce(x):
    return functools.reduce(_add_tensors, [x, 1.0, x], x)


def _unbound_methods(x):
    """C methods of the tensor class called unbound, directly and through map,
    on graph tensors and on a constant tensor."""
    relu = list(map(torch.Tensor.relu, [x, -x]))
    return torch.Tensor.t(x.unsqueeze(0)).sum(1) + torch.Tensor.add(x, 1) + relu[0] - relu[1] \
        + torch.Tensor.__mul__(x, 2) + torch.Tensor.abs(torch.ones(2))


PASSED_FUNCTIONS = {f.__name__[1:]: f for f in (_partial, _map, _filter, _sorted_key, _max_key, _reduce,
                                                _unbound_methods)}


@pytest.mark.parametrize("name", sorted(PASSED_FUNCTIONS))
def test_functions_passed_to_builtins_are_converted(name):
    fn = PASSED_FUNCTIONS[name]
    x = torch.tensor([1.0, -2.0])
    assert torch.equal(d2s.declarative(fn)(x), fn(x))


def test_library_code_is_not_converted():
    assert operators.convert_call(torch.relu) is torch.relu
    assert operators.convert_call(inspect.getsource) is inspect.getsource
    assert operators.convert_call(len) is operators.convert_len


def test_get_code_and_code_level():
    code = conversion.get_code(appends_to_global)
    assert "convert_ifelse" in code and "convert_list_append(COUNTER, 1)" in code
    after_loops = conversion.get_code(appends_to_global, level=2)   # Unsupported, ForLoop
    assert "convert_ifelse" not in after_loops and "if x > 0" in after_loops
    assert d2s.ProgramTranslator().get_code(appends_to_global) == code


def raises_in_branch(x):
    if x > 0:
        y = x + 1
        raise ValueError("boom")
    return x


def test_tracebacks_name_the_user_file_and_line():
    converted = conversion.convert_function(raises_in_branch)
    with pytest.raises(ValueError) as info:
        converted(1)
    frames = traceback.extract_tb(info.tb)
    user = [f for f in frames if f.filename == HERE]
    assert user[-1].lineno == line_of(raises_in_branch, 'raise ValueError("boom")')
    assert user[-1].line == 'raise ValueError("boom")'
    assert not any("<" in f.filename for f in frames)  # no generated-code pseudo files


def branch_ops(x):
    if x.sum() > 0:
        y = torch.relu(x)
    else:
        y = torch.tanh(x)
    return y


def test_ops_record_the_user_line():
    main, *_ = d2s.ProgramTranslator().get_program(branch_ops, torch.ones(3))
    origins = {op.type: op.origin for b in main.blocks for op in b.ops}
    cond_origin = origins["cond"]
    assert cond_origin[0] == HERE and cond_origin[1] == line_of(branch_ops, "if x.sum() > 0")
    relu = next(op for b in main.blocks for op in b.ops if "relu" in op.type)
    assert relu.origin[1] == line_of(branch_ops, "torch.relu")


# -- errors -----------------------------------------------------------------------------------

def tensor_or_none(x):
    y = None
    if x.sum() > 0:
        y = x + 1
    return y


def dtype_changes(x, n):
    i = 0
    s = x.sum().long()
    while i < n:
        s = s * 0.5
        i += 1
    return s


def a_generator(x):
    yield x


G = None


def rebinds_global(x):
    global G
    G = x
    return x


def returns_tensor_or_none(x):
    if x.sum() > 0:
        return x


def pop_from_tensor_array(x, n):
    ys = []
    for i in range(n):
        ys.append(x * i)
    return ys.pop()


def tuple_grows_in_a_tensor_loop(x, n):
    h = (x, x)
    for i in range(n):
        h = h + (x * i,)
    return h[0]


def assigned_after_a_tensor_break(x):
    i = 0
    while i < 5:
        k = 1
        if x.sum() > 0:
            if x.max() > 1:
                break
            j = "two"
        i += 1
    return i + k + len(j)


def and_as_a_value_of_two_dtypes(x):
    r = x.sum() > 0 and x.mean()
    return r


def min_of_two_dtypes(x):
    return min(x.sum().long(), x.mean())


def isinstance_of_a_number_a_loop_makes_a_tensor(x):
    s = 0.0
    k = 0
    for e in x:
        k = k + (1 if isinstance(s, float) else 5)
        s = s + e
    return k + s


def isinstance_in_a_loop_carrying_a_list_by_item(x):
    s = 0.0
    k = 0
    hs = [x * 1.0, 0.5, [x * 0.0]]  # items of several kinds: carried item by item, not as a tensor array
    for e in x:
        k = k + (1 if isinstance(s, float) else 5)
        s = s + e
        hs[0] = hs[0] + x
    return k + s + hs[0] + hs[1] + hs[2][0]


def type_of_a_number_one_branch_makes_a_tensor(x, n):
    s = 1
    for i in range(n):  # (a tensor `if` alone is decided per side: tests/ops/test_number_or_tensor.py)
        if x.sum() > i:
            s = x.sum()
    return type(s) is int


def any_with_effects(x):
    ys = [x.clone(), x.clone()]
    return any(y.add_(1).sum() > 0 for y in ys)


def list_alias_in_a_tensor_loop(x, n):
    ys = [x]
    alias = ys
    for i in range(n):
        ys.append(x * i)
    return torch.stack(alias)


def list_alias_in_a_tensor_if(x):
    out = [x]
    alias = out
    if x.sum() > 0:
        out.append(x * 2)
    return torch.stack(alias)


def appends_to_the_callers_list(x, ys):
    if x.sum() > 0:
        ys.append(x * 2)
    return x + 1


def deletes_from_the_callers_dict(x, d):
    if x.sum() > 0:
        del d["k"]
    return x * 2


def dict_alias_changes_keys_in_a_tensor_if(x):
    d = {"k": x}
    alias = d
    if x.sum() > 0:
        d["new"] = x * 2
    return x, sorted(alias)


def _add_key(x, d):
    if x.sum() > 0:
        d["new"] = 1
    return x


def dict_a_helper_changes_keys_of(x):
    d = {"k": 0}
    _add_key(x, d)
    return x * 2, sorted(d)


def _append_rows(ys, x, n):
    for i in range(n):
        ys.append(x * i)


def list_changed_by_a_helper_loop(x, n):
    ys = [x]
    _append_rows(ys, x, n)
    return torch.stack(ys)


def number_then_tensor_alias(x, n):
    s = 0.0
    prev = s
    for i in range(n):
        prev = s
        s += x[i]
    return s, prev


def number_then_tensor_sum(x, n):
    s = 0.0
    for i in range(n):
        s += x[i]
    return s


def test_augmented_assignment_of_a_number_that_becomes_a_tensor_with_another_name_is_refused():
    """Eager: `prev` keeps the number on the first trip (`s += v` makes a new
    tensor) and sees the in-place update on later trips; one program cannot."""
    with pytest.raises(ConversionError) as info:
        d2s.declarative(number_then_tensor_alias)(torch.ones(3), torch.tensor(1))
    assert info.value.lineno == line_of(number_then_tensor_alias, "s += x[i]")
    assert "'prev' and 's' hold one value that is a Python number on some paths" in str(info.value)
    # Without the other name it converts: one program for runs with trips, one
    # for runs with none (eager's float 0.0 there, not a tensor).
    static = d2s.declarative(number_then_tensor_sum)
    x = torch.tensor([1.0, 2.0, 3.0])
    for n in (0, 1, 3):
        want, got = number_then_tensor_sum(x, torch.tensor(n)), static(x, torch.tensor(n))
        assert type(got) is type(want) and float(got) == float(want)
    assert len(static.program_cache) == 2


def test_a_list_a_helper_loop_appends_to_names_the_callers_variable():
    with pytest.raises(ConversionError) as info:
        d2s.declarative(list_changed_by_a_helper_loop)(torch.ones(3), torch.tensor(2))
    assert info.value.lineno == line_of(_append_rows, "for i in range(n)")
    assert "'ys' in list_changed_by_a_helper_loop() is another name for the list 'ys'" in str(info.value)
    # One name for the list: the same loop converts, and appends on every path as eager does.
    static = d2s.declarative(list_alias_free)
    for n in (0, 3):
        assert torch.equal(static(torch.ones(3), torch.tensor(n)), list_alias_free(torch.ones(3), torch.tensor(n)))
    assert any(op.type == "while" for op in static.program_cache.last.main_program.global_block().ops)


def test_a_dict_a_helper_changes_the_keys_of_names_the_callers_variable():
    with pytest.raises(ConversionError) as info:
        d2s.declarative(dict_a_helper_changes_keys_of)(torch.ones(3))
    assert info.value.lineno == line_of(_add_key, "if x.sum() > 0")
    assert "'d' in dict_a_helper_changes_keys_of() is another name for the dict 'd'" in str(info.value)


def list_alias_free(x, n):
    ys = _returned_rows(x, n)
    return torch.stack(ys)


def _returned_rows(x, n):
    ys = [x]
    for i in range(n):
        ys.append(x * i)
    return ys


@pytest.mark.parametrize("fn,args,line_text,pieces", [
    # The loop's tensor array is bound to `ys` only: `alias` (or the caller's list) kept the list as it was.
    (list_alias_in_a_tensor_loop, (torch.ones(3), torch.tensor(2)), "for i in range(n)",
     ["'alias' is another name for the list 'ys', which this tensor loop or `if` changes"]),
    (list_alias_in_a_tensor_if, (torch.ones(3),), "if x.sum() > 0",
     ["'alias' is another name for the list 'out', which this tensor loop or `if` changes"]),
    # The caller's list or dict (an argument): eager changes it; the program's change would stay its own.
    (appends_to_the_callers_list, (torch.ones(3), [torch.zeros(3)]), "if x.sum() > 0",
     ["'ys' is the caller's list", "the caller's list would not see the change"]),
    (deletes_from_the_callers_dict, (torch.ones(3), {"k": torch.zeros(3), "j": 3}), "if x.sum() > 0",
     ["'d' is the caller's dict", "another length or other keys on each side"]),
    # A dict whose name is not read again was dropped from the `if`: another name kept it as it was.
    (dict_alias_changes_keys_in_a_tensor_if, (torch.ones(3),), "if x.sum() > 0",
     ["'alias' is another name for the dict 'd'", "another length or other keys on each side"]),
    (dtype_changes, (torch.ones(3), torch.tensor(3)), "while i < n",
     ["loop variable 's' has dtype int64 before the loop but float32"]),
    (a_generator, (torch.ones(3),), "yield x", ["generators (`yield`) are not supported"]),
    (rebinds_global, (torch.ones(3),), "global G", ["rebinding global 'G'"]),
    # The user's variable, not the program's name for it (`tmp_3`, `ys_2`).
    # The message is at the `break` and says what it is, not at the next statement as if it were an `if`.
    (assigned_after_a_tensor_break, (torch.ones(3),), " break\n",
     ["'j' is assigned at line {j}, after the `break` at line {brk} that a tensor decides",
      "holds a value of type `str` there", "before the loop"]),
    # Eager sees a float on the first trip and a tensor after: no one answer (was: a tensor on every trip).
    (isinstance_of_a_number_a_loop_makes_a_tensor, (torch.ones(3),), "isinstance(s, float)",
     ["'s' is a Python number on some paths and a tensor on others", "`isinstance` has no one answer"]),
    # The same where the loop carries a list by item: the retry with the list as a tensor array (whose
    # elements differ in dtype) must not hide the cause (was: "cannot append float64[]", found by the fuzzer).
    (isinstance_in_a_loop_carrying_a_list_by_item, (torch.ones(3),), "isinstance(s, float)",
     ["'s' is a Python number on some paths and a tensor on others", "`isinstance` has no one answer"]),
    (type_of_a_number_one_branch_makes_a_tensor, (torch.ones(3), torch.tensor(2)), "type(s) is int",
     ["'s' is a Python number on some paths and a tensor on others", "`type` has no one answer"]),
    (tuple_grows_in_a_tensor_loop, (torch.ones(3), torch.tensor(2)), "for i in range(n)",
     ["loop variable 'h' is a tuple of 2 before the loop but a tuple of 3 after one iteration",
      "cannot change the length or keys of a Python tuple or dict"]),
    (pop_from_tensor_array, (torch.ones(3), torch.tensor(2)), "ys.pop()",
     ["list `ys` is a tensor array", "no method `pop`"]),
    # Python's `a and b` is b on one path and a on the other; logical_and would be a silent bool.
    (and_as_a_value_of_two_dtypes, (torch.ones(3),), "x.sum() > 0 and x.mean()",
     ["`a and b` with a tensor `a` is Python's value, `b if a else a`", "`a` is bool of rank 0 but `b` is float32"]),
    # Eager min returns one operand unchanged; torch.where would promote the int64 one to float32.
    # Python stops pulling items at the first true one: a later y.add_(1) must not run on every path.
    (any_with_effects, (torch.ones(3),), "any(y.add_(1)",
     ["any() over items that compute with effects", "Python stops at the first true item"]),
    (min_of_two_dtypes, (torch.ones(3),), "min(x.sum().long(), x.mean())",
     ["min(a, b) returns a or b unchanged, and here they are int64 of rank 0 and float32 of rank 0"]),
])
def test_conversion_errors_name_variable_file_and_line(fn, args, line_text, pieces):
    with pytest.raises(ConversionError) as info:
        d2s.declarative(fn)(*args)
    err = info.value
    assert err.filename == HERE
    assert err.lineno == line_of(fn, line_text)
    message = str(err)
    assert f'File "{HERE}", line {err.lineno}' in message
    y_line = line_of(fn, "y = ") if "y = " in inspect.getsource(fn) else None
    lines = {"y": y_line}
    if fn is assigned_after_a_tensor_break:
        lines = {"j": line_of(fn, "j = "), "brk": line_of(fn, " break\n")}
    for piece in pieces:
        assert piece.format(**lines) in message
    # The message itself, without the file name (a checkout under /tmp holds the word "tmp").
    text = err.message.split("\n")[0]
    assert not re.search(r"\b(tmp|retval|do_return)_?\d*\b|\w+_\d+\b", text), message


@pytest.mark.parametrize("fn", [returns_tensor_or_none, tensor_or_none])
def test_a_path_giving_none_is_converted_when_a_run_takes_it(fn):
    """RandomCut (LearnedVector): `if ...: return a` / `elif ...: return b` and
    the implicit `return None` after them; a name None on one path. A program
    has one output kind, so each path is converted when a run first takes it
    (d2s/decisions.py): two programs, never a wrong value."""
    static = d2s.declarative(fn)
    x = torch.ones(3)
    for arg in (x, -x, x, -x):
        got, want = static(arg), fn(arg)
        assert (got is None) == (want is None) and (want is None or torch.equal(got, want))
    assert len(static.program_cache) == 2


def list_grows_in_one_branch(x):
    outs = [x]
    if x.sum() > 0:
        outs.append(x + 1)
    return torch.stack(outs)


def number_list_grows_in_one_branch(x):
    sizes = [1]
    if x.sum() > 0:
        sizes.append(2)
    return x * len(sizes)


def test_list_of_tensors_grown_under_tensor_condition_is_a_tensor_array():
    """One program for both paths: the stacked result has 2 rows on one, 1 on the other."""
    static = d2s.declarative(list_grows_in_one_branch)
    for x in (torch.ones(3), -torch.ones(3)):
        assert torch.equal(static(x), list_grows_in_one_branch(x))
    assert len(static.program_cache) == 1
    assert any(op.type == "cond" for op in static.program_cache.last.main_program.global_block().ops)


def test_list_of_numbers_changed_under_tensor_condition_is_an_error_not_a_wrong_answer():
    with pytest.raises(ConversionError, match="'sizes' is a list of 2 in the true branch but a list of 1") as info:
        d2s.declarative(number_list_grows_in_one_branch)(torch.ones(3))
    assert info.value.lineno == line_of(number_list_grows_in_one_branch, "if x.sum() > 0")


def returns_tuples_of_two_lengths(x, n):
    pair = (x, x)
    i = 0
    while i < n:
        pair = (x * i, x)
        if x.sum() > i:
            return pair
        i += 1
    return pair[0], x, x


@pytest.mark.parametrize("n", [0, 3])
def test_returned_structures_that_differ_are_refused_at_the_user_line(n):
    """A loop returning a tuple (its placeholder takes that structure) on
    a path that returns a tuple of another length after it: refused,
    naming the returned value, at a line of the function."""
    with pytest.raises(ConversionError, match="the value returned is a tuple of 3 on the true side but a tuple "
                                              "of 2 on the false side") as info:
        d2s.declarative(returns_tuples_of_two_lengths)(torch.ones(3), torch.tensor(n))
    first = line_of(returns_tuples_of_two_lengths, "pair = (x, x)")
    assert info.value.filename == __file__ and first < info.value.lineno <= first + 8


def zips_tensor_rows_with_modules(x):
    layers = [torch.nn.Identity(), torch.nn.Identity(), torch.nn.Identity()]
    out = x[0]
    for row, layer in zip(x, layers):  # a graph loop over rows: modules cannot be indexed by its counter
        out = out + layer(row)
    return out


def test_python_objects_a_graph_loop_would_index_are_rejected():
    # (A loop over the modules alone with a tensor break is unrolled: semantics_cases.py.)
    with pytest.raises(ConversionError, match="items must be tensors or numbers") as info:
        d2s.declarative(zips_tensor_rows_with_modules)(torch.ones(3, 2))
    assert info.value.filename == HERE


def range_of_tensor_as_list(x):
    return list(range(x.sum().long()))


def test_range_with_a_run_time_bound_as_python_items_is_rejected():
    with pytest.raises(ConversionError, match="can only be iterated by a `for` loop") as info:
        d2s.declarative(range_of_tensor_as_list)(torch.ones(3))
    assert info.value.filename == HERE


def dynamic_rows(x):
    s = x[0] * 0
    for i in range(x.shape[0]):
        s = s + x[i]
    return s, len(x), x.size(0)


def test_unknown_dimensions_become_graph_values():
    static = d2s.declarative(dynamic_rows, input_spec=[d2s.InputSpec([None, 3])])
    for rows in (2, 5, 1):
        x = torch.arange(rows * 3.0).reshape(rows, 3)
        s, n, m = static(x)
        assert torch.equal(s, dynamic_rows(x)[0]) and int(n) == rows and int(m) == rows
    assert len(static.program_cache) == 1
    types = {op.type for b in static.program_cache.last.main_program.blocks for op in b.ops}
    assert {"while", "size"} <= types


def test_set_code_level_prints_code_after_that_many_passes(capsys):
    def fresh(x):
        if x.sum() > 0:
            x = x + 1
        return x

    d2s.set_code_level(5)  # up to WhileLoop: the `if` is still an `if`
    try:
        conversion.convert_function(fresh)
    finally:
        d2s.set_code_level(None)
    err = capsys.readouterr().err
    assert "[d2s] converted" in err and "if x.sum() > 0:" in err and "convert_ifelse" not in err


@dataclasses.dataclass
class Scaled:
    """A result type whose __post_init__ does the work, as transformers'
    ModelOutput does (it tests `is_tensor(first)` and else iterates it)."""
    x: object
    scale: float = 1.0

    def __post_init__(self):
        if isinstance(self.x, torch.Tensor):
            y = self.x * self.scale
        else:
            y = torch.stack(list(self.x)) * self.scale
        if y.sum() > 0:
            y = y + 1
        self.y = y


@dataclasses.dataclass(frozen=True)
class FrozenScaled:
    x: torch.Tensor

    def __post_init__(self):
        y = self.x * 2
        if y.sum() > 0:
            y = y + 1
        object.__setattr__(self, "y", y)


class ReturnsScaled(torch.nn.Module):
    def __init__(self, kind):
        super().__init__()
        self.kind = kind

    def forward(self, x):
        if self.kind is Scaled:
            return self.kind(x, scale=2.0).y
        return self.kind(x).y


@pytest.mark.parametrize("kind", [Scaled, FrozenScaled])
def test_dataclass_post_init_runs_converted(kind):
    """Made inside declarative code, a dataclass runs its __post_init__
    converted: `isinstance(x, torch.Tensor)` holds for a graph tensor (it
    iterated the graph tensor, refused for a dynamic size) and its tensor
    `if` is a cond; the object is eager's, without the override."""
    model = ReturnsScaled(kind)
    static = d2s.declarative(model, input_spec=[d2s.InputSpec([None, 4])])
    for x in (torch.randn(3, 4) + 3, -torch.randn(5, 4) - 3, torch.randn(1, 4) + 3):
        assert torch.equal(static(x), model(x))
    program = static.forward.concrete_program.main_program
    assert len(static.forward.program_cache) == 1
    assert "cond" in [op.type for op in program.global_block().ops]
    made = operators.calls.convert_call(kind)(torch.ones(2, 4))
    assert type(made) is kind and "__post_init__" not in vars(made)


FUTURE_ANNOTATIONS = '''
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torch import Tensor  # never imported at run time


def scale(x, factor):
    def apply(t: Tensor, k: float) -> Tensor:  # annotations are strings: never evaluated
        return t * k
    if x.sum() > 0:
        return apply(x, factor)
    return apply(x, -factor)
'''


def test_nested_def_under_future_annotations_keeps_annotations_unevaluated(tmp_path, monkeypatch):
    (tmp_path / "future_case.py").write_text(FUTURE_ANNOTATIONS)
    monkeypatch.syspath_prepend(str(tmp_path))
    import future_case
    static = d2s.declarative(future_case.scale)
    for x in (torch.randn(3) + 3, -torch.randn(3) - 3):
        assert torch.equal(static(x, 2.0), future_case.scale(x, 2.0))
    assert "cond" in [op.type for op in static.concrete_program.main_program.global_block().ops]
