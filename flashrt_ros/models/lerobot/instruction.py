"""A VLA's language instruction: tokenised on the host, kept as episode state in two arena buffers.

Why a mixin shared by SmolVLA and π0 / π0.5: both keep the instruction the same
way (token ids right-padded to the preprocessor's ``max_length`` and a length,
written between two steps; writing it empties the action queue so the next
step plans with it) and both tokenise it as LeRobot's preprocessor does for
them (a newline appended, truncated). The tokenizer is the checkpoint's
``tokenizer.json`` (``tokenizer_files.py``), loaded on first use.
"""
from __future__ import annotations

from pathlib import Path

import torch

from flashrt_ros.models.lerobot.tokenizer_files import TokenizerSettings
from flashrt_ros.runtime.arena import StateArena
from flashrt_ros.runtime.errors import InvalidArgument


class LanguageInstruction:
    """Mixin for a ``PolicyModule`` with ``LANG`` / ``LANG_LEN`` / ``LEFT`` buffers, ``tokenizer_file``,
    ``tokenizer_settings``, ``instruction_budget`` (ids) and ``vocab_size``."""

    LANG: str
    LANG_LEN: str
    LEFT: str
    tokenizer_file: Path | None
    tokenizer_settings: TokenizerSettings
    _tokenizer = None

    @property
    def instruction_budget(self) -> int:
        raise NotImplementedError

    @property
    def vocab_size(self) -> int:
        raise NotImplementedError

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
