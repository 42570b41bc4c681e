"""An official single-file checkpoint (reference modules at tiny sizes, seeded, under the official
prefixes, config in the safetensors metadata) opens with `open_pack`, builds every model through the
registry, and each model matches its reference module; broken checkpoints name the key and the file."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")  # the reference (the parity extra): tests/needs.py's CI rule
pytest.importorskip("ltx_core")

save_file = pytest.importorskip("safetensors.torch").save_file

import mlx.core as mx  # noqa: E402
from ltx_core.model.transformer.model_configurator import LTXModelConfigurator  # noqa: E402
from ltx_core.model.upsampler import LatentUpsamplerConfigurator  # noqa: E402
from ltx_core.model.video_vae.model_configurator import (  # noqa: E402
    VideoDecoderConfigurator,
    VideoEncoderConfigurator,
)
from ltx_core.text_encoders.gemma.embeddings_connector import (  # noqa: E402
    AudioEmbeddings1DConnectorConfigurator,
    Embeddings1DConnectorConfigurator,
)
from ltx_core.text_encoders.gemma.embeddings_processor import EmbeddingsProcessor  # noqa: E402
from ltx_core.text_encoders.gemma.feature_extractor import FeatureExtractorV2  # noqa: E402

from ltx_engine.loading.checkpoint import GEMMA_ENV, CheckpointPack  # noqa: E402
from ltx_engine.loading.loader import PackError  # noqa: E402
from ltx_engine.loading.pack import open_pack  # noqa: E402
from ltx_engine.loading.registry import ModelRegistry  # noqa: E402
from ltx_engine.models.upsampler import tiny_spatial_config, tiny_temporal_config  # noqa: E402
from ltx_engine.tiny.tiny_pack import tiny_embedded_config  # noqa: E402

# The audio parity module installs the torchaudio stand-in ltx_core's audio imports need.
from tests.parity import test_audio as audio_parity  # noqa: E402
from tests.parity import test_text as text_parity  # noqa: E402
from tests.parity import test_transformer as dit_parity  # noqa: E402
from tests.parity import test_upsampler as up_parity  # noqa: E402
from tests.parity import test_video_vae as vae_parity  # noqa: E402
from tests.parity.upstream_rules import follow_ltx_core_1_2_0  # noqa: E402

TOL = 1e-4
NAME = "ltx-2.3-tiny-distilled.safetensors"
SPATIAL, TEMPORAL = "ltx-2.3-spatial-upscaler-x2-1.1.safetensors", "ltx-2.3-temporal-upscaler-x2-1.0.safetensors"
OTHER_FAMILY_SPATIAL = "ltx-2-spatial-upscaler-x2-1.0.safetensors"  # must not be picked for a 2.3 checkpoint


def _config() -> dict:
    """The tiny pack's embedded config; the audio VAE at a size whose statistics the reference sizes
    by `ch` (ch == z_channels * latent mel bins, as in every released config)."""
    cfg = tiny_embedded_config("2.3")
    cfg["audio_vae"] = audio_parity._audio_cfg(ch=16, z_channels=2, mel_bins=32)["audio_vae"]
    return cfg


def _connector_reference(cfg: dict, seed: int) -> EmbeddingsProcessor:
    """test_text's reference EmbeddingsProcessor, sized from the checkpoint config."""
    t = cfg["transformer"]
    flat = t["text_encoder_hidden_size"] * (t["text_encoder_num_hidden_layers"] + 1)
    extractor = FeatureExtractorV2(
        video_aggregate_embed=torch.nn.Linear(flat, t["num_attention_heads"] * t["attention_head_dim"]),
        embedding_dim=t["text_encoder_hidden_size"],
        audio_aggregate_embed=torch.nn.Linear(flat, t["audio_num_attention_heads"] * t["audio_attention_head_dim"]),
    )
    ref = EmbeddingsProcessor(
        feature_extractor=extractor,
        video_connector=Embeddings1DConnectorConfigurator.from_config(cfg),
        audio_connector=AudioEmbeddings1DConnectorConfigurator.from_config(cfg),
    ).float()
    text_parity._randomize(ref, seed)
    return ref.eval()


def _prefixed(module: torch.nn.Module, prefix: str, stats: str | None = None, skip_stats: bool = False) -> dict:
    """A module's state dict under an official prefix; its per-channel statistics under `stats`."""
    out = {}
    for key, value in module.state_dict().items():
        if key.startswith("per_channel_statistics."):
            if not skip_stats:
                out[stats + key.removeprefix("per_channel_statistics.")] = value
        else:
            out[prefix + key] = value
    return out


def _references(cfg: dict) -> dict[str, torch.nn.Module]:
    """Every reference module at the config's sizes, seeded as its own parity test seeds it."""
    # ltx_core's audio modules import only after test_audio's torchaudio stand-in (imported above).
    from ltx_core.model.audio_vae.model_configurator import (
        AudioDecoderConfigurator,
        AudioEncoderConfigurator,
        VocoderConfigurator,
    )

    refs = {"transformer": follow_ltx_core_1_2_0(LTXModelConfigurator.from_config(cfg).float().eval())}
    dit_parity._randomize(refs["transformer"], 1)
    refs["connector"] = _connector_reference(cfg, seed=1)
    refs["vae_decoder"] = VideoDecoderConfigurator.from_config(cfg).eval()
    vae_parity._randomize(refs["vae_decoder"], 0)
    refs["vae_encoder"] = VideoEncoderConfigurator.from_config(cfg).eval()
    vae_parity._randomize(refs["vae_encoder"], 1)
    refs["audio_vae"] = AudioDecoderConfigurator.from_config(cfg).float().eval()
    audio_parity._randomize(refs["audio_vae"], 0)
    refs["audio_encoder"] = AudioEncoderConfigurator.from_config(cfg).float().eval()
    audio_parity._randomize(refs["audio_encoder"], 2)
    refs["vocoder"] = VocoderConfigurator.from_config(cfg).float().eval()
    audio_parity._randomize(refs["vocoder"], 5, scale=0.1)
    with torch.no_grad():  # one set of statistics per VAE in the file, shared by decoder and encoder
        refs["audio_vae"].per_channel_statistics.get_buffer("std-of-means").abs_().add_(0.5)
        for name in ("mean-of-means", "std-of-means"):
            refs["vae_encoder"].per_channel_statistics.get_buffer(name).copy_(
                refs["vae_decoder"].per_channel_statistics.get_buffer(name))
    for kind, up_cfg, seed in (("spatial_upscaler", tiny_spatial_config(), 0), ("temporal_upscaler",
                                                                               tiny_temporal_config(), 1)):
        refs[kind] = LatentUpsamplerConfigurator.from_config(up_cfg["config"]).float().eval()
        up_parity._randomize(refs[kind], seed)
    return refs


def _checkpoint_tensors(refs: dict[str, torch.nn.Module]) -> dict[str, torch.Tensor]:
    """The official single file's keys: transformer and connectors under `model.diffusion_model.`,
    the feature extractor under `text_embedding_projection.`, one `vae.per_channel_statistics.`."""
    sd = {f"model.diffusion_model.{k}": v for k, v in refs["transformer"].state_dict().items()}
    sd.update(text_parity._checkpoint_keys(refs["connector"]))
    sd.update(_prefixed(refs["vae_decoder"], "vae.decoder.", "vae.per_channel_statistics."))
    sd.update(_prefixed(refs["vae_encoder"], "vae.encoder.", skip_stats=True))
    sd.update(_prefixed(refs["audio_vae"], "audio_vae.decoder.", "audio_vae.per_channel_statistics."))
    sd.update(_prefixed(refs["audio_encoder"], "audio_vae.encoder.", skip_stats=True))
    sd.update({f"vocoder.{k}": v for k, v in refs["vocoder"].state_dict().items()})
    as_torch = lambda v: v.detach().float() if isinstance(v, torch.Tensor) else torch.from_numpy(np.array(v))  # noqa: E731
    return {k: as_torch(v).contiguous() for k, v in sd.items()}


def _save(path: Path, tensors: dict, config: dict) -> Path:
    save_file(tensors, str(path), metadata={"config": json.dumps(config)})
    return path


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory):
    """(folder, config, reference modules, checkpoint tensors) with the upsampler files beside it."""
    folder = tmp_path_factory.mktemp("official")
    cfg = _config()
    refs = _references(cfg)
    tensors = _checkpoint_tensors(refs)
    _save(folder / NAME, tensors, cfg)
    for kind, name in (("spatial_upscaler", SPATIAL), ("temporal_upscaler", TEMPORAL)):
        up_cfg = (tiny_spatial_config() if kind == "spatial_upscaler" else tiny_temporal_config())["config"]
        _save(folder / name, {k: v.contiguous() for k, v in refs[kind].state_dict().items()}, up_cfg)
    other = LatentUpsamplerConfigurator.from_config(tiny_spatial_config()["config"]).float()
    up_parity._randomize(other, 9)
    _save(folder / OTHER_FAMILY_SPATIAL, {k: v.contiguous() for k, v in other.state_dict().items()},
          tiny_spatial_config()["config"])
    return folder, cfg, refs, tensors


def _rel(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-12))


def _torch(x: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(x))


def _check_transformer(ref, ours, cfg: dict) -> list[float]:
    t, rng = cfg["transformer"], np.random.default_rng(0)
    video = dit_parity._video_inputs(rng, t["cross_attention_dim"])
    audio = dit_parity._audio_inputs(rng, t["audio_cross_attention_dim"])
    return dit_parity._compare(ref, ours, video, audio)


def _check_connector(ref, ours, cfg: dict) -> list[float]:
    t, rng, seq, valid = cfg["transformer"], np.random.default_rng(2), text_parity.SEQ, text_parity.VALID
    states = [rng.standard_normal((1, seq, t["text_encoder_hidden_size"])).astype(np.float32) * (i + 1)
              for i in range(t["text_encoder_num_hidden_layers"] + 1)]
    mask = np.zeros((1, seq), np.int64)
    mask[:, seq - valid:] = 1  # left padding, as the reference tokenizer
    with torch.no_grad():
        want = ref.process_hidden_states(tuple(_torch(s) for s in states), _torch(mask), "left")
    video, audio, _ = ours([mx.array(s) for s in states], mx.array(mask.astype(np.int32)))
    return [_rel(video, want.video_encoding.numpy()), _rel(audio, want.audio_encoding.numpy())]


def _check_vae_decoder(ref, ours, cfg: dict) -> list[float]:
    z = np.random.default_rng(2).standard_normal((1, 128, 3, 2, 3)).astype(np.float32)
    with torch.no_grad():
        want = ref(_torch(z)).numpy()
    return [_rel(ours(mx.array(z)), want)]


def _check_vae_encoder(ref, ours, cfg: dict) -> list[float]:
    x = np.tanh(np.random.default_rng(6).standard_normal((1, 3, 17, 64, 96))).astype(np.float32)
    with torch.no_grad():
        want = ref(_torch(x)).numpy()
    return [_rel(ours(mx.array(x)), want)]


def _check_audio_vae(ref, ours, cfg: dict) -> list[float]:
    z = ours.config.z_channels
    x = torch.randn(1, z, 7, ours.config.stats_channels // z, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = ref(x).numpy()
    return [_rel(ours(mx.array(x.numpy())), want)]


def _check_vocoder(ref, ours, cfg: dict) -> list[float]:
    mel = torch.randn(1, 2, 9, 64, generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        want = ref(mel).numpy()
    return [_rel(ours(mx.array(mel.numpy())), want)]


def _check_upsampler(ref, ours, cfg: dict) -> list[float]:
    x = torch.randn(1, 128, 3, 4, 5, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        want = ref(x).numpy()
    return [_rel(ours(mx.array(x.numpy())), want)]


CHECKS = {
    "transformer": _check_transformer,
    "connector": _check_connector,
    "vae_decoder": _check_vae_decoder,
    "vae_encoder": _check_vae_encoder,
    "audio_vae": _check_audio_vae,
    "vocoder": _check_vocoder,
    "spatial_upscaler": _check_upsampler,
    "temporal_upscaler": _check_upsampler,
}


@pytest.mark.parametrize("component", list(CHECKS))
def test_component_matches_reference(checkpoint, component: str) -> None:
    folder, cfg, refs, _ = checkpoint
    pack = open_pack(folder / NAME)
    assert isinstance(pack, CheckpointPack) and pack.config == cfg and pack.has(component)
    errs = CHECKS[component](refs[component], ModelRegistry().get(pack, component), cfg)
    print(component, [f"{e:.2e}" for e in errs])
    assert errs and max(errs) <= TOL, errs


def test_upsamplers_found_next_to_checkpoint(checkpoint) -> None:
    folder = checkpoint[0]
    pack = open_pack(folder / NAME)
    assert pack.file_label("spatial_upscaler") == str(folder / SPATIAL)  # same family, not ltx-2's
    assert pack.component_config("temporal_upscaler") == tiny_temporal_config()["config"]
    explicit = CheckpointPack(folder / NAME, upsamplers={"spatial_upscaler": folder / OTHER_FAMILY_SPATIAL})
    assert explicit.file_label("spatial_upscaler") == str(folder / OTHER_FAMILY_SPATIAL) and explicit.key != pack.key
    assert not pack.has("transformer_dev")


def test_runner_serves_the_checkpoint(checkpoint) -> None:
    from worker.runner import Runner

    runner = Runner(checkpoint[0])
    assert runner.pack_names() == [NAME]  # upsampler files are not packs
    assert isinstance(runner.pack(NAME), CheckpointPack)
    assert runner.pack_features(NAME) == ["temporal_upscaler"]


def test_text_encoder_dir_from_argument_or_env(checkpoint, tmp_path, monkeypatch) -> None:
    from ltx_engine.models.text_encoder import TextEncoder, write_tiny_text_encoder

    folder, cfg = checkpoint[0], checkpoint[1]
    gemma = write_tiny_text_encoder(tmp_path / "gemma", seed=0)
    monkeypatch.delenv(GEMMA_ENV, raising=False)
    with pytest.raises(PackError, match=GEMMA_ENV):
        _ = open_pack(folder / NAME).text_encoder_dir
    assert CheckpointPack(folder / NAME, text_encoder_dir=gemma).text_encoder_dir == gemma
    monkeypatch.setenv(GEMMA_ENV, str(gemma))
    encoder = ModelRegistry().get(open_pack(folder / NAME), "text_encoder")
    assert isinstance(encoder, TextEncoder)
    assert encoder.model.args.hidden_size == cfg["transformer"]["text_encoder_hidden_size"]


def test_checkpoint_text_encoder_follows_the_one_rule(checkpoint, tmp_path, monkeypatch) -> None:
    """LTX_GEMMA_DIR is the checkpoint's own tower (it wins); without it the render's named encoder, or
    the MLX default with its fetch command when this machine lacks it."""
    from ltx_engine.models.text_encoder import write_tiny_text_encoder
    from worker.runner import Runner

    gemma = write_tiny_text_encoder(tmp_path / "gemma", seed=0)
    monkeypatch.delenv(GEMMA_ENV, raising=False)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    runner = Runner(checkpoint[0])
    pack = runner.pack(NAME)
    with pytest.raises(PackError, match="fetch it with `farm pack pull mlx-community/gemma-3-12b-it-4bit`"):
        runner.text_encoder_dir(pack, {"pack": NAME})
    assert runner.text_encoder_dir(pack, {"pack": NAME, "text_encoder": str(gemma)}) == gemma
    monkeypatch.setenv(GEMMA_ENV, str(gemma))
    assert runner.text_encoder_dir(pack, {"pack": NAME}) == gemma
    assert runner.text_encoder_dir(pack, {"pack": NAME, "text_encoder": "pack"}) == gemma


def test_missing_tensor_names_key_and_file(checkpoint, tmp_path) -> None:
    _, cfg, _, tensors = checkpoint
    broken = {k: v for k, v in tensors.items() if k != "vae.decoder.conv_in.conv.weight"}
    path = _save(tmp_path / "broken.safetensors", broken, cfg)
    with pytest.raises(PackError, match=r"broken\.safetensors \[vae\.decoder\.\*.*missing tensor 'conv_in\.conv\.weight'"):
        ModelRegistry().get(open_pack(path), "vae_decoder")


def test_missing_component_or_config_is_refused(checkpoint, tmp_path) -> None:
    _, cfg, _, tensors = checkpoint
    no_vocoder = {k: v for k, v in tensors.items() if not k.startswith("vocoder.")}
    with pytest.raises(PackError, match=r"no_vocoder\.safetensors: no vocoder tensors \(vocoder\.\*\)"):
        open_pack(_save(tmp_path / "no_vocoder.safetensors", no_vocoder, cfg))
    save_file(copy.copy(tensors), str(tmp_path / "bare.safetensors"))
    with pytest.raises(PackError, match=r"bare\.safetensors: no 'config' in the safetensors metadata"):
        _ = open_pack(tmp_path / "bare.safetensors").config
