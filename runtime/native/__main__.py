"""`python -m runtime.native`: build (or find) the native executor now, not
on the first program compile; prints the library's path. Exits non-zero,
with the compiler's output, when it cannot be built."""

import sys

from . import NativeBuildError, build


def main():
    try:
        path = build(verbose=True)
    except NativeBuildError as e:
        print(f"d2s: cannot build the native executor: {e}", file=sys.stderr)
        return 1
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
