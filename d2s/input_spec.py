"""`InputSpec`: the shape and dtype of one tensor argument of a declarative
function or a saved model."""

from runtime.ir import dtype_name


class InputSpec:
    """The shape/dtype of one tensor argument; `None` (or -1) dimensions stay
    dynamic in the program, so one program serves every size there."""

    def __init__(self, shape, dtype="float32", name=None):
        self.shape = tuple(-1 if d is None else int(d) for d in shape)
        self.dtype = dtype_name(dtype)
        self.name = name

    @classmethod
    def from_tensor(cls, tensor, name=None):
        return cls(tuple(tensor.shape), tensor.dtype, name)

    def key(self):
        return ("spec", self.shape, self.dtype)

    def matches(self, tensor):
        return (tensor.dim() == len(self.shape) and dtype_name(tensor.dtype) == self.dtype
                and all(d in (-1, s) for d, s in zip(self.shape, tensor.shape)))

    def __repr__(self):
        return f"InputSpec(shape={list(self.shape)}, dtype={self.dtype!r}, name={self.name!r})"

    def __eq__(self, other):
        return isinstance(other, InputSpec) and (self.shape, self.dtype, self.name) == (other.shape, other.dtype, other.name)

    __hash__ = None
