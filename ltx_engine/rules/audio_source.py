"""A user's audio track as the audio VAE encoder takes it, and as the output muxes it back.

`decode_window` follows upstream's `decode_audio_from_file` (ltx_pipelines `media_io`): seek to the
start, keep the decoded frames that overlap [start, start + seconds], then cut the samples before the
start and past the window; integer sample formats scale to [-1, 1], interleaved ones become
(channels, samples). The window is decoded at the file's own rate: that waveform is what A2V's
output carries (upstream returns the source audio, not the VAE's). `encoder_waveform` is the
encoder's view of it: resampled to the VAE's rate (`audio_resample`, torchaudio's kernel), mono
repeated to the encoder's channels, and zero-padded to the clip when the track ends first (the farm's
rule: upstream would hand a shorter latent to a longer clip). The file was probed on the coordinator
before any task (coordinator/admit/media_probe.py); this decodes only what the window needs.
"""

from __future__ import annotations

import io

import numpy as np

from ltx_engine.rules.audio_resample import resample

_INT_MAX = {
    "u8": 128.0,
    "u8p": 128.0,
    "s16": 32768.0,
    "s16p": 32768.0,
    "s32": 2147483648.0,
    "s32p": 2147483648.0,
}


def _frame_to_float(frame) -> np.ndarray:
    """An av.AudioFrame as float32 (channels, samples) in [-1, 1]."""
    fmt = frame.format.name
    arr = frame.to_ndarray().astype(np.float32)
    if fmt in _INT_MAX:
        arr = arr / _INT_MAX[fmt]  # as upstream (u8 is not re-centred there either)
    if not frame.format.is_planar:
        arr = arr.reshape(-1, len(frame.layout.channels)).T
    return arr


def decode_window(data: bytes | np.ndarray, start: float, seconds: float) -> tuple[np.ndarray, int]:
    """The file's audio from `start` for at most `seconds`: (channels, samples) float32 and its rate."""
    import av

    raw = data.tobytes() if isinstance(data, np.ndarray) else bytes(data)
    with av.open(io.BytesIO(raw)) as container:
        stream = container.streams.audio[0]
        rate, end = int(stream.rate), start + seconds
        container.seek(int(start / stream.time_base), stream=stream)
        chunks, first = [], None
        for frame in container.decode(audio=0):
            if frame.pts is None:
                continue
            at = float(frame.pts * stream.time_base)
            if at + frame.samples / frame.sample_rate < start:
                continue
            if at > end:
                break
            first = at if first is None else first
            chunks.append(_frame_to_float(frame))
    if not chunks:
        raise ValueError(f"no audio decoded from {start:g} s")
    wave = np.concatenate(chunks, axis=-1)
    skip = round((start - first) * rate)
    if skip > 0:
        wave = wave[:, skip:]
    return np.ascontiguousarray(wave[:, : round(seconds * rate)], dtype=np.float32), rate


def encoder_waveform(
    wave: np.ndarray, rate: int, target_rate: int, channels: int, seconds: float
) -> np.ndarray:
    """(1, channels, ceil(seconds * target_rate)) float32: resampled, channels matched, padded or cut."""
    out = resample(wave, rate, target_rate)
    if out.shape[0] < channels:
        out = (
            np.repeat(out[:1], channels, axis=0)
            if out.shape[0] == 1
            else np.pad(out, ((0, channels - out.shape[0]), (0, 0)))
        )
    out = out[:channels]
    want = int(np.ceil(seconds * target_rate))
    out = out[:, :want] if out.shape[1] >= want else np.pad(out, ((0, 0), (0, want - out.shape[1])))
    return np.ascontiguousarray(out[None], dtype=np.float32)


def fit_audio_tokens(latent: np.ndarray, frames: int) -> np.ndarray:
    """An audio latent (1, z, t, bins) right-padded with zero tokens to `frames` (never cut): a track
    encoded over the clip held on DFR's longer padded canvas, as the MLX port's `fit_audio_tokens`."""
    missing = int(frames) - latent.shape[2]
    if missing <= 0:
        return latent
    pad = np.zeros((*latent.shape[:2], missing, *latent.shape[3:]), dtype=latent.dtype)
    return np.ascontiguousarray(np.concatenate([latent, pad], axis=2))
