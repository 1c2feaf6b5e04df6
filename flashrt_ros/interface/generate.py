"""Rewrite every artefact made from the declarations: ``python -m flashrt_ros.interface.generate``.

Why one command: docs tables, the interface files' error codes, the Groot2 node model each used to
have its own way to be regenerated, or none. ``ARTEFACTS`` lists every one; ``--check`` writes
nothing and exits 1 naming the stale ones (CI runs ``test/test_generated_artefacts.py``, which does
the same). Run it from a checkout: the artefacts are files of the repository, not of the package.

In a Markdown file an artefact is the block between ``<!-- generated:NAME -->`` and
``<!-- /generated:NAME -->``; in an interface file, the error-code block
(``docs.ERROR_CODES_HEADER`` and the constants after it); otherwise the whole file.
"""
from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from flashrt_ros.interface import docs
from flashrt_ros.interface.node_params import PARAMS
from flashrt_ros.interface.robot_io_params import ROBOT_IO_PARAMS
from flashrt_ros.interface.sim_params import SIM_PARAMS

#: The checkout this module lives in (``flashrt_ros/interface/generate.py``).
REPO = Path(__file__).resolve().parents[2]
#: Interface files whose messages carry ``error_code``: each repeats the constants.
INTERFACE_FILES = ("msg/ErrorCodes.msg", "srv/*.srv", "action/*.action")


@dataclass(frozen=True)
class Artefact:
    """One generated text: where it goes (``path`` relative to the repository, ``block`` its marked
    block, or "" for the whole file; ``constants``: the error-code block of an interface file) and
    what renders it."""

    path: str
    block: str
    render: Callable[[], str]
    constants: bool = False

    def rewritten(self, text: str) -> str:
        """``text`` (the file's) with this artefact in place; ValueError if its place is missing."""
        if self.constants:
            return _replace_error_codes(text, self.render(), self.path)
        if not self.block:
            return self.render()
        begin, end = f"<!-- generated:{self.block} -->\n", f"<!-- /generated:{self.block} -->"
        if text.count(begin) != 1 or text.count(end) != 1 or text.index(begin) > text.index(end):
            raise ValueError(f"{self.path}: needs one {begin.strip()} ... {end} block")
        return text[:text.index(begin) + len(begin)] + self.render() + text[text.index(end):]


def _replace_error_codes(text: str, block: str, path: str) -> str:
    lines = text.splitlines(keepends=True)
    start = next((i for i, line in enumerate(lines) if line.startswith("# Error codes (stable;")), None)
    if start is None:
        raise ValueError(f"{path}: no error-code block (a line starting '# Error codes (stable;')")
    end = start + 1
    while end < len(lines) and re.match(r"uint16 [A-Z_]+=\d+", lines[end]):
        end += 1
    return "".join(lines[:start]) + block + "".join(lines[end:])


def artefacts(repo: Path = REPO) -> list[Artefact]:
    """Every generated artefact of the repository at ``repo``."""
    out = [
        Artefact("docs/services.md", "services", docs.services_table),
        Artefact("docs/services.md", "error-codes", docs.error_codes_table),
        Artefact("docs/cli.md", "capsule-commands", docs.capsule_commands_table),
        Artefact("docs/parameters.md", "node-parameters", lambda: docs.parameters_table(PARAMS)),
        Artefact("docs/parameters.md", "sim-parameters", lambda: docs.parameters_table(SIM_PARAMS)),
        Artefact("docs/robot_io.md", "robot-io-parameters", lambda: docs.parameters_table(ROBOT_IO_PARAMS)),
        Artefact("docs/behaviour_trees.md", "tree-nodes", docs.nodes_table),
        Artefact("flashrt_ros/bt/trees/flashrt_nodes.xml", "", docs.tree_nodes_model_xml),
    ]
    for pattern in INTERFACE_FILES:
        out += [Artefact(str(p.relative_to(repo)), "error codes", docs.error_codes_block, constants=True)
                for p in sorted(repo.glob(pattern))]
    return out


def _docs_block_name(artefact: Artefact) -> str:
    return f"{artefact.path} ({artefact.block})" if artefact.block else artefact.path


def stale(repo: Path = REPO) -> list[str]:
    """The artefacts whose committed text differs from what this command would write."""
    found = []
    for artefact in artefacts(repo):
        text = (repo / artefact.path).read_text()
        if artefact.rewritten(text) != text:
            found.append(_docs_block_name(artefact))
    return found


def write(repo: Path = REPO) -> list[str]:
    """Rewrite every stale artefact; returns what changed."""
    changed = []
    for artefact in artefacts(repo):
        path = repo / artefact.path
        text = path.read_text()
        new = artefact.rewritten(text)
        if new != text:
            path.write_text(new)
            changed.append(_docs_block_name(artefact))
    return changed


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m flashrt_ros.interface.generate", description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if an artefact is stale")
    parser.add_argument("--repo", type=Path, default=REPO, help="the checkout (default: this module's)")
    args = parser.parse_args(argv)
    if not (args.repo / "docs").is_dir() or not (args.repo / "srv").is_dir():
        print(f"error: {args.repo} is not a flashrt_ros checkout (no docs/ and srv/)", file=sys.stderr)
        return 2
    try:
        listed = stale(args.repo) if args.check else write(args.repo)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for name in listed:
        print(f"{'stale' if args.check else 'rewrote'}: {name}")
    if args.check and listed:
        print("regenerate: python -m flashrt_ros.interface.generate", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
