"""What the DiT reads from a stage's states: per-token timesteps, and sigma 0 for a frozen stream."""

import numpy as np

from ltx_engine.denoise import StageInputs, build_stage_states, state_modality


def test_stage2_frozen_audio_reads_sigma_zero_and_video_its_own_timesteps() -> None:
    """Stage 2 freezes the stage-1 audio (denoise mask 0). As upstream forces for frozen states, its
    Modality sigma is 0 (prompt AdaLN, the video's a2v gate) while the video keeps the step's sigma and
    per-token timesteps (0 on the conditioned first frame), which the cross-attention scale/shift read."""
    inputs = StageInputs(frames=9, height=64, width=96, fps=24.0, seed=3, sigmas=[0.909375, 0.725, 0.0],
                         contexts={}, audio_frames=5, initial_video=np.ones((1, 8, 2, 2, 3), np.float32),
                         initial_audio=np.ones((1, 8, 5, 16), np.float32),
                         image_latent=np.zeros((1, 8, 1, 2, 3), np.float32))
    video, audio = build_stage_states(inputs, latent_channels=8)
    ctx = np.zeros((1, 4, 16), np.float32)
    v = state_modality(video, 0.725, ctx, None)
    a = state_modality(audio, 0.725, ctx, None)
    assert np.array(a.sigma).tolist() == [0.0] and not np.array(a.timesteps).any()
    assert np.array(v.sigma).tolist() == [np.float32(0.725)]
    ts = np.array(v.timesteps)
    assert ts.shape == (1, 12) and (ts[0, :6] == 0).all() and np.allclose(ts[0, 6:], 0.725)
