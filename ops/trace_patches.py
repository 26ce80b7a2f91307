"""Module attributes replaced while any trace is under way.

ops/host_random.py and ops/ambient_modes.py wrap functions of `random`,
`numpy.random` and torch for the duration of traces: the first trace to
start (in any thread) installs the wrappers, the last to finish puts the
originals back. Each wrapper decides per call whether its calling context
traces, so other threads keep the originals' behaviour.

    patches = WhileTracing(install, uninstall)
    with patches.held():      # one per trace
        ...
"""

import contextlib
import threading


class WhileTracing:
    """`install()` on the first `held()` under way, `uninstall()` when the
    last one ends."""

    def __init__(self, install, uninstall):
        self._install, self._uninstall = install, uninstall
        self._lock = threading.Lock()
        self._depth = 0
        self._tracing = None

    def tracer(self):
        """The tracer of the calling context (None outside a trace), once
        `held_for` has been given the tracer's lookup."""
        return None if self._tracing is None else self._tracing()

    def held_for(self, tracing):
        """`held()`, noting `tracing` (`tracer.active`) for `tracer()`."""
        self._tracing = tracing
        return self.held()

    @contextlib.contextmanager
    def held(self):
        with self._lock:
            if self._depth == 0:
                self._install()
            self._depth += 1
        try:
            yield
        finally:
            with self._lock:
                self._depth -= 1
                if self._depth == 0:
                    self._uninstall()
