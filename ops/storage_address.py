"""`x.data_ptr()` of a graph tensor: an address that is compared, never read.

Eager code compares data pointers to ask whether two tensors are one memory
(fairseq's attention: `qkv_same = query.data_ptr() == key.data_ptr()`, then
one fused projection). Of a graph tensor the address exists only when the
program runs; what tracing knows is which values are the same tensor. So
`x.data_ptr()` is a `StorageAddress`:

    q.data_ptr() == q.data_ptr()      ->  True (one Variable: one tensor on every run)
    q.data_ptr() == k.data_ptr()      ->  ConversionError at the user's line
    [p.data_ptr() for p in ps] == []  ->  False (lists of different lengths)

Two different Variables are refused, not answered: a view shares its base's
memory, and two inputs may be one tensor on some call (the program cache
does not tell those calls apart), so any fixed answer could be silently
wrong. Every other use of the address (a number, a hash, arithmetic) is
refused too.
"""

from runtime.errors import ConversionError

from .user_frames import error_at_user_line, user_name, user_origin


class StorageAddress:
    """The data pointer of one graph tensor (`var`)."""

    __slots__ = ("var", "origin", "name")

    def __init__(self, var):
        self.var = var
        # Where `x.data_ptr()` was written, for the refusal of returning it.
        self.origin, self.name = user_origin(), user_name(var)

    def __eq__(self, other):
        if isinstance(other, StorageAddress) and other.var is self.var:
            return True
        what = (f"{user_name(self.var)} and {user_name(other.var)} share memory"
                if isinstance(other, StorageAddress) else f"the address of {user_name(self.var)}")
        raise error_at_user_line(
            f"`data_ptr()` compares addresses that exist only when the program runs: whether {what} is "
            "not known while tracing (only one tensor compared with itself is); decide it outside the "
            "declarative function")

    def __ne__(self, other):
        return not self.__eq__(other)

    def __repr__(self):
        return f"<data_ptr of {self.var.name}>"

    def refuse_returned(self):
        message = (f"`data_ptr()` of {self.name} is returned, but the address exists only while the program runs "
                   "(each run's tensors have their own): return the tensor, and read `.data_ptr()` of the result "
                   "outside the declarative function")
        if self.origin is None:
            raise ConversionError(message)
        filename, lineno, line = self.origin
        raise ConversionError(f"{message}\n    {line}" if line else message, filename, lineno)


def _refuse(name):
    def refuse(self, *args):
        raise error_at_user_line(
            f"the address `data_ptr()` of {user_name(self.var)} exists only when the program runs: it cannot "
            f"be used as a Python number ({name}); only `==`/`!=` of one tensor's address with itself is known")
    return refuse


for _name in ("__hash__ __bool__ __int__ __index__ __float__ __lt__ __le__ __gt__ __ge__ __add__ __radd__ "
              "__sub__ __rsub__ __mul__ __rmul__ __mod__ __floordiv__ __and__ __or__ __xor__ __str__ __format__").split():
    setattr(StorageAddress, _name, _refuse(_name))
