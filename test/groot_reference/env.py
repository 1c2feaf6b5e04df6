"""The GR00T reference process's import environment: LeRobot 0.4.4's ``lerobot.policies.groot``, offline, on CPU.

Import this module FIRST in the reference process (``reference.main`` does), before anything imports
transformers or lerobot. What it does, and why:

1. sys.path: transformers 4.57.6 (``.venv/groot-reference``, ``requirements-groot-reference.txt``) goes in
   front of the project's transformers 5.x. On 5.x ``groot_n1.py``'s ``@dataclass class
   GR00TN15Config(PretrainedConfig)`` fails at class creation ("non-default argument 'backbone_cfg' follows
   default argument"), and ``lerobot.policies.groot.__init__`` imports it, so nothing in the package imports.
   On 4.53.2 (the π reference's) the model runs, but the vendored Eagle fast image processor calls
   ``BaseImageProcessorFast._prepare_image_like_inputs``, which 4.53 lacks. The LeRobot reference
   (``.venv/lerobot-reference``: lerobot, diffusers, einops, draccus, torchvision) is appended, as
   ``test/lerobot_reference.py`` does. ``run_reference`` already puts ``.venv/groot-reference`` first on
   PYTHONPATH; this repeats it for a process started some other way.
2. torchvision: the wheel is a CUDA build, and with the CPU torch its compiled ops fail to register
   ("operator torchvision::nms does not exist"); ``torchvision._meta_registrations`` is skipped (the
   same workaround as ``test/lerobot_reference.py``). The Eagle image processor uses only
   ``transforms.v2.functional`` (pure torch).
3. ``peft``: ``eagle2_hg_model/modeling_eagle2_5_vl.py`` imports ``LoraConfig, get_peft_model`` at module
   level and calls them only when ``use_backbone_lora`` / ``use_llm_lora`` != 0: a stub whose functions raise.
   Installed after ``import transformers`` (which probes ``find_spec("peft")`` at import).
4. ``tree`` (dm-tree): ``groot_n1.py`` swallows the ImportError, then ``GR00TN15.prepare_input`` calls
   ``tree.map_structure``: a stub with dm-tree's semantics for the dict it passes.
5. ``no_flash_attention``: the Eagle config asks for flash_attention_2 (and ``modeling_eagle2_5_vl.py``
   forces it on SigLIP); without flash_attn, transformers 4.57 raises at construction.
6. Offline Hugging Face environment: ``HF_HUB_OFFLINE`` / ``TRANSFORMERS_OFFLINE``, and ``HF_HOME``,
   ``HF_LEROBOT_HOME`` (read once, when lerobot is imported) and ``HF_MODULES_CACHE`` (where
   ``trust_remote_code`` copies the Eagle ``.py`` files) inside ``$GROOT_REFERENCE_HOME``, a directory the
   caller made (``run_reference`` does), or else a fresh temporary directory.
"""
from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import os
import sys
import tempfile
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
GROOT_REFERENCE_DIR = ROOT / ".venv" / "groot-reference"       # transformers 4.57.6, tokenizers 0.22.2, hub 0.36.0
LEROBOT_REFERENCE_DIR = ROOT / ".venv" / "lerobot-reference"   # lerobot 0.4.4, diffusers, torchvision (CUDA wheel)
#: GrootConfig.tokenizer_assets_repo's default: the hub repo ``assets.write_assets`` stands in for
ASSETS_REPO = "lerobot/eagle2hg-processor-groot-n1p5"

if "transformers" in sys.modules:
    raise RuntimeError("import groot_reference.env before transformers (and before lerobot)")

HOME = Path(os.environ.get("GROOT_REFERENCE_HOME") or tempfile.mkdtemp(prefix="groot_reference_"))
HOME.mkdir(parents=True, exist_ok=True)
os.environ["GROOT_REFERENCE_HOME"] = str(HOME)
os.environ["HF_HOME"] = str(HOME / "hf_home")
os.environ["HF_LEROBOT_HOME"] = str(HOME / "hf_lerobot_home")
os.environ["HF_MODULES_CACHE"] = str(HOME / "hf_modules")
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"

if str(GROOT_REFERENCE_DIR) in sys.path:
    sys.path.remove(str(GROOT_REFERENCE_DIR))
sys.path.insert(0, str(GROOT_REFERENCE_DIR))
if (LEROBOT_REFERENCE_DIR / "lerobot").is_dir() and str(LEROBOT_REFERENCE_DIR) not in sys.path:
    sys.path.append(str(LEROBOT_REFERENCE_DIR))


def _torchvision_without_compiled_ops() -> None:
    try:
        importlib.import_module("torchvision")
        return
    except (RuntimeError, ImportError, OSError):
        for name in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
            del sys.modules[name]
    sys.modules["torchvision._meta_registrations"] = types.ModuleType("torchvision._meta_registrations")
    importlib.import_module("torchvision")


def _stub_peft() -> None:
    if importlib.util.find_spec("peft") is not None:
        return
    peft = types.ModuleType("peft")
    peft.__spec__ = importlib.machinery.ModuleSpec("peft", None)

    class LoraConfig:  # constructed only when use_backbone_lora / use_llm_lora != 0
        def __init__(self, *args, **kwargs):
            raise RuntimeError("peft stub: LoRA is not available (use_backbone_lora / use_llm_lora must be 0)")

    def get_peft_model(*args, **kwargs):
        raise RuntimeError("peft stub: LoRA is not available")

    peft.LoraConfig, peft.get_peft_model = LoraConfig, get_peft_model
    sys.modules["peft"] = peft


def _stub_tree() -> None:
    if importlib.util.find_spec("tree") is not None:
        return
    tree = types.ModuleType("tree")
    tree.__spec__ = importlib.machinery.ModuleSpec("tree", None)

    def map_structure(fn, structure):
        """dm-tree's semantics for what ``GR00TN15.prepare_input`` passes: a BatchFeature (a Mapping, which
        keeps its type) of tensors, arrays and strings; lists and tuples recurse."""
        from collections.abc import Mapping
        if isinstance(structure, Mapping):
            return type(structure)({k: map_structure(fn, v) for k, v in structure.items()})
        if isinstance(structure, (list, tuple)):
            return type(structure)(map_structure(fn, v) for v in structure)
        return fn(structure)

    tree.map_structure = map_structure
    sys.modules["tree"] = tree


_torchvision_without_compiled_ops()
import transformers  # noqa: E402  (before the stubs: transformers probes find_spec("peft") at import)

if not transformers.__version__.startswith("4.57"):
    raise RuntimeError(f"the GR00T reference needs transformers 4.57 (requirements-groot-reference.txt in "
                       f"{GROOT_REFERENCE_DIR}); imported {transformers.__version__} from {transformers.__file__}")
_stub_peft()
_stub_tree()


def no_flash_attention(impl: str = "eager") -> None:
    """Give every transformers model that asks for ``flash_attention*`` the implementation ``impl`` instead.

    The Eagle config.json says ``"_attn_implementation": "flash_attention_2"`` and
    ``Eagle25VLForConditionalGeneration.__init__`` forces it on the SigLIP config; transformers 4.57 checks it in
    ``PreTrainedModel.__init__`` and raises ImportError without flash_attn (which needs CUDA). Mapping the request
    lets construction pass and is also what runs: 4.57 dispatches on ``config._attn_implementation`` at every
    forward. flash, sdpa and eager compute the same masked softmax attention; only rounding differs."""
    from transformers import modeling_utils
    cls = modeling_utils.PreTrainedModel
    orig = getattr(cls._check_and_adjust_attn_implementation, "_groot_original",
                   cls._check_and_adjust_attn_implementation)

    def check(self, attn_implementation, is_init_check=False):
        if isinstance(attn_implementation, str) and attn_implementation.startswith("flash_attention"):
            attn_implementation = impl
        return orig(self, attn_implementation, is_init_check)

    check._groot_original = orig
    cls._check_and_adjust_attn_implementation = check
