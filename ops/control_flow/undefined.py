"""Values for names that have none on a path of the program."""

class Undefined:
    """Stands for a name that has no value yet at this point of the program.

    Using it in any way (arithmetic, comparison, attributes, truth, calls,
    iteration) raises Python's own ``UnboundLocalError`` for the name, as
    reading the unbound local would."""

    def __init__(self, name):
        self.name = name

    def __repr__(self):
        return f"Undefined({self.name!r})"

    def unbound(self, *args, **kwargs):
        raise UnboundLocalError(f"cannot access local variable '{self.name}' where it is not associated "
                                "with a value")

    def __getattr__(self, attr):
        if attr.startswith("__"):
            raise AttributeError(attr)
        self.unbound()

    __bool__ = __call__ = __iter__ = __len__ = __getitem__ = __setitem__ = __neg__ = __invert__ = unbound
    __lt__ = __le__ = __gt__ = __ge__ = unbound
    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = __truediv__ = __rtruediv__ = unbound
    __floordiv__ = __rfloordiv__ = __mod__ = __rmod__ = __pow__ = __rpow__ = __matmul__ = __rmatmul__ = unbound
    __and__ = __rand__ = __or__ = __ror__ = __xor__ = __rxor__ = unbound
    __torch_function__ = classmethod(lambda cls, func, types, args=(), kwargs=None: _unbound_in(args, kwargs))


def _unbound_in(args, kwargs):
    for value in list(args) + list((kwargs or {}).values()):
        if isinstance(value, Undefined):
            value.unbound()
    return NotImplemented


class Unreachable(Undefined):
    """A branch value that no run reaches the merge with: the branch raises
    (then a branch function returns one ``Unreachable`` for all its values),
    or it has returned from the function, so a later use never sees it. The
    merged value is the other branch's."""

