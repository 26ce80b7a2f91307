"""The programs of one StaticFunction (`ProgramCache`) and the parts of its
cache key that are not plain values (`Identities`, `with_flags`, `with_state_part`)."""

import collections
import threading
import weakref

# Programs one StaticFunction keeps (per bound instance) before evicting the
# least recently used; `fn.program_cache.max_size = n` changes one cache.
PROGRAM_CACHE_SIZE = 64


class ProgramCache:
    """Concrete programs of one StaticFunction, by cache key, least recently
    used first; past `max_size` programs (default `PROGRAM_CACHE_SIZE`) the
    least recently used one is dropped."""

    def __init__(self, max_size=None):
        self._programs = collections.OrderedDict()
        self.max_size = PROGRAM_CACHE_SIZE if max_size is None else max_size
        self.last = None
        self._recent = None  # the program at the end of `_programs`
        self.puts = 0  # programs cached so far: a caller compares it to tell a build from a hit
        self.last_decision = None  # why the latest program was converted again (decisions.rerun): for warnings
        self.state_attrs = []  # (module weakref, name) of module attributes the programs store
        # The module part of the key (StaticFunction._refresh_training_flags)
        # lives here, with the programs it keys, and not on the StaticFunction:
        # a class-decorated forward's bound StaticFunction is made on each
        # access (like a bound method), and a key part made anew never
        # matches the keys of the cached programs (they compare it by identity).
        self.flags_generation = None  # module_watch._generation when `flags` was read
        self.flags = ()
        self.trees = []  # weak references to the interned Identities of cached keys
        self.sizes = {}  # key signature -> [latest sizes, dims that vary] (d2s/varying_sizes.py)
        # Exact keys of calls a program with run-time sizes served, so a size
        # met again takes the hit path (bounded: d2s/varying_sizes.py).
        self.exact = {}
        # How calls of each form (positional count, keyword names) bind to the
        # parameters (StaticFunction._binding): inspect's binding, once per form.
        self.forms = {}
        # One build at a time per cache: two threads calling one module share
        # this cache through two bound StaticFunctions.
        self.lock = threading.RLock()

    def __len__(self):
        return len(self._distinct())

    def __iter__(self):
        return iter(self._distinct())

    def _distinct(self):
        # A program may be cached under two keys (StaticFunction._build: the
        # key before and after module state joined the key).
        return list({id(c): c for c in self._programs.values()}.values())

    def get(self, key):
        concrete = self._programs.get(key)
        if concrete is not None and concrete is not self._recent:
            # Already the most recently used: the common hit moves nothing.
            self._programs.move_to_end(key)
            self._recent = concrete
        return concrete

    def put(self, key, concrete):
        self.puts += 1
        if concrete.single_use:  # it wrote the caller's own objects: serves its call only (d2s/argument_writes.py)
            return
        self._programs[key] = concrete
        self._recent = concrete
        while len(self._programs) > max(1, self.max_size):
            self._programs.popitem(last=False)

    def clear(self):
        """Drop every program (the next call builds anew)."""
        self._programs.clear()
        self.sizes.clear()
        self.exact.clear()
        self.last = self._recent = None


class Identities:
    """Objects (modules, parameters, buffers) as a key part. It holds them
    weakly, so a cached key neither keeps a module alive nor matches a new
    object that reuses a dead one's id. A StaticFunction interns these (one
    object per set of identical objects, `StaticFunction._intern_tree`), so
    the key hashes and compares it by identity, in C: no Python `__hash__`
    or `__eq__` call on the hit path."""

    __slots__ = ("_refs", "_values", "__weakref__")

    def __init__(self, objects, values=()):
        self._refs = tuple(map(weak, objects))
        self._values = values  # plain attribute values of the modules (module_watch.plain_values)

    def same(self, other):
        """Whether both hold the same live objects, in the same order, and
        the same plain values."""
        if len(self._refs) != len(other._refs) or self._values != other._values:
            return False
        for a, b in zip(self._refs, other._refs):
            obj = a()
            if obj is None or obj is not b():
                return False
        return True


def weak(obj):
    try:
        return weakref.ref(obj)
    except TypeError:  # an object that takes no weak reference: held strongly
        return lambda: obj


def with_flags(key, flags):
    """A cache key (as `with_state_part`'s) with other training flags and
    module identities (`StaticFunction._refresh_training_flags`)."""
    return key[:-5] + (flags,) + key[-4:]


def with_state_part(key, state_part):
    """A cache key (`StaticFunction.cache_key`: ..., training flags, the
    caller's autocast, the default dtype, module state part, optimize level) with another
    module state part."""
    return key[:-2] + (state_part, key[-1])
