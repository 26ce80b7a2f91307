"""The op table's structure lives in `runtime/optable.py` (runtime reads it,
ops fills it); these names stay importable from here for the op modules and
for code written against the earlier layout."""

from runtime.optable import (OpDef, get_op_def, is_registered, op_for_callable,  # noqa: F401 - re-exports
                             register, registered_types)
