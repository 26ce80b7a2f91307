"""f-strings in converted code (``convert_fstring``), and text whose digits
a run decides (``RunTimeText``).

``f"expert_{idx}"`` with ``idx`` an integer known only when the program
runs (a row of ``nonzero()``, a loop counter) has no text while the program
is built. As the key of an ``nn.ModuleDict`` (or a dict of modules or
functions) it picks the item whose key it spells when the run calls it: a
`cond` per matching key (operators/subscripts.py), eager's KeyError where
none matches. Anything else done with such text (printing it, joining it,
hashing it) is refused at the user's line.
"""

import re

import torch

from ops import capture, framework as fw
from ops.recording import graph_tensor, is_symbolic_value, stands_for_number
from ops.user_frames import error_at_user_line
from runtime.ir import Variable

_CONVERSIONS = {ord("s"): str, ord("r"): repr, ord("a"): ascii}
_INTEGERS = (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8)


def convert_fstring(parts):
    """Equivalent Python: the f-string's text. `parts`: literal texts and
    (value, conversion, spec) fields, as the FStrings transformer makes them."""
    texts, run_time, fields = [], False, []
    for part in parts:
        if type(part) is str:
            texts.append(part)
            continue
        value, conversion, spec = part
        number = is_symbolic_value(value)
        if number:  # a size known only at run time: text as a 0-d int's
            value = graph_tensor(value)
        if isinstance(value, Variable):
            if conversion == -1 and not spec and value.dtype in _INTEGERS and not value.shape \
                    and not capture.text_for_a_message((__file__,)):
                texts.append(value)  # eager's text is the int's (Tensor.__format__ of a 0-d tensor)
                run_time = True
                continue
            # Refused unless the user's line makes a message, which keeps the repr (ops/capture.py).
            capture.refuse_text_in_user_code(value, (__file__,))
            fields.append((len(texts), value, conversion, spec, number or stands_for_number(value)))
            spec = None  # (a number's spec, `:.2f`, does not apply to the repr the text holds until the run)
        if conversion != -1:
            value = _CONVERSIONS[conversion](value)
        texts.append(format(value, spec if spec is not None else ""))
    if run_time:
        return RunTimeText(texts)
    text = "".join(texts)
    # (A spec holding braces, from a nested field, has no `str.format` form: the message keeps its text.)
    formattable = fields and not any("{" in (spec or "") or "}" in (spec or "") for _, _, _, spec, _ in fields)
    return RunTimeMessage.of(text, texts, fields) if formattable else text


class RunTimeMessage(str):
    """A message (`assert ok, f"got {n}"`, `raise ValueError(f"... {x}")`)
    holding graph tensors: as text, what it is while the program is built
    (their reprs); an `assert` or `raise` op formats it again from
    `template` and the run's `values` (ops/framework.py `run_time_text`),
    as eager's text shows them. `numbers`: "n" for a value eager has as a
    Python number (a size, `t.item()`), else "t", one letter per value."""

    @classmethod
    def of(cls, text, texts, fields):
        message = cls(text)
        at = {i: (conversion, spec) for i, _, conversion, spec, _ in fields}
        message.template = "".join(
            _field(k, *at[i]) if i in at else t.replace("{", "{{").replace("}", "}}")
            for i, t, k in _numbered(texts, at))
        message.values = [value for _, value, _, _, _ in fields]
        message.numbers = "".join("n" if number else "t" for *_, number in fields)
        return message


def _numbered(texts, at):
    k = 0
    for i, t in enumerate(texts):
        yield i, t, k
        k += i in at


def _field(k, conversion, spec):
    kind = "" if conversion == -1 else "!" + chr(conversion)
    return "{" + str(k) + kind + (":" + spec if spec else "") + "}"


class RunTimeText:
    """The text of an f-string with integers known only when the program
    runs: literal texts and int Variables, in order."""

    def __init__(self, parts):
        self.parts = parts

    def __repr__(self):
        return "f" + repr("".join(p if type(p) is str else "{?}" for p in self.parts))

    def matches(self, keys):
        """(key, condition) for each of `keys` this text may spell: the
        condition, a bool Variable, holds when the run's ints spell it."""
        pattern = re.compile("".join(re.escape(p) if type(p) is str else "(0|-?[1-9][0-9]*)" for p in self.parts))
        ints = [p for p in self.parts if type(p) is not str]
        found = []
        for key in keys:
            match = pattern.fullmatch(key) if type(key) is str else None
            if match is not None:
                condition = None
                for var, digits in zip(ints, match.groups()):
                    equal = var == fw.fill_constant(int(digits), var.dtype)
                    condition = equal if condition is None else condition & equal
                found.append((key, condition))
        return found

    def _refuse(self, *args, **kwargs):
        raise error_at_user_line(
            f"the text {self!r} holds an integer known only when the program runs, so it cannot be used as text "
            "here (joined, hashed, compared, printed): it can pick an item of an nn.ModuleDict "
            "(`self.experts[f'expert_{i}'](x)`); keep the number a tensor, or index a list of the items by it")

    __str__ = __format__ = __hash__ = __eq__ = __ne__ = __add__ = __radd__ = __mod__ = __len__ = __iter__ = \
        __contains__ = __bool__ = _refuse
