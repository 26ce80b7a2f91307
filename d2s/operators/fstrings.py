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
from ops.recording import graph_tensor, is_symbolic_value
from ops.user_frames import error_at_user_line
from runtime.ir import Variable

_CONVERSIONS = {ord("s"): str, ord("r"): repr, ord("a"): ascii}
_INTEGERS = (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8)


def convert_fstring(parts):
    """Equivalent Python: the f-string's text. `parts`: literal texts and
    (value, conversion, spec) fields, as the FStrings transformer makes them."""
    texts, run_time = [], False
    for part in parts:
        if type(part) is str:
            texts.append(part)
            continue
        value, conversion, spec = part
        if is_symbolic_value(value):  # a size known only at run time: text as a 0-d int's
            value = graph_tensor(value)
        if isinstance(value, Variable):
            if conversion == -1 and not spec and value.dtype in _INTEGERS and not value.shape \
                    and not capture.text_for_a_message((__file__,)):
                texts.append(value)  # eager's text is the int's (Tensor.__format__ of a 0-d tensor)
                run_time = True
                continue
            # Refused unless the user's line makes a message, which keeps the repr (ops/capture.py).
            capture.refuse_text_in_user_code(value, (__file__,))
        if conversion != -1:
            value = _CONVERSIONS[conversion](value)
        texts.append(format(value, spec if spec is not None else ""))
    return RunTimeText(texts) if run_time else "".join(texts)


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
