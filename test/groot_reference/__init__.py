"""The GR00T N1.5 test reference: LeRobot 0.4.4's ``GrootPolicy`` on transformers 4.57.6, in its own process.

``run_reference(cases, spec_dir)`` is the test side: it writes the cases to a spec file and runs
``python -m groot_reference.reference`` with ``.venv/groot-reference`` (transformers 4.57.6,
``requirements-groot-reference.txt``) first on the path; that process imports ``groot_reference.env`` before
LeRobot. It builds a seeded GR00T at the case's sizes (``TINY`` by default) with LeRobot's own classes, offline,
on the CPU, and every case's directory then holds:

- the LeRobot checkpoint: ``config.json`` (``GrootConfig``), ``model.safetensors`` (the policy's state dict, names
  prefixed ``_groot_model.``), ``policy_preprocessor.json`` / ``policy_postprocessor.json`` and their stats
  (``policy_preprocessor_step_2_groot_pack_inputs_v3.safetensors``,
  ``policy_postprocessor_step_0_groot_action_unpack_unnormalize_v1.safetensors``); the base model it was made
  from (``base/``: ``GR00TN15`` config.json + model.safetensors, which ``config.json``'s ``base_model_path``
  names by absolute path) and the Eagle assets stand-in (``eagle2hg-processor-groot-n1p5/``: the Eagle
  config.json, tokenizer and processor configs, named by ``tokenizer_assets_repo``); ``groot_sizes.json``
  (the sizes, the tokenizer's ``vocab_size`` / ``image_token_index`` / ``tokens_per_tile``, the parameter count);
- ``reference_inputs.safetensors`` (``reference_inputs``): what the episode fed the preprocessor, step by step;
- ``reference_actions.safetensors`` (``reference_record``): LeRobot's outputs, the noise and the tap points;
- ``reference_run.json`` (``reference_run``): the case, timings, versions.

With ``replay=True``, ``run_reference`` reloads each case's checkpoint with LeRobot's loaders and replays the
recorded inputs and noise into ``replay_actions.safetensors`` (``replay_record``; same keys). A case of
``steps=0`` writes the checkpoint only (no episode, no ``reference_*.safetensors``): ``benchmarks/groot.py``'s
``--build``, whose LeRobot sides run ``python -m groot_reference.bench`` (timed episodes on a GPU, ``bench.py``).
"""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

import pytest
import torch

from groot_reference.reference import PUBLISHED, TINY, Case

TEST_DIR = Path(__file__).resolve().parents[1]
ROOT = TEST_DIR.parent
GROOT_REFERENCE_DIR = ROOT / ".venv" / "groot-reference"
LEROBOT_REFERENCE_DIR = ROOT / ".venv" / "lerobot-reference"

__all__ = ["PUBLISHED", "TINY", "Case", "reference_env", "run_reference", "reference_inputs", "reference_record",
           "replay_record", "reference_run"]


def _require_installed() -> None:
    """Skip (saying how to install) unless transformers 4.57.6 is in ``.venv/groot-reference`` and LeRobot is
    in ``.venv/lerobot-reference`` or importable (a GPU machine installs it from wheels)."""
    if not (GROOT_REFERENCE_DIR / "transformers").is_dir():
        pytest.skip(f"GR00T reference not installed (transformers 4.57.6 expected in {GROOT_REFERENCE_DIR}): run "
                    f"scripts/install_lerobot_reference.sh")
    if not (LEROBOT_REFERENCE_DIR / "lerobot").is_dir() and importlib.util.find_spec("lerobot") is None:
        pytest.skip(f"LeRobot reference not installed (expected in {LEROBOT_REFERENCE_DIR}): run "
                    f"scripts/install_lerobot_reference.sh")


def reference_env(home: Path) -> dict[str, str]:
    """The reference process's environment: transformers 4.57.6 ahead of the project's own (and ahead of
    whatever PYTHONPATH already holds, which stays: a GPU machine's LeRobot wheels); its Hugging Face
    caches (``env.py``) inside ``home``."""
    paths = [str(GROOT_REFERENCE_DIR), str(TEST_DIR), str(ROOT)]
    if os.environ.get("PYTHONPATH"):
        paths.append(os.environ["PYTHONPATH"])
    return dict(os.environ, PYTHONPATH=os.pathsep.join(paths), GROOT_REFERENCE_HOME=str(home))


def run_reference(cases: list[Case], spec_dir: Path, *, replay: bool = False, timeout_s: float = 1800.0,
                  threads: int = 1) -> None:
    """Build every case's checkpoint and LeRobot's episode on it (one process for all cases); with ``replay``,
    reload every case's existing checkpoint and replay its recorded inputs and noise instead. ``threads``: the
    process's torch threads (1: the tests' bits; more builds a published-size checkpoint faster)."""
    _require_installed()
    spec_dir.mkdir(parents=True, exist_ok=True)
    spec = spec_dir / ("groot_replay_spec.json" if replay else "groot_reference_spec.json")
    spec.write_text(json.dumps({"cases": [asdict(c) for c in cases], "replay": replay, "threads": threads},
                               indent=1))
    proc = subprocess.run([sys.executable, "-m", "groot_reference.reference", str(spec)],
                          env=reference_env(spec_dir / "groot_reference_home"), cwd=str(ROOT),
                          capture_output=True, text=True, timeout=timeout_s)
    if proc.returncode != 0:
        raise RuntimeError(f"the GR00T reference process failed ({proc.returncode}):\n{proc.stdout[-4000:]}\n"
                           f"{proc.stderr[-8000:]}")
    print("".join(line + "\n" for line in proc.stdout.splitlines() if line.startswith("[groot_reference]")), end="")


def _load(path: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file
    return load_file(str(path))


def reference_inputs(case: Case) -> dict[str, torch.Tensor]:
    """What the episode gave LeRobot's preprocessor at step ``s`` (with ``"task": case.task``):
    ``observation.images.cam{i}`` uint8 (steps, 3, H, W), ``observation.state`` float32 (steps, state); and the
    processors' stats, ``stats.observation.state.{min,max}`` (state,) and ``stats.action.{min,max}`` (action,)."""
    return _load(Path(case.directory) / "reference_inputs.safetensors")


def reference_record(case: Case) -> dict[str, torch.Tensor]:
    """LeRobot's episode (P replans, at the steps ``plan_steps``; M = max_action_dim, H = action_horizon):

    - ``actions`` (steps, action): the postprocessed actions (min-max unnormalised), float32;
    - ``actions_normalized`` (steps, action): ``select_action``'s outputs, before the postprocessor;
    - ``plan_steps`` (P,) int64: the steps at which the action queue was empty and the model ran;
    - ``noise`` (P, 1, H, M): the ``torch.randn`` each replan drew (seeded ``noise_seed * 100000 + p``), or the
      ``Case.noise_file`` noise it was given instead;
    - ``action_pred`` (P, 1, H, M): ``GR00TN15.get_action``'s output (all M dims, normalised);
    - ``backbone_features`` (P, 1, T, llm width): the Eagle backbone's output (the tap after the LLM's final norm);
    - the preprocessor's outputs at each replan: ``eagle_input_ids`` / ``eagle_attention_mask`` (P, 1, T) int64,
      ``eagle_pixel_values`` (P, cameras, 3, tile, tile) float32, ``state`` (P, 1, 1, max_state_dim) float32,
      ``embodiment_id`` (P, 1) int64;
    - for a case with ``rtc``, also ``rtc_chunks``, ``rtc_remaining`` and ``rtc_remaining_len``
      (``reference.rtc_run``).
    """
    return _load(Path(case.directory) / "reference_actions.safetensors")


def replay_record(case: Case) -> dict[str, torch.Tensor]:
    """``reference_record``'s keys, from the checkpoint reloaded by LeRobot and the recorded inputs and noise."""
    return _load(Path(case.directory) / "replay_actions.safetensors")


def reference_run(case: Case) -> dict:
    """The reference's run: the case, ``build_s``, ``replan_s`` (seconds per replan), versions, tokenizer and
    parameter count."""
    return json.loads((Path(case.directory) / "reference_run.json").read_text())
