"""Tokenizers, chat templates and streaming detokenisation for the LLM engine.

Why a thin wrapper: the engine only needs ``encode``/``decode``, the stop ids and
"the ids of one more user turn"; hiding the backend (a ``tokenizers`` BPE built
from GGUF metadata, or a byte tokenizer for random test models) keeps the engine
free of tokenizer quirks.
"""
from __future__ import annotations

from typing import Protocol, Sequence

_GGUF_CONTROL = 3  # llama.cpp token_type for control (special) tokens


class Tokenizer(Protocol):
    """What the engine requires of a tokenizer."""

    vocab_size: int
    stop_ids: tuple[int, ...]

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...

    def chat_ids(self, content: str, *, after_token: int | None) -> list[int]: ...


class HFTokenizer:
    """A transformers fast tokenizer plus its chat template.

    ``chat_ids`` renders one user turn. On a fresh transcript (``after_token`` is
    None) that is the full template (system prompt included). On a continuing
    transcript it is the text the template would put after the previous
    assistant turn, found by rendering a stub conversation with and without the
    new turn; if the transcript already ends in the end-of-turn token the
    template's copy of it is dropped so it is not fed twice.
    """

    def __init__(self, hf_tokenizer, stop_ids: Sequence[int] | None = None) -> None:
        self.hf = hf_tokenizer
        self.vocab_size = len(hf_tokenizer)
        ids = list(stop_ids) if stop_ids is not None else []
        if not ids and hf_tokenizer.eos_token_id is not None:
            ids.append(hf_tokenizer.eos_token_id)
        self.stop_ids = tuple(dict.fromkeys(ids))
        self._special = set(hf_tokenizer.all_special_ids)

    def encode(self, text: str) -> list[int]:
        return list(self.hf.encode(text, add_special_tokens=False))

    def decode(self, ids: Sequence[int]) -> str:
        return self.hf.decode(list(ids), skip_special_tokens=True)

    def _render(self, messages: list[dict], generation_prompt: bool) -> str:
        return self.hf.apply_chat_template(messages, tokenize=False,
                                           add_generation_prompt=generation_prompt)

    def chat_ids(self, content: str, *, after_token: int | None) -> list[int]:
        turn = [{"role": "user", "content": content}]
        if self.hf.chat_template is None:
            return self.encode(content)
        if after_token is None:
            return self.encode(self._render(turn, True))
        stub = [{"role": "user", "content": "\x00"}, {"role": "assistant", "content": "\x01"}]
        head = self._render(stub, False)
        full = self._render(stub + turn, True)
        cut = head.rfind("\x01")
        if cut < 0 or not full.startswith(head):
            return self.encode(self._render(turn, True))
        text = head[cut + 1:] + full[len(head):]
        closing = self.hf.convert_ids_to_tokens(after_token)
        if after_token in self.stop_ids and isinstance(closing, str) and text.startswith(closing):
            text = text[len(closing):]
        return self.encode(text)


def tokenizer_from_gguf_metadata(meta: dict) -> HFTokenizer:
    """Build a byte-level BPE tokenizer from a GGUF's ``tokenizer.ggml.*`` fields.

    Only the ``gpt2`` model type (GPT-2 style byte-level BPE: SmolLM2, Llama 3,
    Qwen) is supported. Digits are split one by one first, as llama.cpp's
    ``smollm``/``llama-bpe`` pre-tokenisers do.
    """
    from tokenizers import AddedToken, decoders, models, pre_tokenizers
    from tokenizers import Tokenizer as _BackendTokenizer
    from transformers import PreTrainedTokenizerFast

    kind = meta.get("tokenizer.ggml.model")
    if kind != "gpt2":
        raise NotImplementedError(f"GGUF tokenizer model {kind!r} is not supported (only 'gpt2')")
    tokens: list[str] = list(meta["tokenizer.ggml.tokens"])
    merges = [tuple(m.split(" ", 1)) for m in meta["tokenizer.ggml.merges"]]
    types = list(meta.get("tokenizer.ggml.token_type", [1] * len(tokens)))
    backend = _BackendTokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges,
                                           fuse_unk=False, byte_fallback=False))
    backend.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    backend.decoder = decoders.ByteLevel()
    specials = [AddedToken(tokens[i], special=True, normalized=False)
                for i, t in enumerate(types) if t == _GGUF_CONTROL]
    backend.add_special_tokens(specials)

    def token(key: str) -> str | None:
        idx = meta.get(f"tokenizer.ggml.{key}_token_id")
        return tokens[int(idx)] if idx is not None else None

    hf = PreTrainedTokenizerFast(tokenizer_object=backend, bos_token=token("bos"),
                                 eos_token=token("eos"), unk_token=token("unknown"),
                                 pad_token=token("padding"),
                                 chat_template=meta.get("tokenizer.chat_template"))
    stop = [int(meta["tokenizer.ggml.eos_token_id"])] if "tokenizer.ggml.eos_token_id" in meta else []
    eot = meta.get("tokenizer.ggml.eot_token_id")
    if eot is not None:
        stop.append(int(eot))
    return HFTokenizer(hf, stop_ids=stop)


class ByteTokenizer:
    """UTF-8 bytes as ids, after three ChatML control tokens: for random-weight test models.

    Ids: 0 ``<|endoftext|>``, 1 ``<|im_start|>``, 2 ``<|im_end|>``, 3..258 bytes.
    """

    SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
    OFFSET = len(SPECIALS)

    def __init__(self) -> None:
        self.vocab_size = 256 + self.OFFSET
        self.stop_ids = (0, 2)

    def encode(self, text: str) -> list[int]:
        return [b + self.OFFSET for b in text.encode("utf-8")]

    def decode(self, ids: Sequence[int]) -> str:
        data = bytes(i - self.OFFSET for i in ids if self.OFFSET <= i < self.vocab_size)
        return data.decode("utf-8", errors="replace")

    def chat_ids(self, content: str, *, after_token: int | None) -> list[int]:
        """ChatML without a system prompt; a continuing turn first closes the previous one."""
        turn = [1] + self.encode("user\n" + content) + [2] + self.encode("\n") + [1] + self.encode("assistant\n")
        if after_token is None:
            return turn
        return ([] if after_token == 2 else [2]) + self.encode("\n") + turn


class StreamDecoder:
    """Turns a stream of token ids into text pieces without splitting UTF-8 characters.

    Byte-level BPE can cut a character across tokens, so a piece is released
    only once the decoded tail no longer ends in U+FFFD; decoding re-reads only a
    short window (``prefix``..end), not the whole transcript.
    """

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self._prefix = 0   # window start
        self._read = 0     # ids up to here have been released as text

    def push(self, token_id: int) -> str:
        self.ids.append(token_id)
        before = self.tokenizer.decode(self.ids[self._prefix:self._read])
        after = self.tokenizer.decode(self.ids[self._prefix:])
        if len(after) > len(before) and not after.endswith("\ufffd"):
            self._prefix, self._read = self._read, len(self.ids)
            return after[len(before):]
        return ""
