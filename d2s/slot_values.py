"""The values a loaded model's program reads, looked up once and kept until
the module's tensors change.

A `TranslatedLayer` (d2s/jit.py) keeps its weights as parameters and buffers
of itself and of `_State` submodules, and looks them up through the module
on each call, so that `.to()`, `load_state_dict(assign=True)`, an attribute
assignment or carried module state act on what the program reads. Looking
up dozens of attributes costs ~1 us each, more than the rest of a call
around the generated function. `watch` makes the `_parameters` and
`_buffers` dicts of every module of the tree count their writes (setting,
deleting, replacing an entry: what `register_parameter`, `setattr`,
`Module._apply` and `load_state_dict(assign=True)` do); `SlotValues`
looks the values up again only when that count moved. Writes into a
tensor (`copy_`, an optimizer step, `.data = ...`) keep the tensor object
the program is passed, so they need no lookup.
"""


class _CountedDict(dict):
    """A module's `_parameters` or `_buffers`: a dict that bumps `count[0]`
    on every write."""

    count = None  # the tree's shared [writes]; None while unpickling sets items

    def _bump(self):
        if self.count is not None:
            self.count[0] += 1

    def __setitem__(self, key, value):
        self._bump()
        dict.__setitem__(self, key, value)

    def __delitem__(self, key):
        self._bump()
        dict.__delitem__(self, key)

    def pop(self, *args):
        self._bump()
        return dict.pop(self, *args)

    def popitem(self):
        self._bump()
        return dict.popitem(self)

    def clear(self):
        self._bump()
        dict.clear(self)

    def update(self, *args, **kwargs):
        self._bump()
        dict.update(self, *args, **kwargs)

    def setdefault(self, key, default=None):
        self._bump()
        return dict.setdefault(self, key, default)

    def __ior__(self, other):
        self._bump()
        return dict.__ior__(self, other)


def watch(root):
    """Make the parameter and buffer dicts of every module under `root`
    count their writes in one shared counter; returns it."""
    count = [0]
    for module in root.modules():
        for attr in ("_parameters", "_buffers"):
            counted = _CountedDict(getattr(module, attr))
            counted.count = count
            object.__setattr__(module, attr, counted)
    return count


class SlotValues:
    """`values(names, key)`: `[lookup(n) for n in names]`, recomputed only
    when the watched tree was written or `key` (which names) changed."""

    def __init__(self, count, lookup):
        self._count = count
        self._lookup = lookup
        self._stamp = None
        self._values = []

    def values(self, names, key):
        stamp = (self._count[0], key)
        if stamp != self._stamp:
            self._values = [self._lookup(n) for n in names]
            self._stamp = stamp
        return self._values
