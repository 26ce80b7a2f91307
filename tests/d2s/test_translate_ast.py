"""The pure AST layer: each transformer on a tiny function (inline expected
output), the analyses on small examples, templates and the namer."""

import textwrap

import gast
import pytest

from d2s import transformers as T
from d2s.ast_tools import activity, anno, codegen, liveness, parsing, templates
from d2s.ast_tools.naming import Namer
from runtime.errors import ConversionError


def convert(source, *passes):
    node = parsing.parse_source(source).body[0]
    ctx = T.Context("<test>", 0, Namer.for_tree(node, extra=["_d2s"]), helpers="_d2s")
    for p in passes:
        node = p(ctx).transform(node)
    return codegen.to_source(node)


TRANSFORMER_CASES = {
    "for": (T.ForLoop, """
        def f(xs):
            for x in xs:
                use(x)
            else:
                done()
        """, """
        def f(xs):
            itr, ctr = _d2s.convert_for_iter(xs)
            while _d2s.convert_for_test(itr, ctr):
                x, ctr = _d2s.convert_for_next(itr, ctr)
                use(x)
            else:
                done()
        """),
    "return": (T.Return, """
        def f(x):
            if x > 0:
                return x
            x = x + 1
            return x
        """, """
        def f(x):
            do_return = False
            if x > 0:
                do_return = True
                retval = x
            if not do_return:
                x = x + 1
                do_return = True
                retval = x
            else:
                do_return = True
            return retval
        """),
    "return_tuple": (T.Return, """
        def f(x):
            if x > 0:
                return x, 1
            return x, 2
        """, """
        def f(x):
            do_return = False
            if x > 0:
                do_return = True
                retval_0, retval_1 = x, 1
            if not do_return:
                do_return = True
                retval_0, retval_1 = x, 2
            else:
                do_return = True
            return retval_0, retval_1
        """),
    "return_fall_off": (T.Return, """
        def f(x):
            while x > 0:
                if x > 5:
                    return x
                x = x - 1
        """, """
        def f(x):
            do_return = False
            while not do_return and x > 0:
                if x > 5:
                    do_return = True
                    retval = x
                if not do_return:
                    x = x - 1
                else:
                    do_return = True
            if not do_return:
                do_return = True
                retval = None
            else:
                do_return = True
            return retval
        """),
    "return_only_last_untouched": (T.Return, """
        def f(x):
            x = x + 1
            return x
        """, """
        def f(x):
            x = x + 1
            return x
        """),
    "break_continue": (T.BreakContinue, """
        def f(x):
            while x > 0:
                if x > 5:
                    break
                if x > 3:
                    continue
                x = x - 1
            else:
                x = 0
            return x
        """, """
        def f(x):
            broke = False
            while not broke and x > 0:
                continued = False
                if x > 5:
                    broke = True
                if not broke:
                    if x > 3:
                        continued = True
                    if not continued:
                        x = x - 1
            if not broke:
                x = 0
            return x
        """),
    "while": (T.WhileLoop, """
        def f(x, n):
            i = 0
            while i < n:
                t = x * 2
                x = t + i
                i += 1
            return x
        """, """
        def f(x, n):
            i = 0

            def loop_test():
                return i < n

            def loop_body():
                nonlocal i, x
                t = x * 2
                x = t + i
                i += 1
            i, x = _d2s.convert_while(loop_test, loop_body, ('i', 'x'), ())
            return x
        """),
    "if": (T.IfElse, """
        def f(x):
            if x > 0:
                y = x
                t = 1
            else:
                y = -x
            return y
        """, """
        def f(x):

            def if_true():
                nonlocal y
                y = x
                t = 1

            def if_false():
                nonlocal y
                y = -x
            y, = _d2s.convert_ifelse(x > 0, if_true, if_false, ('y',), ('y',), (),
                (), ((4, 7),))
            return y
        """),
    "ifexp": (T.IfExp, """
        def f(x):
            return x if x > 0 else -x
        """, """
        def f(x):
            return _d2s.convert_ifexp(x > 0, lambda : x, lambda : -x)
        """),
    "logical": (T.Logical, """
        def f(a, b):
            return not (a and b or a), 0 < a < b, 0 < f(a) < b
        """, """
        def f(a, b):
            return _d2s.convert_logical_not(_d2s.convert_logical_or(lambda : _d2s.
                convert_logical_and(lambda : a, lambda : b, test=True), lambda : a,
                test=True)), _d2s.convert_logical_and(lambda : 0 < a, lambda : a < b
                ), _d2s.convert_compare_chain(lambda : 0, ('<', lambda : f(a)), (
                '<', lambda : b))
        """),
    "assert": (T.Assert, """
        def f(x):
            assert x > 0, 'positive'
            assert x
        """, """
        def f(x):
            _d2s.convert_assert(x > 0, lambda : 'positive')
            _d2s.convert_assert(x)
        """),
    "augassign": (T.AugAssign, """
        def f(x, v):
            x += v
            x.n *= 2
        """, """
        def f(x, v):
            x = _d2s.convert_augassign('+=', x, v)
            x.n *= 2
        """),
    "list_append": (T.ListAppend, """
        def f(xs, x):
            xs.append(x)
            y = xs.append(x)
        """, """
        def f(xs, x):
            _d2s.convert_list_append(xs, x)
            y = xs.append(x)
        """),
    "shape": (T.Shape, """
        def f(x):
            x.shape = (1,)
            return x.shape[0]
        """, """
        def f(x):
            x.shape = 1,
            return _d2s.convert_shape(x)[0]
        """),
    "undefined": (T.UndefinedLoads, """
        def f(x, n):
            if n > 0:
                y = x
            elif n < 0:
                return x
            else:
                y = -x
            if n > 1:
                z = y
            return z + y
        """, """
        def f(x, n):
            if n > 0:
                y = x
            elif n < 0:
                return x
            else:
                y = -x
            if n > 1:
                z = y
            return _d2s.convert_load(z) + y
        """),
    "call": (T.Call, """
        def f(self, x):
            y = self.layer(x)
            z = x.item()
            return super().forward(y)
        """, """
        def f(self, x):
            y = _d2s.convert_call(self.layer)(x)
            z = _d2s.convert_method(x, 'item')()
            return _d2s.convert_call(super(__class__, self).forward)(y)
        """),
}


@pytest.mark.parametrize("name", sorted(TRANSFORMER_CASES))
def test_transformer(name):
    transformer, before, after = TRANSFORMER_CASES[name]
    assert convert(before, transformer).strip() == textwrap.dedent(after).strip()


def test_pipeline_has_every_transformer_once_in_order():
    names = [t.__name__ for t in T.PIPELINE]
    assert names == ["Unsupported", "Annotations", "UndefinedLoads", "ForLoop", "Return", "BreakContinue", "KeptLocals",
                     "WhileLoop", "IfElse", "IfExp",
                     "Logical", "Assert", "AugAssign", "ListAppend", "Shape", "ClassAttr", "FStrings", "Subscripts",
                     "TryScope", "Call"]


def test_fresh_names_avoid_user_names():
    out = convert("""
        def f(itr, ctr, itr_1):
            for x in itr:
                ctr = ctr + x
            return ctr
        """, T.ForLoop)
    assert "itr_2, ctr_1 = _d2s.convert_for_iter(itr)" in out


def test_nested_loops_get_their_own_flags():
    out = convert("""
        def f(x):
            while x > 0:
                while x > 1:
                    break
                break
        """, T.BreakContinue)
    assert "broke = False" in out and "broke_1 = False" in out


@pytest.mark.parametrize("source,message", [
    ("def f(x):\n    yield x\n", "generators"),
    ("def f(x):\n    global G\n    G = x\n", "rebinding global 'G'"),
    ("async def f(x):\n    return x\n", "async functions"),
])
def test_unsupported_syntax_is_rejected_with_line(source, message):
    with pytest.raises(ConversionError, match=message) as info:
        convert(source, T.Unsupported)
    assert info.value.filename == "<test>" and info.value.lineno == 2 - source.startswith("async")


def test_reading_a_global_is_fine():
    assert "global" in convert("def f(x):\n    global G\n    return G + x\n", T.Unsupported)


# -- analyses ------------------------------------------------------------------------------

def _function(source):
    return parsing.parse_source(source).body[0]


def test_activity_reads_and_modifies():
    fn = _function("""
        def f(a, b):
            c = a + b
            d[i] = c
            e.append(c)
            obj.attr = c
            g += 1
            h = lambda v: v + k
            for j in range(n):
                pass
            [m for m in q if m > r]
        """)
    act = activity.analyze(fn.body)
    assert act.modified == {"c", "d", "e", "g", "h", "j"}
    assert act.read == {"a", "b", "c", "d", "i", "e", "obj", "g", "k", "range", "n", "q", "r"}


def test_activity_separates_rebinding_from_mutation():
    fn = _function("""
        def f(x, outs):
            y = torch.add(x, 1)
            z, _ = torch.sort(y)
            outs.append(z)
            seen.add(z)
        """)
    act = activity.analyze(fn.body)
    assert act.bound == {"y", "z", "_"}
    assert act.mutated == {"torch", "outs", "seen"}
    # Only the function's own variables can be carried by a branch or loop.
    assert act.carried(activity.variables(fn)) == {"y", "z", "_", "outs"}


def test_activity_of_nested_function_counts_nonlocal_assignments():
    fn = _function("""
        def f():
            def inner():
                nonlocal x
                x = y + 1
                z = 2
            return inner
        """)
    act = activity.analyze(fn.body)
    assert act.modified == {"inner", "x"}
    assert act.read == {"y", "inner"}


def test_liveness_straight_line_and_branches():
    fn = _function("""
        def f(a, b):
            c = a + 1
            if b:
                d = c
            else:
                d = 2
            return d
        """)
    live = liveness.analyze(fn)
    assign, branch, ret = fn.body
    assert live.live_in[assign] == {"a", "b"}
    assert live.live_out[assign] == {"b", "c"}
    assert live.live_in[branch] == {"b", "c"}
    assert live.live_out[branch] == {"d"}
    assert live.live_in[ret] == {"d"}


def test_liveness_loop_carries_names_read_in_later_iterations():
    fn = _function("""
        def f(x, n):
            i = 0
            t = 5
            while i < n:
                t = x * i
                x = t + 1
                i += 1
            return x
        """)
    live = liveness.analyze(fn)
    loop = fn.body[2]
    assert live.live_in[loop] == {"i", "n", "x"}   # t is rewritten before any read
    assert live.live_out[loop] == {"x"}
    assert live.live_out[loop.body[0]] == {"t", "i", "n"}


def test_liveness_nonlocal_names_are_live_at_function_end():
    fn = _function("""
        def f():
            def body():
                nonlocal x
                x = 1
                y = 2
            return body
        """)
    live = liveness.analyze(fn)
    inner = fn.body[0]
    assert live.live_out[inner.body[1]] == {"x"}
    assert live.live_out[inner.body[2]] == {"x"}


# -- templates and naming -------------------------------------------------------------------

def test_template_substitutes_nodes_not_strings():
    value = gast.parse("a + b").body[0].value
    stmts = templates.replace("""
        def fn():
            nonlocal names
            target = value
            body
        """, fn="g", names=["p", "q"], target=["p", "q"], value=value,
        body=gast.parse("use(p)").body)
    assert codegen.to_source(gast.Module(body=stmts, type_ignores=[])).strip() == textwrap.dedent("""
        def g():
            nonlocal p, q
            p, q = a + b
            use(p)
        """).strip()


def test_template_drops_empty_nonlocal():
    stmts = templates.replace("def fn():\n    nonlocal names\n    pass\n", fn="g", names=[])
    assert codegen.to_source(gast.Module(body=stmts, type_ignores=[])).strip() == "def g():\n    pass"


def test_namer():
    namer = Namer(["x", "x_1"])
    assert namer.new("x") == "x_2"
    assert namer.new("x") == "x_3"
    assert namer.new("y") == "y"


@pytest.mark.parametrize("key", [anno.JUMP_LIVE, anno.JUMP, anno.EXITS, anno.REBINDS])
def test_annotations_are_declared_and_copies_keep_their_own(key):
    import copy
    node = gast.parse("x = 1").body[0]
    assert not anno.hasanno(node, key) and anno.getanno(node, key, "none") == "none"
    anno.setanno(node, key, (1,))
    twin = copy.copy(node)
    anno.setanno(twin, key, (2,))
    assert anno.getanno(node, key) == (1,) and anno.getanno(twin, key) == (2,)


def test_an_undeclared_annotation_is_an_error():
    with pytest.raises(KeyError, match="unknown AST annotation"):
        anno.setanno(gast.parse("x = 1").body[0], "jmup", 1)
