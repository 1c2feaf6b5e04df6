"""Every artefact made from the declarations (docs tables, the Groot2 node model, the error codes of
every interface file) is what ``python -m flashrt_ros.interface.generate`` writes, and that command
finds, rewrites and checks them all."""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from flashrt_ros.interface import generate

REPO = Path(__file__).resolve().parents[1]
ARTEFACTS = generate.artefacts(REPO)


def copy_artefact_folders(into: Path) -> None:
    """A checkout's folders that hold artefacts, copied (the generator writes there, not here)."""
    for folder in ("docs", "msg", "srv", "action", "flashrt_ros/bt/trees"):
        shutil.copytree(REPO / folder, into / folder)


@pytest.mark.parametrize("artefact", ARTEFACTS, ids=lambda a: f"{a.path}:{a.block}")
def test_the_committed_artefact_is_the_generated_one(artefact):
    text = (REPO / artefact.path).read_text()
    assert artefact.rewritten(text) == text, "regenerate: python -m flashrt_ros.interface.generate"


def test_every_interface_file_with_an_error_code_carries_the_constants():
    carriers = {str(p.relative_to(REPO)) for folder in ("srv", "action") for p in (REPO / folder).iterdir()
                if "uint16 error_code" in p.read_text()}
    assert carriers and carriers <= {a.path for a in ARTEFACTS if a.constants}


def test_generate_rewrites_a_stale_artefact_and_leaves_the_rest(tmp_path):
    copy_artefact_folders(tmp_path)
    stale_doc = tmp_path / "docs" / "cli.md"
    stale_doc.write_text(stale_doc.read_text().replace("| `flashrt pin NAME` |", "| `flashrt pin OLD` |"))
    (tmp_path / "srv" / "Pin.srv").write_text((tmp_path / "srv" / "Pin.srv").read_text().replace(
        "uint16 INTERNAL=99", "uint16 INTERNAL=98"))
    assert generate.stale(tmp_path) == ["docs/cli.md (capsule-commands)", "srv/Pin.srv (error codes)"]
    assert generate.write(tmp_path) == ["docs/cli.md (capsule-commands)", "srv/Pin.srv (error codes)"]
    assert generate.stale(tmp_path) == []
    for name in ("docs/cli.md", "srv/Pin.srv"):
        assert (tmp_path / name).read_text() == (REPO / name).read_text()


def test_generate_check_exits_1_naming_the_stale_ones_and_writes_nothing(tmp_path):
    copy_artefact_folders(tmp_path)
    model = tmp_path / "flashrt_ros" / "bt" / "trees" / "flashrt_nodes.xml"
    model.write_text(model.read_text().replace('ID="Snapshot"', 'ID="Snapshop"'))
    run = subprocess.run([sys.executable, "-m", "flashrt_ros.interface.generate", "--check", "--repo", str(tmp_path)],
                         capture_output=True, text=True, cwd=REPO, timeout=120)
    assert run.returncode == 1, run.stderr
    assert "stale: flashrt_ros/bt/trees/flashrt_nodes.xml" in run.stdout
    assert 'ID="Snapshop"' in model.read_text()


def test_a_missing_block_is_refused_with_its_name(tmp_path):
    copy_artefact_folders(tmp_path)
    doc = tmp_path / "docs" / "services.md"
    doc.write_text(doc.read_text().replace("<!-- /generated:error-codes -->", ""))
    with pytest.raises(ValueError, match="docs/services.md: needs one <!-- generated:error-codes -->"):
        generate.write(tmp_path)
