"""The wheel a robot installs holds the whole library and nothing else: no benchmark, no test.

Why: the benchmarks live beside the package (``benchmarks/``, run from a checkout), so that a
robot's install carries the runtime only; and a library folder that setup.py's package discovery
does not see (one without ``__init__.py``) would be silently missing from the wheel while every
test from the checkout still passes. The wheel is built offline from a copy of the checkout.
"""
from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def build_wheel(workdir: Path) -> zipfile.ZipFile:
    source = workdir / "src"
    source.mkdir()
    for name in ("setup.py", *(p.name for p in REPO.glob("requirements*.txt"))):
        shutil.copy(REPO / name, source / name)
    for folder in ("flashrt_ros", "benchmarks"):
        shutil.copytree(REPO / folder, source / folder, ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
                    "--disable-pip-version-check", "-q", "-w", str(workdir / "dist"), str(source)],
                   check=True, capture_output=True, text=True)
    (wheel,) = (workdir / "dist").glob("flashrt_ros-*.whl")
    return zipfile.ZipFile(wheel)


def test_the_wheel_holds_every_library_module_and_no_benchmark(tmp_path: Path) -> None:
    with build_wheel(tmp_path) as wheel:
        names = set(wheel.namelist())
        entry_points = wheel.read(next(n for n in names if n.endswith(".dist-info/entry_points.txt"))).decode()
    library = {p.relative_to(REPO).as_posix() for p in (REPO / "flashrt_ros").rglob("*.py")}
    assert library - names == set()
    assert [n for n in names if "benchmark" in n] == []
    assert {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")} == {"flashrt_ros"}
    assert "benchmark" not in entry_points


def test_the_benchmarks_live_beside_the_package_not_in_it() -> None:
    # CMakeLists.txt installs flashrt_ros/ as it is (the colcon route): nothing there may be a benchmark
    assert not (REPO / "flashrt_ros" / "benchmarks").exists()
    assert (REPO / "benchmarks" / "__init__.py").exists()
