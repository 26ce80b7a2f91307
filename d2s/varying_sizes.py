"""Sizes that vary from call to call: once a call's tensors differ from an
earlier call's only in some sizes, those dimensions are traced as run-time
sizes (as an `InputSpec`'s None) and one program serves every size there,
as torch.compile's automatic dynamic shapes do. A decoding loop whose
key/value cache grows by one token a step (transformers' `generate` around
a declarative forward) then runs one program instead of converting one per
length.

A cache key holds each tensor's exact sizes (a `torch.Size` followed by the
tensor's dtype). A key's *signature* is the key with each such size
replaced by its rank. Per signature the program cache keeps the sizes of
the latest call that missed and the dimensions seen to vary. A call that
misses its exact key looks up its key with those dimensions masked (None);
a call that misses that too adds the dimensions in which it differs from
the latest miss, and the program is traced with them as run-time sizes and
cached under the masked key. Where such a trace fails (code that needs a
size as a Python number it cannot follow), the signature keeps exact sizes
from then on, as before.

Before:  f(x[2, 3]), f(x[5, 3]), f(x[9, 3])  -> three traces, three programs
After:   the second call traces x as [-1, 3]; the third runs that program.
"""

import torch

_MAX_SIGNATURES = 256  # signatures a cache remembers (a model called with ever new structures: forgotten)
_MAX_EXACT = 256  # exact keys remembered for programs with run-time sizes


def _walk(key, sizes, replace):
    items = list(key)
    for j, item in enumerate(items):
        if type(item) is torch.Size:
            if j + 1 < len(items) and isinstance(items[j + 1], torch.dtype):  # a tensor's sizes
                items[j] = replace(len(sizes), item)
                sizes.append(item)
        elif type(item) is tuple:
            items[j] = _walk(item, sizes, replace)
    return tuple(items)


def signature(key):
    """(the key with each tensor's sizes as its rank, the sizes in order)."""
    sizes = []
    return _walk(key, sizes, lambda i, size: ("rank", len(size))), sizes


def masked(key, varying):
    """The key with the dimensions `varying` ((tensor index, dim) pairs) as None."""
    return _walk(key, [], lambda i, size: tuple(None if (i, d) in varying else n for d, n in enumerate(size)))


def lookup(cache, key):
    """(key, program or None, varying dimensions) for a call that missed
    its exact `key` in `cache` (a ProgramCache): the masked key and its
    program when there is one; else the key to build under and the
    dimensions to trace as run-time sizes (none: exact sizes)."""
    sig, sizes = signature(key)
    entry = cache.sizes.get(sig)
    if entry is None:
        if len(cache.sizes) >= _MAX_SIGNATURES:
            cache.sizes.clear()
        cache.sizes[sig] = [sizes, frozenset()]
        return key, None, frozenset()
    latest, varying = entry
    if varying is None:  # a trace with run-time sizes failed: exact sizes
        return key, None, frozenset()
    if varying:
        masked_key = masked(key, varying)
        program = cache.get(masked_key)
        if program is not None:
            remember(cache, key, program)
            return masked_key, program, varying
    entry[0] = sizes
    grown = varying | {(i, d) for i, (a, b) in enumerate(zip(latest, sizes))
                       for d, (m, n) in enumerate(zip(a, b)) if m != n}
    if not grown:  # the same sizes as the latest miss: it missed for another reason
        return key, None, frozenset()
    entry[1] = grown
    return masked(key, grown), None, grown


def remember(cache, key, program):
    """Serve the exact `key` by `program` (one with run-time sizes) from
    now on, without looking up the masked key (StaticFunction.__call__);
    not a program that serves its one call (d2s/argument_writes.py)."""
    if program.single_use:
        return
    if len(cache.exact) >= _MAX_EXACT:
        cache.exact.clear()
    cache.exact[key] = program


def stay_exact(cache, key):
    """The signature of `key` keeps exact sizes (its trace with run-time sizes failed)."""
    entry = cache.sizes.get(signature(key)[0])
    if entry is not None:
        entry[1] = None


def feed_dims(leaves, varying):
    """{leaf index: dims to trace as run-time sizes} for the call's feed
    `leaves` (tensors counted in key order; generators hold no sizes)."""
    dims, n = {}, 0
    for j, leaf in enumerate(leaves):
        if isinstance(leaf.tensor, torch.Tensor):
            found = {d for i, d in varying if i == n}
            if found:
                dims[j] = found
            n += 1
    return dims
