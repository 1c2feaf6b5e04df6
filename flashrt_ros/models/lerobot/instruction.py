"""A VLA's language instruction: tokenised on the host, kept as episode state in two arena buffers.

Why a mixin shared by SmolVLA and π0 / π0.5: both keep the instruction (and the
action queue and noise stream beside it, ``episode_specs``) the same
way (token ids right-padded to the preprocessor's ``max_length`` and a length,
written between two steps; writing it empties the action queue so the next
step plans with it) and both tokenise it as LeRobot's preprocessor does for
them (a newline appended, truncated). The tokenizer is the checkpoint's
``tokenizer.json`` (``tokenizer_files.py``), loaded on first use.
The names of all these buffers are declared here once, each policy giving
only its ``PREFIX`` (``policy.smolvla.``, ``policy.pi0.``).
"""
from __future__ import annotations

from pathlib import Path

import torch

from flashrt_ros.models.lerobot.tokenizer_files import TokenizerSettings
from flashrt_ros.models.policy_interface import RNG_PLANS, RNG_SEED
from flashrt_ros.runtime.arena import BufferSpec, StateArena
from flashrt_ros.runtime.errors import InvalidArgument


class PrefixedName:
    """A buffer name under its policy class's ``PREFIX``: ``KEY = PrefixedName("kv.k.")`` reads as
    ``"policy.smolvla.kv.k."`` on ``SmolVLAPolicy`` (and its instances), ``"policy.pi0.kv.k."`` on ``PI0Policy``."""

    def __init__(self, suffix: str) -> None:
        self.suffix = suffix

    def __get__(self, instance: object, owner: type) -> str:
        return owner.PREFIX + self.suffix


class LanguageInstruction:
    """Mixin for a VLA ``PolicyModule``: its prefix KV buffers (``prefix_specs``), its instruction, action queue
    and noise-stream buffers (``episode_specs``), the cold start (``init_state``) and the instruction verbs.

    The buffer names are declared here once, under the class's ``PREFIX``; the noise stream's are every policy's
    (``policy.rng.*``). Needs ``PREFIX``, ``dtype``, ``tokenizer_file``, ``tokenizer_settings`` and a ``cfg``
    with ``tokenizer_max_length``, ``n_action_steps``, ``action_dim``, ``seed`` and ``vlm.vocab_size``."""

    PREFIX: str                                    # e.g. "policy.smolvla."
    KEY = PrefixedName("kv.k.")                    # + layer index: the prefix's keys (RoPE'd)
    VALUE = PrefixedName("kv.v.")                  # + layer index: the prefix's values
    PREFIX_LEN = PrefixedName("prefix_len")
    LANG = PrefixedName("lang_tokens")
    LANG_LEN = PrefixedName("lang_len")
    QUEUE = PrefixedName("queue")
    LEFT = PrefixedName("queue_left")
    RNG_SEED = RNG_SEED
    PLANS = RNG_PLANS
    tokenizer_file: Path | None
    tokenizer_settings: TokenizerSettings
    _tokenizer = None

    @property
    def instruction_budget(self) -> int:
        """Instruction ids the prefix has room for (the preprocessor's ``max_length``)."""
        return self.cfg.tokenizer_max_length

    @property
    def vocab_size(self) -> int:
        return self.cfg.vlm.vocab_size

    def prefix_specs(self, layers: int, kv_shape: tuple[int, ...], model: str) -> list[BufferSpec]:
        """Each prefix layer's keys and values ``(rows, kv_heads, head_dim)`` (live rows: ``PREFIX_LEN``)."""
        specs = []
        for i in range(layers):
            for name, what in ((self.KEY, "keys (RoPE'd)"), (self.VALUE, "values")):
                specs.append(BufferSpec(f"{name}{i}", kv_shape, self.dtype, group="kv", live_axis=0,
                                        length_from=self.PREFIX_LEN, doc=f"{model} layer {i} prefix {what}"))
        return specs + [BufferSpec(self.PREFIX_LEN, (), torch.int64, group="kv",
                                   doc="valid prefix tokens (live KV rows)")]

    def episode_specs(self, instruction_doc: str = "instruction token ids (right-padded)") -> list[BufferSpec]:
        """The buffers every VLA episode has besides its prefix: instruction, action queue, noise stream."""
        c = self.cfg
        return [
            BufferSpec(self.LANG, (c.tokenizer_max_length,), torch.int64, group="instruction", doc=instruction_doc),
            BufferSpec(self.LANG_LEN, (), torch.int64, group="instruction", doc="instruction length in tokens"),
            BufferSpec(self.QUEUE, (c.n_action_steps, c.action_dim), torch.float32, group="policy",
                       doc="action queue: the current chunk's first n_action_steps (normalised)"),
            BufferSpec(self.LEFT, (), torch.int64, group="policy", doc="actions left in the queue"),
            BufferSpec(self.RNG_SEED, (), torch.int64, group="rng", doc="noise seed of this episode"),
            BufferSpec(self.PLANS, (), torch.int64, group="rng", doc="chunks planned (the noise counter)"),
        ]

    def init_state(self, arena: StateArena) -> None:
        """Cold start: the configured noise seed and the default instruction."""
        arena[self.RNG_SEED].fill_(self.cfg.seed)
        self.write_instruction(arena, self._default_ids)

    def tokenizer(self):
        """The checkpoint's tokenizer (``tokenizers.Tokenizer``); ``InvalidArgument`` when there is none."""
        if self._tokenizer is None:
            if self.tokenizer_file is None:
                raise InvalidArgument(f"no tokenizer.json for {type(self).__name__} instructions (looked in the "
                                      f"checkpoint and in {self.tokenizer_settings.name!r}); give token ids instead")
            from tokenizers import Tokenizer
            self._tokenizer = Tokenizer.from_file(str(self.tokenizer_file))
        return self._tokenizer

    def set_default_instruction(self, text: str) -> None:
        """The instruction every episode starts with (``init_state``; the node parameter ``policy_instruction``)."""
        self._default_ids = self.instruction_ids(text) if text else []
        self.default_instruction = text

    def instruction_ids(self, text: str) -> list[int]:
        """Token ids of an instruction as LeRobot's preprocessor makes them (newline appended, truncated)."""
        text = text if text.endswith("\n") else text + "\n"
        return self.tokenizer().encode(text, add_special_tokens=True).ids[: self.instruction_budget]

    def write_instruction(self, arena: StateArena, ids: list[int]) -> None:
        """Make ``ids`` the instruction and empty the queue, so the next step plans with it (between steps)."""
        n, vocab = self.instruction_budget, self.vocab_size
        if len(ids) > n or any(not 0 <= i < vocab for i in ids):
            raise InvalidArgument(f"instruction ids must be at most {n} ids in [0, {vocab})")
        tokens = torch.zeros(n, dtype=torch.int64)
        tokens[: len(ids)] = torch.tensor(ids, dtype=torch.int64)
        arena[self.LANG].copy_(tokens)
        arena[self.LANG_LEN].fill_(len(ids))
        arena[self.LEFT].zero_()
