"""Repoint CMake export files of the PyPI ROS wheels at this interpreter.

Why: some rosidl wheels were built under /opt/python/cp311-cp311 and their
exported CMake targets hard-code that interpreter's include directory and (cp312 wheels: cp312-cp312)
numpy's include directory; CMake's generate step refuses non-existent paths.
We rewrite those two paths (only in ``<prefix>/share/*/cmake/*.cmake``) to the
running interpreter's equivalents. Idempotent; prints what it changed.
"""
from __future__ import annotations

import re
import sys
import sysconfig
from pathlib import Path

#: the wheel builder's interpreter (cp311, cp312, ...): its include directory and numpy's
BUILDER_PYTHON_INCLUDE = re.compile(r"/opt/python/cp3\d+-cp3\d+/include/python3\.\d+")
BUILDER_NUMPY_INCLUDE = re.compile(r"/opt/python/cp3\d+-cp3\d+/lib/python3\.\d+/site-packages/numpy/_core/include")


def main(prefix: Path) -> int:
    import numpy

    replacements = {
        BUILDER_PYTHON_INCLUDE: sysconfig.get_paths()["include"],
        BUILDER_NUMPY_INCLUDE: numpy.get_include(),
    }
    changed = 0
    for path in sorted(prefix.glob("share/*/cmake/*.cmake")):
        text = path.read_text()
        new = text
        for old, repl in replacements.items():
            new = old.sub(lambda _m, repl=repl: repl, new)
        if new != text:
            path.write_text(new)
            changed += 1
            print(f"fixed builder paths in {path.relative_to(prefix)}")
    return changed


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else sys.prefix))
