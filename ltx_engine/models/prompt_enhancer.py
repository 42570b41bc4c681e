"""The prompt enhancer: the text encoder's Gemma 3 rewrites a short prompt into upstream's detailed form.

Upstream (`LTXGemmaTextEncoder.enhance_t2v` / `enhance_i2v`) sends a chat of its system prompt and the
user's prompt (`user prompt: ...` for T2V, `User Raw Input Prompt: ....` with the first image for I2V)
through `generate` (at most 512 new tokens) and decodes the new tokens without special tokens. We run
the same chat through mlx-lm's generation, as the MLX port does (I2V without the image: mlx-lm's
Gemma 3 is text only), and decode greedily: one prompt gives one enhanced prompt on every machine, so
a farm render and `--local` agree bit for bit and the result can be cached by prompt.
"""

from __future__ import annotations

from functools import cache
from importlib.resources import files

MAX_NEW_TOKENS = 512   # upstream's Gemma 3 `max_new_tokens`
MODES = ("t2v", "i2v")


@cache
def system_prompt(mode: str) -> str:
    """Upstream's Gemma 3 system prompt for `mode` (ltx_engine/prompts/)."""
    if mode not in MODES:
        raise ValueError(f"enhancer mode {mode!r}: expected one of {', '.join(MODES)}")
    return files("ltx_engine.prompts").joinpath(f"gemma3_{mode}_system_prompt.txt").read_text(encoding="utf-8")


def chat(prompt: str, mode: str) -> list[dict[str, str]]:
    """The chat upstream sends: its system prompt, then the user's prompt in the mode's wording."""
    user = f"user prompt: {prompt}" if mode == "t2v" else f"User Raw Input Prompt: {prompt}."
    return [{"role": "system", "content": system_prompt(mode)}, {"role": "user", "content": user}]


def enhance(model, tokenizer, prompt: str, mode: str = "t2v", max_new_tokens: int = MAX_NEW_TOKENS) -> str:
    """The enhanced prompt: the chat through the tokenizer's template and mlx-lm's greedy generation."""
    from mlx_lm import generate
    from mlx_lm.sample_utils import make_sampler

    text = tokenizer.apply_chat_template(chat(prompt, mode), add_generation_prompt=True, tokenize=False)
    ids = tokenizer.encode(text, add_special_tokens=False)  # the template wrote `<bos>` already
    text = generate(model, tokenizer, ids, max_tokens=max_new_tokens, sampler=make_sampler(temp=0.0), verbose=False)
    return text.strip()
