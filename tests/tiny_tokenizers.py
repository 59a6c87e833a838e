"""Tokenizers built on the spot for the tiny pipeline tests (nothing is downloaded)."""

from __future__ import annotations

import json


def byte_level_qwen_tokenizer(folder, special_tokens=("<|im_start|>", "<|im_end|>")):
    """A Qwen2 tokenizer over the 256 byte symbols with no merges, saved nowhere yet:
    `folder` receives its vocab.json and merges.txt. `special_tokens` are added on top."""
    from transformers import Qwen2Tokenizer
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    folder.mkdir()
    (folder / "vocab.json").write_text(json.dumps({c: i for i, c in enumerate(bytes_to_unicode().values())}))
    (folder / "merges.txt").write_text("#version: 0.2\n")  # byte-level, no merges
    tok = Qwen2Tokenizer(str(folder / "vocab.json"), str(folder / "merges.txt"), pad_token="<|endoftext|>",
                         eos_token="<|im_end|>", unk_token=None, bos_token=None)
    tok.add_special_tokens({"additional_special_tokens": list(special_tokens)})
    return tok


def letter_tokenizer():
    """A fast tokenizer with one token per lowercase letter (+ pad, eos, unk), saved nowhere yet."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "</s>": 1, "<unk>": 2, **{chr(97 + i): 3 + i for i in range(26)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="</s>",
                                   unk_token="<unk>")
