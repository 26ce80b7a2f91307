"""The process-wide translation switches, read on every declarative call:
whether to translate at all, the default optimisation level, and the
latest concrete program (for `save_inference_model`). `ProgramTranslator`
(d2s/translator.py) is their public face; this module depends on nothing,
so every caller can read them."""


class TranslatorState:
    __slots__ = ("enable_to_static", "optimize", "last")

    def __init__(self):
        self.enable_to_static = True
        self.optimize = "default"
        self.last = None


STATE = TranslatorState()
