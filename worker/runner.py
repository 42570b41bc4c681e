"""The runner: from a task kind and its inputs to an `ltx_engine` call, with time and memory metrics.

The same Runner serves a farm worker and `farm render --local`, so both compute exactly the same
arrays from the same inputs.
"""

from __future__ import annotations

import platform
import time
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path

import mlx.core as mx
import numpy as np

from ltx_engine.denoise import StageInputs
from ltx_engine.engine import Engine
from ltx_engine.loading.checkpoint import is_checkpoint
from ltx_engine.loading.loader import PackError
from ltx_engine.loading.pack import WeightPack, hf_snapshot, open_pack
from ltx_engine.loading.registry import ModelRegistry
from ltx_engine.lora.lora import WithLoras, reference_downscale
from ltx_engine.media_stage import stage_fields
from ltx_engine.relay import contexts_of, without_contexts
from ltx_engine.rules import text_encoders
from ltx_engine.rules.components import PARTS, TEXT_ENCODER
from ltx_engine.rules.dfr_epilogue import task_keyframes
from ltx_engine.rules.generation import stage2_sampler
from ltx_engine.rules.prompt_relay import RELAY, combined_prompt
from ltx_engine.rules.sampling import ANCESTRAL_NOISE_SEED_OFFSET, ANCESTRAL_STAGE2_NOISE_SEED_OFFSET, EULER
from protos.kinds import WORKER_KINDS, facts
from protos.tensors import prompt_bytes, prompt_text
from worker import media
from worker.hdr import hdr_stage
from worker.identity import identity
from worker.images import dfr_images, image_crf, stage_images, stage_slots
from worker.loras import LoraSets
from worker.memory import device_memory_bytes, model_budget_bytes, streams
from worker.sp_stage import run_stage1, split_of

Progress = Callable[[int, int], None]
EMBEDDINGS_KEPT = 32


class TaskCancelled(RuntimeError):
    """The render was cancelled while the task ran."""


def _problem(pack: WeightPack, component: str) -> str | None:
    problem = getattr(pack, "problem", None)  # a single-file checkpoint has no per-file problems
    return problem(component) if problem is not None else None


def _forward_params(params: dict) -> dict:
    """A stage's sparse taus (one per step; stage 2 only) and compute dtype, when the plan set them."""
    taus = params.get("sparse_attention")
    return {"sparse_taus": tuple(float(t) for t in taus) if taus else None, "compute_dtype": params.get("compute_dtype"),
            "step_cache": params.get("step_cache")}


def _tile_options(params: dict):
    """A tiled stage-2 forward's options: its step's tau and the compute dtype."""
    from ltx_engine.models.forward_options import ForwardOptions

    tau = params.get("sparse_tau")
    return ForwardOptions(None if tau is None else float(tau), params.get("compute_dtype"))


class Runner:
    """Runs one task at a time on this process's engine."""
    sp_group = sp_on_step = None  # a gang rank's group and step hook, for one task (worker/gang.py `rank_of`)

    def __init__(self, packs_dir: Path | None = None, engine: Engine | None = None, throttle: float = 1.0):
        self.packs_dir = Path(packs_dir) if packs_dir else None
        self.throttle = max(1.0, float(throttle))  # `--throttle`: each task takes this many times its compute
        # Keep models warm between tasks, but within the model budget: the least recently used models the
        # next task does not need are dropped first.
        self.engine = engine or Engine(ModelRegistry(budget_bytes=model_budget_bytes()))
        self._packs: dict[str, WeightPack] = {}
        self._embeddings: OrderedDict[tuple, dict[str, np.ndarray]] = OrderedDict()  # recent prompts
        self.loras = LoraSets(self.packs_dir / ".farm-loras" if self.packs_dir else None)  # user LoRAs (#22)

    def _local(self, ref: str) -> Path | None:
        """Where `ref` lives in the packs folder: a folder or file by name, or a repo id's HF cache folder."""
        if not self.packs_dir:
            return None
        for path in (self.packs_dir / ref, self.packs_dir / f"models--{ref.replace('/', '--')}"):
            if path.exists():
                return path
        return None

    def pack(self, ref: str) -> WeightPack:
        """A pack folder, official checkpoint file or HF cache repo in the packs folder, else `ref`
        itself (a path or a Hugging Face repo id)."""
        if ref not in self._packs:
            self._packs[ref] = open_pack(self._local(ref) or ref)
        return self._packs[ref]

    def pack_names(self) -> list[str]:
        """Pack folders, single-file checkpoints (not their upsampler files) and HF cache repos
        (`models--owner--name`, named `owner/name`) in the packs folder."""
        if not self.packs_dir or not self.packs_dir.is_dir():
            return []
        names = []
        for p in self.packs_dir.iterdir():
            snapshot = hf_snapshot(p) if p.is_dir() else None
            if snapshot is not None and (snapshot / "embedded_config.json").is_file():
                names.append(p.name.removeprefix("models--").replace("--", "/", 1))
            elif (p / "embedded_config.json").is_file() or is_checkpoint(p):
                names.append(p.name)
        return sorted(names)

    def pack_holdings(self) -> tuple[dict[str, list[str]], dict[str, dict[str, str]]]:
        """Per pack, the components it serves, and the one-line problem of each it has files for but
        cannot serve (a pack that does not open at all: its line under "pack"), so the planner and the
        scheduler match renders and tasks to what each worker really holds."""
        holdings, problems = {}, {}
        for name in self.pack_names():
            try:
                pack = self.pack(name)
                holdings[name] = pack.components()
                found = {c: line for c in PARTS if (line := _problem(pack, c))}
            except Exception as exc:  # noqa: BLE001 - a broken pack is reported, the others still serve
                holdings[name], found = [], {"pack": str(exc).splitlines()[0] if str(exc) else type(exc).__name__}
            if found:
                problems[name] = found
        return holdings, problems

    def text_encoder_dir(self, pack: WeightPack, params: dict) -> Path:
        """The Gemma folder a text task encodes with: the pack's own tower when the spec chose it (or
        chose nothing and the pack has one), else the named encoder as this machine holds it; one line
        with the command that fetches it when it is not here (nothing is downloaded in a task)."""
        ref = params.get("text_encoder")
        if ref == text_encoders.PACK or (ref is None and TEXT_ENCODER in pack.components()):
            if TEXT_ENCODER not in pack.components():
                raise PackError(pack.missing(TEXT_ENCODER))
            return pack.text_encoder_dir
        ref = ref or text_encoders.DEFAULT
        folder = text_encoders.find_local(ref, self.packs_dir)
        if folder is None:
            raise PackError(text_encoders.refusal(ref, str(params["pack"]), "this machine does not hold"))
        return folder

    def pack_bytes(self, ref: str) -> int:
        """The pack's weight bytes (its safetensors files, HF cache links followed): the cost model
        scales its predicted peaks by them, so a reduced pack is not placed like a full-size one."""
        path = self._local(ref)
        if path is None:
            return 0
        if path.is_file():
            return path.stat().st_size
        return sum(f.stat().st_size for f in path.rglob("*.safetensors") if f.is_file())

    def pack_features(self, ref: str) -> list[str]:
        """What a pack can do beyond the base two-stage render, so the planner can refuse early:
        `temporal_upscaler` (DFR rounds) and `keyframes` (an LTX-2.5 DiT with the keyframe marker)."""
        try:
            pack = self.pack(ref)
            features = ["temporal_upscaler"] if pack.has("temporal_upscaler") else []
            if pack.config.get("transformer", {}).get("use_keyframes_abs_pos_embedding"):
                features.append("keyframes")
            return features
        except Exception:  # noqa: BLE001 - a broken pack reports nothing; its tasks fail with the reason
            return []

    def pack_generation(self, ref: str) -> str | None:
        """The pack's LTX generation (`ltx_engine.rules.generation`), which the planner records in each render."""
        try:
            return self.pack(ref).generation
        except Exception:  # noqa: BLE001 - a broken pack reports nothing; its tasks fail with the reason
            return None

    def capabilities(self) -> dict:
        holdings, problems = self.pack_holdings()
        return {
            "os": f"{platform.system()} {platform.release()}",
            "memory_bytes": device_memory_bytes(), "mlx_device": str(mx.default_device()),
            **identity(),  # version, backend, chip, installed set, determinism fingerprint
            "packs": self.pack_names(),
            "pack_features": {name: self.pack_features(name) for name in self.pack_names()},
            "pack_generation": {name: g for name in self.pack_names() if (g := self.pack_generation(name))},
            "pack_components": holdings,
            "pack_bytes": {name: self.pack_bytes(name) for name in self.pack_names()},
            "pack_problems": problems,
            "text_encoders": text_encoders.held(self.packs_dir),
            "kinds": sorted(k.value for k in WORKER_KINDS),
        }

    def run(self, kind: str, params: dict, inputs: dict[str, np.ndarray], progress: Progress | None = None,
            cancelled: Callable[[], bool] | None = None) -> tuple[dict[str, np.ndarray], dict]:
        """Outputs of the task and its metrics (seconds, peak memory, models loaded)."""
        kind_facts = facts(kind)
        handler = getattr(self, f"_run_{kind_facts.operation}", None) if kind_facts.operation else None
        if handler is None:
            raise ValueError(f"unknown task kind {kind!r}")
        pack = self.pack(params["pack"])
        self.engine.stream_blocks = streams(kind, params, device_memory_bytes())
        encodes_text = TEXT_ENCODER in kind_facts.components
        if kind_facts.runs_dit:  # the render's LoRA set, fused or adapted, warm under its own key (worker/loras.py)
            pack = self.loras.view(pack, params)
        elif encodes_text:  # a set with connector factors: fused into the connector that encodes
            pack = self.loras.connector_view(pack, params)
        self.engine.prepare(pack, kind_facts.components, self.text_encoder_dir(pack, params) if encodes_text else None)
        fusions = self.loras.fusions[0]
        if not params.get("detailing_lora"):  # with one, `_detailing` attaches to the detailed DiT instead
            self.loras.attach(self.engine.model, pack, kind_facts.components)
        self.engine.cache_skips()  # a failed task's step caches are not this one's
        mx.reset_peak_memory()
        start, cpu = time.perf_counter(), time.process_time()  # cpu: the whole process's, helper threads too
        loads = self.engine.registry.load_seconds
        last = [start, loads]  # the last step's time and load seconds: loading is not throttled

        def step(i: int, n: int) -> None:
            self._throttle(last)
            if cancelled is not None and cancelled():
                raise TaskCancelled(f"render cancelled at step {i} of {n}")
            if progress is not None:
                progress(i, n)

        outputs = handler(pack, params, inputs, step)
        self._throttle(last)
        metrics = {"seconds": round(time.perf_counter() - start, 4), "cpu_s": round(time.process_time() - cpu, 4),
                   "peak_memory_bytes": int(mx.get_peak_memory()),
                   "models": self.engine.registry.loaded(),  # warm after this task: the scheduler's affinity
                   "load_s": round(self.engine.registry.load_seconds - loads, 4)}  # the cost model's cold start
        if self.engine.stream_blocks:
            metrics["streamed"] = True
        if (skipped := self.engine.cache_skips()) is not None:  # forwards the step cache skipped
            metrics["step_cache_skipped"] = skipped
        if params.get("loras"):  # LoRA sets fused (or adapters attached) by this task, and the sets kept warm
            metrics["lora_fusions"] = self.loras.fusions[0] - fusions
            metrics["models"] = metrics["models"] + self.loras.warm_names(self.engine.registry.has)
        return {k: np.ascontiguousarray(v) for k, v in outputs.items()}, metrics

    def _throttle(self, last: list[float]) -> None:
        """Sleep (throttle - 1) × the compute since the last step (model loading left out), so progress and
        the task's time both stretch by the factor (a Mac shared with people; a slower Mac played by a fast one)."""
        loads = self.engine.registry.load_seconds
        if self.throttle > 1.0:
            time.sleep((self.throttle - 1.0) * max(0.0, time.perf_counter() - last[0] - (loads - last[1])))
        last[0], last[1] = time.perf_counter(), loads

    def _run_text_encode(self, pack, params, inputs, step):
        """Embeddings of the prompt (the enhancer's, when the render has one), kept for the last few (pack,
        encoder, prompt, length) keys: a prompt sweep encodes each prompt once per worker, and another
        encoder never reuses them."""
        from ltx_engine.models.text_encoder import REFERENCE_MAX_LENGTH

        folder = self.text_encoder_dir(pack, params)
        prompt = prompt_text(inputs["prompt"]) if "prompt" in inputs else params["prompt"]
        relay = params.get(RELAY)  # Prompt Relay: the prompt and its segments' texts encoded as one
        encoded = prompt if relay is None else combined_prompt(prompt, [str(s[0]) for s in relay["segments"]])
        key = (pack.key, str(folder.resolve()), encoded, REFERENCE_MAX_LENGTH)
        if key not in self._embeddings:
            self._embeddings[key] = self.engine.encode_prompt(pack, encoded, folder)
            while len(self._embeddings) > EMBEDDINGS_KEPT:
                self._embeddings.popitem(last=False)
        self._embeddings.move_to_end(key)
        if relay is None:
            return self._embeddings[key]
        return {**self._embeddings[key], RELAY: self.engine.relay_table(pack, prompt, relay, folder)}

    def _run_enhance_prompt(self, pack, params, inputs, step):
        """The prompt rewritten by the encoder's Gemma 3 (`--enhance-prompt`), as UTF-8 bytes; an encoder
        that cannot write fails the render at once, in one line with the download."""
        folder = self.text_encoder_dir(pack, params)
        if (why := text_encoders.lm_head_problem(folder)) is not None:
            raise PackError(text_encoders.no_head_line(str(params["pack"]), why, text_encoders.is_gemma4_tower(folder)))
        text = self.engine.enhance_prompt(pack, params["prompt"], params["mode"], int(params["max_new_tokens"]), folder)
        return {"prompt": prompt_bytes(text)}

    def _run_image_encode(self, pack, params, inputs, step):
        """One image at one stage's size, after its H.264 round trip at the planned CRF (worker/images.py)."""
        crf = image_crf(params, pack.generation)
        return {"latent": self.engine.encode_image(pack, inputs["image"], params["height"], params["width"], crf)}

    def _stage(self, pack, params, inputs) -> StageInputs:
        audio_cfg = pack.config.get("audio_vae", {})
        return StageInputs(
            frames=params["frames"], height=params["height"], width=params["width"], fps=params["fps"],
            seed=params["seed"], sigmas=[float(s) for s in params["sigmas"]], contexts=contexts_of(inputs),
            audio_channels=int(audio_cfg.get("z_channels", 8)), mel_bins=int(audio_cfg.get("latent_mel_bins", 16)),
            audio_frames=int(params["audio_frames"]),
            initial_video=inputs.get("latent"), initial_audio=inputs.get("audio_latent"),
            image_latent=inputs.get("image_latent"), image_frame=int(params.get("image_frame", 0)),
            image_strength=float(params.get("image_strength", 1.0)), noise_stream=int(params.get("noise_stream", 0)),
            sampler=params.get("sampler") or EULER, slots=stage_slots(params),
            ancestral_offset=int(params.get("ancestral_offset", ANCESTRAL_NOISE_SEED_OFFSET)),
            slot_latent=inputs.get("slots"), renoise_audio=bool(params.get("renoise_audio")),
            reference_latent=inputs.get("reference_latent"), reference_downscale=int(params.get("reference_downscale", 1)),
            **_forward_params(params), images=stage_images(params, inputs),
            **stage_fields(params, inputs),  # retake / extend / IC-LoRA control / Dub-It (media_stage)
        )

    def _run_denoise_stage1(self, pack, params, inputs, step):
        """Stage 1: plain, k-way split, a gang's rank or resumed (worker/sp_stage.py)."""
        return run_stage1(self, pack, params, inputs, step, self.sp_group, self.sp_on_step)

    def _detailing(self, pack, params):
        """DFR's detailing IC-LoRA: the pack seen with it fused into a DiT of its own (kept warm beside the
        plain one the rounds use), and its reference downscale factor in the params."""
        lora = params.get("detailing_lora")
        if not lora:
            return pack, params
        if Path(lora).name != lora or not (pack.root / lora).is_file():
            raise PackError(f"pack {params['pack']!r} has no detailing LoRA file {lora!r} (put it in the pack folder)")
        params = {**params, "reference_downscale": reference_downscale(pack.root / lora)}
        detailed = WithLoras(pack, ((lora, float(params["detailing_strength"])),))
        self.loras.attach(self.engine.model, detailed)  # unfused user LoRAs: their adapters on this DiT too
        return detailed, params

    def _run_denoise_stage2(self, pack, params, inputs, step):
        """Stage 2 (with DFR's detailing IC-LoRA and stage 1's video as its reference when named), with the
        sampler the planner recorded or (no generation known at submit) the one this pack calls for."""
        if not params.get("sampler"):
            params = {**params, "sampler": stage2_sampler(pack.generation),
                      "ancestral_offset": ANCESTRAL_STAGE2_NOISE_SEED_OFFSET}
        pack, params = self._detailing(pack, params)
        return self.engine.denoise_stage2(pack, self._stage(pack, params, inputs), step)

    def _run_stage_prepare(self, pack, params, inputs, step):
        if params.get("audio_only"):  # T2A: the audio tokens alone (no picture: no size)
            return self.engine.prepare_audio_stage(self._stage(pack, {**params, "height": 0, "width": 0}, inputs))
        pack, params = self._detailing(pack, params)
        return self.engine.prepare_stage(pack, self._stage(pack, params, inputs))

    def _run_transformer_forward(self, pack, params, inputs, step):
        pack, params = self._detailing(pack, params)
        tokens = without_contexts(inputs)
        cache = self.engine.step_cache(params, inputs)  # the tile's, across the stage's steps
        velocity = self.engine.forward(pack, tokens, float(params["sigma"]), contexts_of(inputs), _tile_options(params), cache)
        step(1, 1)
        return {"velocity": velocity} | ({} if cache is None else cache.to_arrays())

    def _run_guidance_pass(self, pack, params, inputs, step):
        """One pass (cond, uncond, perturbed, isolated) of a guided step: its x0 (coordinator/plan/guidance.py)."""
        out = self.engine.guidance_pass(pack, params, without_contexts(inputs), contexts_of(inputs),
                                        split_of(params, self.sp_group))
        step(1, 1)
        return out

    def _run_upsample_spatial(self, pack, params, inputs, step):
        return {"latent": self.engine.upsample_spatial(pack, inputs["latent"])}

    def _run_upsample_temporal(self, pack, params, inputs, step):
        return {"latent": self.engine.upsample_temporal(pack, inputs["latent"])}

    def _run_dfr_tile(self, pack, params, inputs, step):
        from ltx_engine.dfr import DfrTileInputs
        from ltx_engine.rules.dfr_layout import plan_from_params

        plan = plan_from_params(params["dfr"]).rounds[int(params["round"]) - 1]
        tile = DfrTileInputs(latent=inputs["latent"], carry=inputs["carry"], contexts=contexts_of(inputs), plan=plan,
                             tile=plan.tiles[int(params["tile_index"])], image_latent=inputs.get("image_latent"),
                             image_frame=int(params.get("image_frame", 0)),
                             image_strength=float(params.get("image_strength", 1.0)),
                             images=dfr_images(params, inputs), previous=inputs.get("previous"),
                             previous_slots=inputs.get("previous_slots"))
        return self.engine.dfr_tile(pack, tile, step)

    def _run_predict_duration(self, pack, params, inputs, step):
        bounds = tuple(float(params[k]) for k in ("min_seconds", "max_seconds") if k in params)  # --auto-duration
        seconds, frames = self.engine.predict_duration(pack, contexts_of(inputs), float(params["fps"]), bounds)
        return {"seconds": np.array([seconds], np.float32), "frames": np.array([frames], np.int32)}

    def _run_dfr_keyframe_plane(self, pack, params, inputs, step):
        plane = int(params["plane"])
        latent = inputs["keyframes"][:, :, plane : plane + 1]
        return {"latent": self.engine.rebuild_keyframe(pack, latent, int(params["height"]), int(params["width"]))}

    def _run_decode_video(self, pack, params, inputs, step):
        if params.get("decoder") == "diffusion":  # LTX-2.5's vae_decoder_av (with the render's keyframes)
            pixels = self.engine.decode_video_diffusion(pack, inputs["latent"], int(params["noise_seed"]),
                                                        keyframes=task_keyframes(params, inputs))
            return {"frames": np.clip((pixels[0] + 1.0) / 2.0, 0.0, 1.0).transpose(1, 2, 3, 0)}
        return {"frames": self.engine.decode_video(pack, inputs["latent"])}

    def _run_decode_tile(self, pack, params, inputs, step):
        bounds = tuple(tuple(int(x) for x in params["latent"][axis]) for axis in ("frames", "height", "width"))
        if params.get("decoder") == "diffusion":
            return {"pixels": self.engine.decode_video_diffusion(pack, inputs["latent"], int(params["noise_seed"]),
                                                                 bounds, task_keyframes(params, inputs))}
        return {"pixels": self.engine.decode_video_tile(pack, inputs["latent"], bounds)}

    def _run_audio_encode(self, pack, params, inputs, step):  # (worker/media.py)
        return media.audio_encode(self.engine, pack, params, inputs)

    def _run_video_encode(self, pack, params, inputs, step):  # one tile of a source clip
        return media.video_encode(self.engine, pack, params, inputs)

    _run_control_mask = staticmethod(media.control_mask)  # an IC-LoRA control's mask clip, pooled

    def _run_hdr_stage(self, pack, params, inputs, step):  # the HDR IC-LoRA stage (worker/hdr.py)
        return hdr_stage(self.engine, pack, params, inputs, step, self.sp_group, self.sp_on_step)

    def _run_decode_audio(self, pack, params, inputs, step):
        wave, rate = self.engine.decode_audio(pack, inputs["latent"])
        return {"waveform": wave, "sample_rate": np.array([rate], dtype=np.int32)}
