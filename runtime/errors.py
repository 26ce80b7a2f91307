"""The errors users see. They live in `runtime` because every layer raises them."""


class ConversionError(Exception):
    """Code that d2s cannot turn into a program, or a program that is ill-typed.

    Carries the user's ``filename`` and ``lineno`` so that the message points at
    the user's own code, never at generated code.
    """

    def __init__(self, message, filename=None, lineno=None):
        self.message = message
        self.filename = filename
        self.lineno = lineno
        super().__init__(str(self))

    def __str__(self):
        if self.filename is None:
            return self.message
        return f'File "{self.filename}", line {self.lineno}: {self.message}'


class ModelFormatError(Exception):
    """A saved model that is missing, truncated, of an unknown format version,
    or that names a function outside the allowlist."""


class ProgramError(Exception):
    """A program that breaks an IR invariant (raised by ``Program.verify``)."""


class OpRuntimeError(RuntimeError):
    """An op failed while a program ran; the message shows the op and the user
    line that created it."""


class DecisionFailed(AssertionError):
    """A decision the program was converted under does not hold for this run:
    a size assumption (`check_sizes`) or the side of a branch d2s could
    convert only for the inputs that take it (`decision_failed`). A
    declarative call converts again for such inputs and keeps both programs
    (d2s/decisions.py); a saved program, which holds one, raises it. An
    AssertionError, as the size checks always raised. `before_run`: raised
    before the program ran any op (module state that no longer holds what
    it held when converted: d2s/module_state.py `refresh_reads`)."""

    def __init__(self, *args, before_run=False):
        super().__init__(*args)
        self.before_run = before_run
