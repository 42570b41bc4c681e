"""A small real tokenizer, built offline, for tiny packs and tests.

Tests must tokenize real prompts without downloading Gemma's 262k-token vocabulary. We build a
WordPiece tokenizer from a fixed vocabulary (special tokens, printable ASCII characters, their `##`
continuations and a short English word list), so every text tokenizes, ids vary with the text, and
the files are byte-identical on every machine (no training step, nothing random). The special
tokens copy Gemma's ids (`<pad>` 0, `<eos>` 1, `<bos>` 2, `<unk>` 3) and, like Gemma, a `<bos>` is
prepended. The folder loads with `transformers.AutoTokenizer` and `mlx_lm.utils.load_tokenizer`.
"""

from __future__ import annotations

import json
import string
from pathlib import Path

from tokenizers import Tokenizer, decoders, normalizers, pre_tokenizers, processors
from tokenizers.models import WordPiece

SPECIAL_TOKENS = ("<pad>", "<eos>", "<bos>", "<unk>")

_WORDS = """
a an the and or but of in on at to from with without over under above below into onto by for as is
are was were be been being it its this that these those there here he she they we you i his her
their our your my me him them us who what when where why how all some many much more most few
little very slowly quickly softly gently brightly camera shot close up wide view scene frame
light lights dark shadow shadows sun sunset sunrise moon night day morning evening sky cloud
clouds rain snow wind fog mist water river lake sea ocean wave waves beach sand forest tree trees
leaf leaves grass flower flowers field mountain mountains hill road street city town house room
window door wall floor table chair car train boat bird birds dog cat horse fish man woman child
people person face eyes hair hand hands smile smiles walks walking runs running looks looking
turns turning moves moving flies flying falls falling stands standing sits sitting speaks talks
says sings plays dances holds opens closes red orange yellow green blue purple white black gray
gold silver warm cold soft loud quiet old young small large big tall long short new bright
cinematic realistic slow motion pan tilt zoom tracking static handheld aerial drone focus blur
sound music voice song noise footsteps birdsong thunder ambient
"""


def _vocabulary() -> dict[str, int]:
    """Fixed token list: specials, characters, `##` continuations, then words; ids in that order."""
    tokens: list[str] = list(SPECIAL_TOKENS)
    chars = [c for c in string.printable if not c.isspace()]
    tokens += chars
    tokens += ["##" + c for c in chars]
    seen = set(tokens)
    for word in _WORDS.split():
        if word not in seen:
            seen.add(word)
            tokens.append(word)
    return {token: index for index, token in enumerate(tokens)}


def build_tiny_tokenizer(bos: bool = True) -> Tokenizer:
    """The tiny WordPiece tokenizer (lower-cased, punctuation split, `<bos>` prepended unless `bos` is
    False: Gemma 4's tokenizer adds none, and upstream prepends it)."""
    vocab = _vocabulary()
    tok = Tokenizer(WordPiece(vocab, unk_token="<unk>", max_input_chars_per_word=100))
    tok.normalizer = normalizers.Sequence([normalizers.NFD(), normalizers.StripAccents(), normalizers.Lowercase()])
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece(prefix="##")
    if bos:
        tok.post_processor = processors.TemplateProcessing(
            single="<bos> $A", pair="<bos> $A $B", special_tokens=[("<bos>", vocab["<bos>"])]
        )
    tok.add_special_tokens(list(SPECIAL_TOKENS))
    return tok


def tiny_vocab_size() -> int:
    """Number of tokens of the tiny tokenizer (the tiny Gemma's vocab size)."""
    return len(_vocabulary())


# Gemma's turn markup (the system prompt opens the first user turn), so the enhancer's chat renders.
CHAT_TEMPLATE = (
    "{{ bos_token }}{% if messages[0]['role'] == 'system' %}{% set first = messages[0]['content'] + '\\n\\n' %}"
    "{% set turns = messages[1:] %}{% else %}{% set first = '' %}{% set turns = messages %}{% endif %}"
    "{% for m in turns %}<start_of_turn>{{ 'model' if m['role'] == 'assistant' else m['role'] }}\n"
    "{{ (first if loop.first else '') + m['content'] }}<end_of_turn>\n{% endfor %}"
    "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
)


def write_tiny_tokenizer(folder: str | Path, model_max_length: int = 1024, bos: bool = True) -> Path:
    """Write tokenizer.json, tokenizer_config.json and special_tokens_map.json (HF/mlx-lm layout)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    build_tiny_tokenizer(bos).save(str(folder / "tokenizer.json"))
    specials = {"bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>", "unk_token": "<unk>"}
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        **specials,
        "add_bos_token": bos,
        "add_eos_token": False,
        "padding_side": "left",
        "model_max_length": model_max_length,
        "clean_up_tokenization_spaces": False,
        "chat_template": CHAT_TEMPLATE,
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    (folder / "special_tokens_map.json").write_text(json.dumps(specials, indent=2, sort_keys=True) + "\n")
    return folder
