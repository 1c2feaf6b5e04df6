"""π0 / π0.5's network as LeRobot 0.4.4 saves it: PaliGemma (SigLIP + projector + Gemma) and a Gemma action expert.

Why a module tree of its own: the names are LeRobot's
(``model.paligemma_with_expert.paligemma.model.vision_tower.vision_model...``,
``...language_model.layers.<i>...``, ``...gemma_expert.model.layers.<i>...``,
``model.action_in_proj``), so its ``model.safetensors`` loads strictly; the
forward passes live in ``modeling_pi0.py``, where the prefix KV goes to the arena.

The SigLIP tower is the one SmolVLA has too (``siglip.VisionModel``) with plain
positions ``0..n-1``; the projector maps it to the Gemma width and, unlike stock
transformers, openpi does not divide the image features by ``sqrt(width)``.
π0's expert embeds the state as a token (``state_proj``) and fuses the flow time
into the action tokens (``action_time_mlp_in/out``); π0.5's expert has no state
token and conditions every norm on the time (``time_mlp_in/out`` -> adaRMS).
"""
from __future__ import annotations

from torch import nn

from flashrt_ros.models.lerobot.pi0.gemma import GemmaSizes, GemmaStack
from flashrt_ros.models.lerobot.siglip import SiglipSizes, VisionModel


class Projector(nn.Module):
    def __init__(self, vision: int, width: int) -> None:
        super().__init__()
        self.linear = nn.Linear(vision, width)


class VisionTower(nn.Module):
    def __init__(self, v: SiglipSizes, image_size: int) -> None:
        super().__init__()
        self.vision_model = VisionModel(v, image_size, bucketed=False)


class PaliGemmaInner(nn.Module):
    def __init__(self, v: SiglipSizes, image_size: int, vlm: GemmaSizes) -> None:
        super().__init__()
        self.vision_tower = VisionTower(v, image_size)
        self.multi_modal_projector = Projector(v.hidden, vlm.width)
        self.language_model = GemmaStack(vlm, embed=True)


class PaliGemma(nn.Module):
    def __init__(self, v: SiglipSizes, image_size: int, vlm: GemmaSizes) -> None:
        super().__init__()
        self.model = PaliGemmaInner(v, image_size, vlm)


class GemmaExpert(nn.Module):
    def __init__(self, expert: GemmaSizes, adarms: bool) -> None:
        super().__init__()
        self.model = GemmaStack(expert, embed=False, cond_dim=expert.width if adarms else None)


class PaliGemmaWithExpert(nn.Module):
    def __init__(self, v: SiglipSizes, image_size: int, vlm: GemmaSizes, expert: GemmaSizes, adarms: bool) -> None:
        super().__init__()
        self.paligemma = PaliGemma(v, image_size, vlm)
        self.gemma_expert = GemmaExpert(expert, adarms)


class PiModel(nn.Module):
    """``model.*`` of a LeRobot π0 (``pi05=False``) or π0.5 checkpoint."""

    def __init__(self, v: SiglipSizes, image_size: int, vlm: GemmaSizes, expert: GemmaSizes, *, pi05: bool,
                 max_state_dim: int, max_action_dim: int) -> None:
        super().__init__()
        self.paligemma_with_expert = PaliGemmaWithExpert(v, image_size, vlm, expert, adarms=pi05)
        w = expert.width
        self.action_in_proj = nn.Linear(max_action_dim, w)
        self.action_out_proj = nn.Linear(w, max_action_dim)
        if pi05:
            self.time_mlp_in = nn.Linear(w, w)
            self.time_mlp_out = nn.Linear(w, w)
        else:
            self.state_proj = nn.Linear(max_state_dim, w)
            self.action_time_mlp_in = nn.Linear(2 * w, w)
            self.action_time_mlp_out = nn.Linear(w, w)

    @property
    def vision(self) -> VisionModel:
        return self.paligemma_with_expert.paligemma.model.vision_tower.vision_model

    @property
    def language_model(self) -> GemmaStack:
        return self.paligemma_with_expert.paligemma.model.language_model

    @property
    def expert(self) -> GemmaStack:
        return self.paligemma_with_expert.gemma_expert.model
