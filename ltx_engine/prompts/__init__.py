"""Upstream's Gemma 3 enhancer system prompts, as data: Lightricks LTX-2 (Apache-2.0),
`ltx_core/text_encoders/gemma/encoders/prompts/gemma3_{t2v,i2v}_system_prompt.txt` at 400fd310.

Kept byte for byte: the enhanced prompt (and so the render) depends on every character of them.
"""
