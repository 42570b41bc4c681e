"""The engine's public surface for workers: the stage operations the farm calls.

    encode_prompt     prompt → video/audio text contexts
    encode_image      an RGB image → a normalised image latent (for image conditioning)
    denoise_stage1    contexts (+ image latent) → stage-1 video and audio latents
    upsample_spatial  latent → latent at twice the resolution
    denoise_stage2    upsampled latent + frozen stage-1 audio → stage-2 video latent
    forward           one transformer forward on a token set (what a stage-2 tile runs)
    upsample_temporal latent → latent with 2(N-1)+1 pixel frames (a DFR round's first task)
    dfr_tile          one DFR temporal tile: anchors + new slots, Euler-ancestral → window + slot latents
    predict_duration  LTX-2.5: text contexts → the clip length the prompt implies (DurationHead)
    decode_video      latent (or a latent slice) → pixels in [0, 1], (F, H, W, 3)
    decode_video_tile one decode tile of a latent → raw decoder pixels (1, 3, f, h, w), blended later
    decode_audio      audio latent → waveform (channels, samples) and its sample rate
    encode_audio      a user's track (the window A2V renders to) → audio latent
    encode_video_tile one tile of a source clip's pixels → its latent tile (blended later)

Everything crossing this surface is numpy float32, so it can travel as a blob and the results do not
depend on which process computed them. The sampler math lives in `ltx_engine.rules.sampling`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path

import mlx.core as mx
import numpy as np

from ltx_engine import dfr
from ltx_engine.crf import h264_round_trip
from ltx_engine.denoise import (
    StageInputs,
    build_audio_state,
    build_stage_states,
    run_denoise,
    stage_marker,
    stage_slots,
)
from ltx_engine.loading.pack import Pack
from ltx_engine.loading.registry import EncoderFolder, ModelRegistry
from ltx_engine.lora.dev_distilled import DIT_NAMES
from ltx_engine.media_stage import attention_mask, generated_audio, refuse_unmasked
from ltx_engine.rules import text_encoders
from ltx_engine.rules.components import TEXT_ENCODER
from ltx_engine.rules.media import image_to_pixels
from ltx_engine.rules.tokens import unpatchify_audio, unpatchify_video

Progress = Callable[[int, int], None]


class Engine:
    """Stage operations over one process-wide model registry."""

    def __init__(self, registry: ModelRegistry | None = None):
        self.registry = registry or ModelRegistry()
        self._caches: list = []  # the step caches of the task running (`cache_skips` reads and clears them)

    stream_blocks = False  # the worker's per-task choice: the DiT streamed block by block (ltx_engine.loading.streaming)

    def model(self, pack: Pack, component: str):
        return self.registry.get(self._seen(pack, component), component)

    def _seen(self, pack: Pack, component: str):
        """The pack as this task loads `component` from it: with its DiT streamed when the worker chose so."""
        if component in DIT_NAMES and self.stream_blocks:  # a guidance pass's dev DiT too
            from ltx_engine.loading.streaming import StreamedPack, can_stream

            return StreamedPack(pack) if can_stream(pack) else pack
        return pack

    def prepare(self, pack: Pack, components: Iterable[str], encoder_dir: Path | None = None) -> None:
        """Make room for the components a task loads (models it does not need are dropped first); a text
        encoder not loaded yet counts with its weight files' size before it loads."""
        needed = [(self._seen(pack, c).key, c) for c in components if c != TEXT_ENCODER]
        incoming = 0
        if encoder_dir is not None:
            key = (EncoderFolder(encoder_dir).key, TEXT_ENCODER)
            needed.append(key)
            incoming = 0 if self.registry.has(key) else text_encoders.weight_bytes(encoder_dir)
        self.registry.retain(needed, incoming)

    def encode_prompt(self, pack: Pack, prompt: str, encoder_dir: Path | None = None) -> dict[str, np.ndarray]:
        """Prompt → contexts, with the Gemma folder given (a separate encoder) or the pack's own."""
        from ltx_engine.models.text_encoder import encode_prompt

        encoder = self.registry.get(EncoderFolder(encoder_dir or pack.text_encoder_dir), TEXT_ENCODER)
        return encode_prompt(encoder, self.model(pack, "connector"), prompt)

    def relay_table(self, pack: Pack, prompt: str, relay: dict, encoder_dir: Path | None = None) -> np.ndarray:
        """Prompt Relay's table for the stages (`rules.prompt_relay.RelayTable`): each segment's text columns
        in the combined prompt, counted with the encoder's own tokenizer. `relay`: the text task's params
        (segments as [text, start, end] seconds, fps, epsilon, strength)."""
        from ltx_engine.rules import prompt_relay as pr

        encoder = self.registry.get(EncoderFolder(encoder_dir or pack.text_encoder_dir), TEXT_ENCODER)
        texts = [str(s[0]) for s in relay["segments"]]
        total = encoder.token_count(pr.combined_prompt(prompt, texts))
        if total > encoder.max_length:
            raise pr.RelayError(f"the prompt and its segments are {total} tokens, past the text encoder's "
                                f"{encoder.max_length}: it would cut them and every segment would read the wrong words")
        ranges = pr.token_ranges(encoder.token_count, prompt, texts)
        rows = tuple((a, b, float(s[1]), float(s[2])) for (a, b), s in zip(ranges, relay["segments"], strict=True))
        return pr.RelayTable(float(relay["fps"]), float(relay["epsilon"]), float(relay["strength"]), rows).to_array()

    def enhance_prompt(self, pack: Pack, prompt: str, mode: str, max_new_tokens: int,
                       encoder_dir: Path | None = None) -> str:
        """The prompt rewritten by the text encoder's Gemma 3 (`models.prompt_enhancer`), greedily."""
        from ltx_engine.models.prompt_enhancer import enhance

        encoder = self.registry.get(EncoderFolder(encoder_dir or pack.text_encoder_dir), TEXT_ENCODER)
        return enhance(encoder.model, encoder.tokenizer, prompt, mode, max_new_tokens)

    def encode_image(self, pack: Pack, image: np.ndarray, height: int, width: int, crf: int = 0) -> np.ndarray:
        """uint8 (H, W, 3) → H.264 round trip at `crf` (0: none) → resized, centre-cropped → VAE encoder
        → latent (1, C, 1, h, w)."""
        pixels = image_to_pixels(h264_round_trip(image, crf), height, width)
        latent = self.model(pack, "vae_encoder")(mx.array(pixels))
        return np.array(latent.astype(mx.float32))

    def denoise_stage1(self, pack: Pack, inputs: StageInputs, progress: Progress | None = None) -> dict:
        video, audio = build_stage_states(inputs, self._latent_channels(pack))
        forward = self._forward_fn(pack, inputs, video.num_tokens)
        video, audio = run_denoise(video, audio, inputs.sigmas, forward, progress, inputs.ancestral())
        audio = generated_audio(audio, inputs)  # Dub-It's reference audio tokens dropped
        out = {
            "video_latent": unpatchify_video(video.latent[:, : inputs.video_tokens], inputs.latent_grid),
            "audio_latent": unpatchify_audio(audio.latent, inputs.audio_channels),
        }
        return out | ({"slots": stage_slots(inputs, video)} if inputs.slots else {})

    def denoise_stage2(self, pack: Pack, inputs: StageInputs, progress: Progress | None = None) -> dict:
        video, audio = build_stage_states(inputs, self._latent_channels(pack))
        forward = self._forward_fn(pack, inputs, video.num_tokens)
        video, _ = run_denoise(video, audio, inputs.sigmas, forward, progress, inputs.ancestral())
        out = {"video_latent": unpatchify_video(video.latent[:, : inputs.video_tokens], inputs.latent_grid)}
        return out | ({"slots": stage_slots(inputs, video)} if inputs.slots else {})

    def prepare_stage(self, pack: Pack, inputs: StageInputs) -> dict[str, np.ndarray]:
        """The initial (noised) state of a stage as token arrays, for a stage run as tiled steps."""
        refuse_unmasked(inputs, "a stage run as prepared token arrays")
        video, audio = build_stage_states(inputs, self._latent_channels(pack))
        return {"latent": video.latent, "clean": video.clean_latent, "mask": video.denoise_mask,
                "positions": video.positions, "audio_latent": audio.latent, "audio_mask": audio.denoise_mask,
                "audio_positions": audio.positions, "audio_clean": audio.clean_latent}

    def prepare_audio_stage(self, inputs: StageInputs) -> dict[str, np.ndarray]:
        """An audio-only stage's initial state (T2A) as token arrays: the audio's alone."""
        audio = build_audio_state(inputs)
        return {"audio_latent": audio.latent, "audio_mask": audio.denoise_mask, "audio_positions": audio.positions,
                "audio_clean": audio.clean_latent}

    def guidance_pass(self, pack: Pack, params: dict, arrays: dict[str, np.ndarray],
                      contexts: dict[str, np.ndarray], split=None) -> dict[str, np.ndarray]:
        """One pass of a guided step on the pack's dev DiT (`guided.run_pass`): x0 of both modalities;
        `split` (`sp_denoise.Split`) its forward sequence-parallel, the same bits."""
        from ltx_engine.guided import run_pass

        return run_pass(self.model(pack, "transformer_dev"), params, arrays, contexts, self.step_cache(params, arrays),
                        split)

    def step_cache(self, params: dict, inputs: dict[str, np.ndarray], steps: int = 0):
        """The task's step cache (`ltx_engine.step_cache`), its state from the `cache_*` inputs; None when
        the render caches nothing. Kept until `cache_skips` so the task's metrics can count its skips."""
        from ltx_engine.step_cache import from_params

        cache = from_params(params, inputs, steps)
        if cache is not None:
            self._caches.append(cache)
        return cache

    def cache_skips(self) -> int | None:
        """Forwards whose block stack the task's step caches skipped (None: it cached nothing)."""
        caches, self._caches = self._caches, []
        return sum(c.skipped for c in caches) if caches else None

    def forward(self, pack: Pack, tokens: dict[str, np.ndarray], sigma: float,
                contexts: dict[str, np.ndarray], options=None, cache=None) -> np.ndarray:
        """One transformer forward on a token set (a stage-2 tile); returns the video velocity.
        `options`: `forward_options.ForwardOptions` (the tile's sparse tau, the compute dtype); `cache`:
        the tile's step cache across its stage's steps (`step_cache`)."""
        from ltx_engine.denoise import forward_tokens

        return forward_tokens(self.model(pack, "transformer"), tokens, sigma, contexts, options, cache)

    def _forward_fn(self, pack: Pack, inputs: StageInputs, num_tokens: int):
        """The stage's forward; the keyframe marker only reaches a DiT that has the LTX-2.5 embedding."""
        model = self.model(pack, "transformer")
        from ltx_engine.denoise import model_forward
        from ltx_engine.models.forward_options import step_options

        marker = stage_marker(inputs, num_tokens) if model.config.use_keyframes_abs_pos_embedding else None
        mask = attention_mask(inputs, num_tokens)  # IC-LoRA control's attention strength, else None
        cache = self.step_cache({"step_cache": inputs.step_cache}, {}, len(inputs.sigmas) - 1)  # kept in memory

        def forward(video, audio, sigma: float):
            out = model_forward(model, video, audio, sigma, inputs.contexts, marker,
                                step_options(inputs.sparse_taus, inputs.sigmas, sigma, inputs.compute_dtype), mask,
                                cache)
            if cache is not None:
                cache.next_step()
            return out

        return forward

    def _latent_channels(self, pack: Pack) -> int:
        return int(pack.config.get("transformer", {}).get("in_channels", 128))

    def upsample_spatial(self, pack: Pack, latent: np.ndarray) -> np.ndarray:
        from ltx_engine.models.upsampler import upsample_latent

        stats = self.model(pack, "vae_decoder").per_channel_statistics  # the VAE's latent statistics
        mean, std = stats.mean, stats.std
        out = upsample_latent(self.model(pack, "spatial_upscaler"), mx.array(latent), mean, std)
        return np.array(out.astype(mx.float32))

    def upsample_temporal(self, pack: Pack, latent: np.ndarray) -> np.ndarray:
        """DFR's temporal x2 with the pack's temporal upsampler, between the VAE's latent statistics."""
        from ltx_engine.models.upsampler import upsample_latent

        stats = self.model(pack, "vae_decoder").per_channel_statistics
        out = upsample_latent(self.model(pack, "temporal_upscaler"), mx.array(latent), stats.mean, stats.std)
        return np.array(out.astype(mx.float32))

    def dfr_tile(self, pack: Pack, tile: dfr.DfrTileInputs, progress: Progress | None = None) -> dict[str, np.ndarray]:
        """One DFR temporal tile from the round's upsampled latent, the carried keyframes and (a non-first
        tile) its prefix pinned on the tile before it."""
        model = self.model(pack, "transformer")
        if not model.config.use_keyframes_abs_pos_embedding:
            raise ValueError(f"{pack.root}: the transformer has no keyframe position embedding (not an LTX-2.5 "
                             "pack); DFR temporal rounds need one")
        image = None if tile.image_latent is None else (tile.image_latent, tile.image_frame, tile.image_strength)
        state = dfr.noised_tile_state(tile.latent, tile.tile, tile.plan, tile.carry, tile.plan.seams, image,
                                      tile.images, tile.prefix())
        forward = dfr.model_forward(model, tile.contexts)
        final = dfr.run_tile_loop(state, tile.plan, tile.tile.noise_seed, forward, progress)
        return dfr.tile_outputs(final, state)

    def predict_duration(self, pack: Pack, contexts: dict[str, np.ndarray], fps: float,
                         bounds: tuple[float, ...] = ()) -> tuple[float, int]:
        """LTX-2.5's DurationHead on the prompt's connector outputs: (seconds, clip frames 8k + 1); bounds:
        the (min, max) seconds the length is clamped to (`--auto-duration`), else the head's 1-20 s."""
        from ltx_engine.rules.duration import frames_for

        head = self.model(pack, "duration_head")
        seconds = float(np.array(head(mx.array(contexts["video_context"]), mx.array(contexts["audio_context"])))[0])
        return seconds, frames_for(seconds, fps, *bounds)

    def decode_video(self, pack: Pack, latent: np.ndarray) -> np.ndarray:
        pixels = self.model(pack, "vae_decoder")(mx.array(latent))
        frames = mx.clip((pixels[0].astype(mx.float32) + 1.0) / 2.0, 0.0, 1.0)
        return np.array(frames.transpose(1, 2, 3, 0))

    def decode_video_tile(self, pack: Pack, latent: np.ndarray,
                          bounds: tuple[tuple[int, int], tuple[int, int], tuple[int, int]]) -> np.ndarray:
        """Decode latent[..., f0:f1, h0:h1, w0:w1] to raw pixels in [-1, 1]-ish (1, 3, f, h, w).

        Tiles are blended before the [0, 1] mapping, as the reference does. A timestep-conditioned
        decoder gets the slice of the whole latent's key-0 noise, so one whole tile equals decode_video.
        """
        decoder = self.model(pack, "vae_decoder")
        (f0, f1), (h0, h1), (w0, w1) = bounds
        full = mx.array(latent)
        noise = None
        if decoder.timestep_conditioning:
            noise = mx.random.normal(full.shape, key=mx.random.key(0))[:, :, f0:f1, h0:h1, w0:w1]
        pixels = decoder(full[:, :, f0:f1, h0:h1, w0:w1], noise=noise)
        return np.array(pixels.astype(mx.float32))

    def decode_video_diffusion(self, pack: Pack, latent: np.ndarray, noise_seed: int,
                               bounds: tuple[tuple[int, int], ...] | None = None,
                               keyframes: tuple[np.ndarray, tuple[int, ...]] | None = None) -> np.ndarray:
        """LTX-2.5's diffusion decoder (`vae_decoder_av`) on the latent, or on latent[bounds] (one tile of
        it): raw pixels (1, 3, f, h, w), blended (tiles) or mapped to [0, 1] by the caller. Its stage-5
        noise is drawn from `noise_seed` in the tile's own shape, so a tile decodes on any worker alone.
        `keyframes` (planes (1, C, P, h, w) of the whole latent, their global pixel frames): the
        keyframe-aware decode (`models/keyframe_decode.py`), the planes cut to the tile's area."""
        from ltx_engine.models.diffusion_decoder import decode_seeded
        from ltx_engine.models.keyframe_decode import decode_seeded_keyframes

        full, start = mx.array(latent), 0
        planes = None if keyframes is None else mx.array(keyframes[0])
        if bounds is not None:
            (f0, f1), (h0, h1), (w0, w1) = bounds
            full, start = full[:, :, f0:f1, h0:h1, w0:w1], f0 * 8  # a tile's first pixel frame: 8 f0
            planes = None if planes is None else planes[:, :, :, h0:h1, w0:w1]
        model = self.model(pack, "vae_decoder_av")
        if planes is None:
            return np.array(decode_seeded(model, full, noise_seed).astype(mx.float32))
        pixels = decode_seeded_keyframes(model, full, planes, keyframes[1], start, noise_seed)
        return np.array(pixels.astype(mx.float32))
    def rebuild_keyframe(self, pack: Pack, plane: np.ndarray, height: int, width: int) -> np.ndarray:
        """DFR's epilogue: one carried plane (1, C, 1, h, w) decoded as its own one-frame clip, Lanczos x2
        in 8-bit RGB (`ltx_engine.lanczos`, as upstream's PIL stretch) and encoded at height x width."""
        from ltx_engine.lanczos import lanczos_x2, to_uint8

        frame = self.decode_video(pack, plane)[0]
        return self.encode_image(pack, lanczos_x2(to_uint8(frame)), height, width, 0)

    def decode_audio(self, pack: Pack, audio_latent: np.ndarray) -> tuple[np.ndarray, int]:
        from ltx_engine.models.vocoder import decode_audio

        wave, rate = decode_audio(self.model(pack, "audio_vae"), self.model(pack, "vocoder"), mx.array(audio_latent))
        return np.asarray(wave, dtype=np.float32), int(rate)

    def encode_audio(self, pack: Pack, wave: np.ndarray, rate: int, seconds: float, audio_frames: int) -> np.ndarray:
        """(channels, samples) at `rate` → the clip's audio latent (1, z, audio_frames, bins), as upstream's
        A2V: resampled to the VAE's rate, mel, encoder, cut to the clip's latent frames."""
        from ltx_engine.rules.audio_source import encoder_waveform

        encoder = self.registry.get(pack, "audio_encoder")
        cfg = encoder.config
        x = encoder_waveform(wave, rate, int(cfg.sample_rate), int(cfg.in_channels), seconds)
        latent = np.array(encoder.encode_waveform(mx.array(x)).astype(mx.float32))
        if latent.shape[2] < audio_frames:
            raise ValueError(f"audio latent has {latent.shape[2]} frames, the clip needs {audio_frames}")
        return np.ascontiguousarray(latent[:, :, :audio_frames])

    def encode_video_tile(self, pack: Pack, pixels: np.ndarray) -> np.ndarray:
        """One tile of source pixels (1, 3, f, h, w) in [-1, 1] → its normalised latent (1, C, f', h', w')."""
        return np.array(self.model(pack, "vae_encoder")(mx.array(pixels)).astype(mx.float32))

    # Sequence-parallel stage 1: the video tokens split as `exchange` says.
    def denoise_stage1_sp(self, pack: Pack, inputs: StageInputs, exchange, progress: Progress | None = None,
                          resume=None, on_step=None) -> dict:
        """`denoise_stage1` with a sequence-parallel forward (`ltx_engine.parallel.sp_denoise`): k shards in this
        process (`LocalExchange`) or this rank's over a group (`GroupExchange`); same outputs."""
        from ltx_engine.parallel import sp_denoise

        return sp_denoise.denoise_stage1(self.model(pack, "transformer"), inputs, self._latent_channels(pack),
                                         exchange, progress, resume, on_step)
