"""A small offline stand-in for PaliGemma's tokenizer, for the π0 / π0.5 tests (the real one is on the model hub).

It keeps what matters to π: a ``<bos>`` in front of every text, ``<pad>`` as id 0,
spaces as ``▁`` starting the next piece, digits one token each (Gemma's
tokenizer splits digits too), so a π0.5 prompt's state numbers tokenise as the
runtime expects; every ASCII character is a piece, so any instruction
tokenises. ``merging=True`` builds one that does not cut the text before a
number (one piece spans ``"0 1"``), which π0.5 must refuse.

Only the ``tokenizers`` library is used: the same file is read by the runtime
(``tokenizers.Tokenizer``) and, with ``tokenizer_config.json``, by LeRobot's
preprocessor (transformers' ``AutoTokenizer``).
"""
from __future__ import annotations

import json
import string
from pathlib import Path

SPECIALS = ["<pad>", "<eos>", "<bos>", "<unk>"]
WORDS = ["Task", "State", "Action", "pick", "up", "the", "red", "blue", "green", "cube", "block", "put", "in", "box",
         "stack", "on", "open", "drawer", "place", "it", "and", "towel", "fold", "object"]


def build_tokenizer(merging: bool = False):
    """A ``tokenizers.Tokenizer`` (unigram over characters and whole words)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors

    chars = sorted(set(string.ascii_letters + string.digits + string.punctuation + "\n"))
    vocab = [(s, 0.0) for s in SPECIALS] + [("▁", -8.0)] + [(c, -10.0) for c in chars]
    vocab += [(w, -4.0) for w in WORDS] + [("▁" + w, -4.0) for w in WORDS]
    if merging:
        vocab.append(("0▁1", -1.0))
    tok = Tokenizer(models.Unigram(vocab, unk_id=SPECIALS.index("<unk>")))
    if merging:
        tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="never", split=False)
    else:
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="never", split=True),
            pre_tokenizers.Digits(individual_digits=True)])
    tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="never", split=True)
    tok.post_processor = processors.TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", 2)])
    return tok


def write_tokenizer(directory: Path, merging: bool = False) -> Path:
    """``tokenizer.json`` plus what transformers' ``AutoTokenizer`` needs to load it; returns the directory."""
    directory.mkdir(parents=True, exist_ok=True)
    build_tokenizer(merging).save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<bos>", "eos_token": "<eos>",
        "pad_token": "<pad>", "unk_token": "<unk>", "model_max_length": 4096}, indent=1))
    return directory
