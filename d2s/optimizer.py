"""Static-graph optimizers: `opt.minimize(loss)` inside `program_guard`
appends a `backward` op and one update op per parameter to the loss's
program; optimizer state (momentum buffers, Adam moments) is created by ops
in the startup program, so `exe.run(startup)` then `exe.run(main, ...)`
trains, as in the tutorials' static programming model.

    x = d2s.data("x", [None, 1]); y = d2s.data("y", [None, 1])
    loss = F.mse_loss(nn.Linear(1, 1)(x), y)
    d2s.optimizer.SGD(learning_rate=0.01).minimize(loss)
"""

import torch

from ops.optimizer_ops import append_call
from runtime.attrs import OutputRef
from runtime.ir import default_startup_program


class Optimizer:
    """Base class: subclasses name their update op and the state it keeps."""

    op_type = None
    state = ()  # names of per-parameter state tensors, created as zeros

    def __init__(self, learning_rate, parameters=None):
        self.learning_rate = float(learning_rate)
        self._parameters = parameters

    def _hyper(self):
        return (self.learning_rate,)

    def _trainable(self, program, parameter_list):
        block = program.global_block()
        if parameter_list is not None:
            names = [p if isinstance(p, str) else p.name for p in parameter_list]
            return [block.vars[n] for n in names]
        return [v for v in block.vars.values()
                if v.persistable and not v.stop_gradient and v.dtype.is_floating_point]

    def minimize(self, loss, startup_program=None, parameter_list=None):
        """Append backward and update ops for `loss`; returns the (param, grad) pairs."""
        program = loss.block.program
        startup = startup_program or default_startup_program()
        block = program.global_block()
        params = self._trainable(program, parameter_list or self._parameters)
        if not params:
            raise ValueError("minimize(): the loss depends on no trainable parameter")
        grads = [block.create_var(name=program.unique_name(p.name + "@GRAD"), shape=p.shape, dtype=p.dtype,
                                  stop_gradient=True) for p in params]
        append_call(block, "backward", [loss] + params, grads, out=tuple(OutputRef(i) for i in range(len(grads))))
        for p, g in zip(params, grads):
            state = [self._state_var(program, startup, p, s) for s in self.state]
            append_call(block, self.op_type, [p, g] + state, [p], self._hyper(), out=OutputRef(0))
        return list(zip(params, grads))

    def _state_var(self, program, startup, param, kind):
        """A persistable zeros tensor living in the scope, created by the startup program."""
        name = program.unique_name(f"{param.name}_{kind}")
        shape = () if kind == "step" else param.shape
        dtype = torch.float32 if kind == "step" else param.dtype
        var = program.global_block().create_var(name=name, shape=shape, dtype=dtype, persistable=True,
                                                stop_gradient=True)
        svar = startup.global_block().create_var(name=name, shape=shape, dtype=dtype, persistable=True,
                                                 stop_gradient=True)
        startup.global_block().append_op(
            "torch.zeros", inputs={"X": []}, outputs={"Out": [svar]},
            attrs={"args": (tuple(shape),), "kwargs": {"dtype": dtype}, "out": OutputRef(0)})
        return var


class SGD(Optimizer):
    """p -= lr * grad (torch.optim.SGD)."""

    op_type = "sgd"


class Momentum(Optimizer):
    """v = momentum * v + grad; p -= lr * v (torch.optim.SGD with momentum)."""

    op_type = "momentum"
    state = ("velocity",)

    def __init__(self, learning_rate, momentum=0.9, parameters=None):
        super().__init__(learning_rate, parameters)
        self.momentum = float(momentum)

    def _hyper(self):
        return (self.learning_rate, self.momentum)


class Adam(Optimizer):
    """torch.optim.Adam's update, with moments and step count as state."""

    op_type = "adam"
    state = ("moment1", "moment2", "step")

    def __init__(self, learning_rate=0.001, beta1=0.9, beta2=0.999, epsilon=1e-8, parameters=None):
        super().__init__(learning_rate, parameters)
        self.beta1, self.beta2, self.epsilon = float(beta1), float(beta2), float(epsilon)

    def _hyper(self):
        return (self.learning_rate, self.beta1, self.beta2, self.epsilon)
