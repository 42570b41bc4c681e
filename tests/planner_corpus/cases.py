"""The corpus's planned cases: the specs the tests submit or plan, one or more per recipe, at the fleets
the tests use. Each case: name, recipe (for the tally), spec, fleet rows (run.fleet_caps), optional
known (what the local runner or the duration head resolved) and media (the generated files are probed).

Why these: they are what the suite exercises today, so a refactor that keeps them planning the same keeps
what the suite's farm runs rely on; the media and pack facts come from files, as on a farm.
"""

from __future__ import annotations

from tests.planner_corpus.run import blob

# The specs the tests use (tests/unit/test_planner.py, tests/farm/*: SPEC, BASE and their variants).
PLANNER = {"prompt": "a fox", "height": 256, "width": 384, "frames": 25, "frame_rate": 24.0, "seed": 3}
E2E = {**PLANNER, "pack": "tiny"}
SMALL = {"prompt": "a fox", "height": 128, "width": 128, "frames": 9, "frame_rate": 24.0, "seed": 5, "pack": "tiny"}
SMALLEST = {"prompt": "a fox", "height": 128, "width": 128, "frames": 9, "seed": 3, "pack": "tiny", "audio": False,
            "decode_tiles": "off"}
TILED = {**E2E, "seed": 5, "stage2_tiles": "2x2", "tile_overlap": 5, "decode_tiles": "off"}
GANG = {**E2E, "stage2_tiles": "2x2", "tile_overlap": 5, "decode_tiles": "32,256,256"}
LORA_BASE = {"prompt": "a fox", "height": 128, "width": 256, "frames": 9, "seed": 5, "pack": "tiny",
             "stage2_tiles": "2x2", "tile_overlap": 1}
CLIP = {"prompt": "a fox", "height": 128, "width": 192, "frames": 33, "pack": "tiny",
        "source_video": {"blob": blob("clip-source"), "name": "clip.mp4"}}
A2V = {"prompt": "a fox", "height": 128, "width": 192, "frames": 25, "pack": "tiny",
       "audio_input": {"blob": blob("voice-input"), "start": 0.5, "name": "voice.wav"}}
IC_LORA = {"blob": blob("ic-lora"), "strength": 1.0, "downscale": 2, "name": "ic.safetensors"}
CONTROL = {**E2E, "height": 256, "width": 256, "seed": 5, "stage2_tiles": "1x2", "tile_overlap": 1,
           "encode_tiles": "24,96", "ic_lora": IC_LORA,
           "control_video": {"blob": blob("control"), "strength": 0.9, "attention_strength": 0.5, "name": "depth.mp4"}}
STAGE2 = {**CONTROL["control_video"], "stage2": True}
DUB = {"prompt": "a fox", "height": 128, "width": 128, "frames": 25, "frame_rate": 24.0, "seed": 5, "pack": "tiny",
       "encode_tiles": "24,128", "tile_overlap": 1, "stage2_tiles": "1x2",
       "dub_video": {"blob": blob("talk"), "name": "talk.mp4"}, "ic_lora": IC_LORA}
HDR = {"prompt": "a harbour", "height": 64, "width": 64, "frames": 25, "seed": 3, "pack": "tiny25", "audio": False,
       "hdr": True, "decode_tiles": "off", "hdr_ic_lora": {"blob": blob("hdr-clip"), "name": "clip.mp4"}}
GUIDED = {"prompt": "a fox", "frames": 9, "seed": 3, "pack": "dev", "decode_tiles": "off", "negative_prompt": "blurry"}
ONE = {**GUIDED, "pipeline": "one-stage", "height": 64, "width": 64, "steps": 2, "stg_blocks": [1]}
TWO = {**GUIDED, "pipeline": "two-stage", "height": 128, "width": 128, "stage1_steps": 2, "stage2_steps": 1,
       "stg_blocks": [1]}
HQ = {**GUIDED, "pipeline": "two-stage-hq", "height": 128, "width": 128, "stage1_steps": 2, "stage2_steps": 1}
T2A = {"prompt": "a bell rings", "frames": 9, "seed": 3, "pack": "dev", "pipeline": "t2a", "steps": 2,
       "stg_blocks": [1], "negative_prompt": "noise"}
RELAY = {"prompt": "a fox in a field", "height": 128, "width": 128, "frames": 25, "seed": 5, "pack": "tiny",
         "decode_tiles": "off", "stage2_tiles": "2x1x1", "tile_overlap": 1, "relay_epsilon": 0.01,
         "segments": [{"text": "the fox sleeps", "seconds": 0.5}, {"text": "the fox runs", "seconds": 0.54}]}
KEYS = {"prompt": "a fox", "height": 256, "width": 384, "frames": 25, "frame_rate": 24.0, "seed": 3, "pack": "p"}
DFR = {"prompt": "a fox", "frames": 41, "pack": "p"}
DFR_FARM = {"prompt": "a fox", "height": 128, "width": 192, "frames": 41, "frame_rate": 24.0, "seed": 5,
            "pack": "tiny25", "decode_tiles": "off"}
LENGTH = {"prompt": "a fox walks through snow", "height": 64, "width": 64, "frame_rate": 24.0, "seed": 3,
          "pack": "tiny25", "decode_tiles": "off"}

CHUNKED = {"frames": 33, "chunked": True, "chunk_pixel_frames": 17, "chunk_carry_frames": 9}

# Fleets: rows as run.fleet_caps reads them. `disk`: the packs' facts as a worker reads them from disk.
NONE: list[dict] = []
ONE_MAC = [{"packs": ["tiny"], "memory_gb": 64, "disk": True}]
TWO_MACS = [{"packs": ["tiny"], "memory_gb": 64, "disk": True, "count": 2}]
THREE_MACS = [{"packs": ["tiny"], "memory_gb": 64, "disk": True, "count": 3}]
FOUR_BARE = [{"packs": ["tiny"], "count": 4}]
FOUR_MACS = [{"packs": ["tiny"], "memory_gb": 64, "disk": True, "count": 4}]
WIDE = {"prompt": "a fox", "height": 576, "width": 1024, "frames": 97, "frame_rate": 24.0, "seed": 3, "pack": "tiny"}
SMALL_MAC = [{"packs": ["tiny"], "memory_gb": 0.25, "disk": True}]
LOW_RAM = [{"packs": ["tiny"], "memory_gb": 8 / 1024, "disk": True, "count": 2}]  # test_lowram_farm: 8 MB
MAC25 = [{"packs": ["tiny25"], "memory_gb": 64, "disk": True}]
DEV_MAC = [{"packs": ["dev"], "memory_gb": 64, "disk": True}]
P23 = [{"packs": ["p"], "memory_bytes": 2**40, "pack_generation": {"p": "2.3"}}]
P25 = [{"packs": ["p"], "memory_bytes": 2**40, "pack_generation": {"p": "2.5"},
        "pack_features": {"p": ["temporal_upscaler", "keyframes"]}}]


def _images(*frames_bindings) -> list[dict]:
    """Keyframe images (blobs by index), each (frame, binding or None)."""
    return [{"blob": blob(f"image{k}"), "frame": f, **({"binding": b} if b else {})}
            for k, (f, b) in enumerate(frames_bindings, 1)]


def case(name: str, recipe: str, spec: dict, fleet: list[dict] = NONE, **extra) -> dict:
    return {"name": name, "recipe": recipe, "spec": spec, "fleet": fleet, **extra}


PLANNED = [
    # The distilled two-stage default, at the tests' sizes and worker counts.
    case("distilled-unit", "distilled", PLANNER),
    case("distilled-e2e-1mac", "distilled", E2E, ONE_MAC),
    case("distilled-e2e-3macs", "distilled", E2E, THREE_MACS),
    case("distilled-small-2macs", "distilled", SMALL, TWO_MACS),
    case("distilled-smallest-lowram", "distilled", SMALLEST, LOW_RAM),
    case("distilled-no-audio-9f", "distilled", {**E2E, "frames": 9, "audio": False, "seed": 1}, TWO_MACS),
    case("distilled-97f", "distilled", {"prompt": "a fox", "height": 256, "width": 384, "frames": 97,
                                        "frame_rate": 24.0, "pack": "tiny"}),
    case("distilled-30fps-seed11", "distilled", {**E2E, "frame_rate": 30.0, "seed": 11}, ONE_MAC),
    case("distilled-text-encoder-pack", "distilled", {**PLANNER, "text_encoder": "pack"}),
    case("distilled-exr-acescg", "distilled", {**SMALL, "height": 64, "width": 64, "decode_tiles": "off",
                                              "exr": "/tmp/planner-corpus-exr", "exr_colorspace": "acescg"}),
    case("distilled-compute-float16", "distilled", {**SMALL, "compute_dtype": "float16"}, ONE_MAC),
    # Image conditioning and keyframes.
    case("image-first-frame", "keyframes", {**PLANNER, "image": {"blob": blob("image"), "frame": 0, "strength": 0.9}}),
    case("keyframes-replace-guide", "keyframes", {**KEYS, "images": _images((0, None), (12, "guide"), (-1, None))},
         P23),
    case("keyframes-tiled-2x1x1", "keyframes", {**KEYS, "images": _images((0, None), (16, "guide"), (17, "replace")),
                                                "stage2_tiles": "2x1x1", "tile_overlap": 1}, P23),
    case("keyframes-farm", "keyframes", {**E2E, "seed": 11, "stage2_tiles": "2x2", "tile_overlap": 2,
                                         "decode_tiles": "32,256,256", "images": _images((0, None), (24, None))},
         TWO_MACS),
    case("keyframes-dfr-round", "keyframes", {**KEYS, "frames": 97, "temporal_upscalings": 1, "stage2_tiles": "1x2",
                                              "tile_overlap": 1, "images": _images((0, None), (48, None), (96, None))},
         P25),
    case("generated-keyframes-3", "keyframes", {**KEYS, "num_generated_keyframes": 3, "frames": 49}, P25),
    case("generated-keyframes-2", "keyframes", {**KEYS, "num_generated_keyframes": 2}, P25),
    # the diffusion decoder reads them: stage 2 carries them (upsampled) and every decode tile reads stage 2's
    case("generated-keyframes-diffusion-decode", "keyframes", {**KEYS, "num_generated_keyframes": 2,
                                                                "video_decoder": "diffusion"}, P25),
    # the guided recipes: every pass carries the slots (and the 2.5 marker), the last guide step reads them out
    *[case(f"generated-keyframes-{name}", "keyframes", {**spec, "pack": "p", "num_generated_keyframes": 1,
                                                        "frames": 17}, P25)
      for name, spec in (("one-stage", ONE), ("two-stage", TWO), ("two-stage-hq", HQ))],
    case("generated-keyframes-one-stage-diffusion-decode", "keyframes", {**ONE, "pack": "p", "frames": 17,
                                                                          "num_generated_keyframes": 1,
                                                                          "video_decoder": "diffusion"}, P25),
    case("media-image-tiled", "keyframes", {**A2V, "audio_input": None, "seed": 5, "stage2_tiles": "1x2",
                                            "tile_overlap": 1, "images": _images((0, None))}, ONE_MAC),
    # Stage-2 tiles (TDP) and the fleet-chosen tiling.
    case("tiles-2x2-unit", "stage2-tiles", {**PLANNER, "stage2_tiles": "2x2"}),
    case("tiles-auto-4-workers", "stage2-tiles", {**PLANNER, "stage2_tiles": "auto"}, FOUR_BARE),
    # A 16:9 frame: auto's four tiles as the columns whose step ends first (1x4, not 2x2's larger quadrants).
    case("tiles-auto-4-macs-wide", "stage2-tiles", {**WIDE, "stage2_tiles": "auto"}, FOUR_MACS),
    case("tiles-2x2-lowram", "stage2-tiles", TILED, ONE_MAC),
    case("tiles-dealing-sigmas", "stage2-tiles", {**E2E, "height": 512, "width": 768, "frames": 9, "seed": 5,
                                                  "stage2_tiles": "2x2", "tile_overlap": 2,
                                                  "stage2_sigmas": [0.909375, 0.725, 0.5, 0.3, 0.0]}, THREE_MACS),
    case("tiles-dashboard", "stage2-tiles", {**E2E, "seed": 9, "stage2_tiles": "2x2", "tile_overlap": 5}, TWO_MACS),
    case("tiles-watchers", "stage2-tiles", {**E2E, "width": 256, "frames": 9, "seed": 5, "stage2_tiles": "2x2",
                                            "tile_overlap": 2}, TWO_MACS),
    case("tiles-1x2x2-temporal", "stage2-tiles", {**E2E, "frames": 49, "stage2_tiles": "2x1x2", "tile_overlap": 2}),
    # Decode tiling.
    case("decode-tiles-explicit", "decode-tiles", {**E2E, "seed": 7, "decode_tiles": "32,256,256"}, ONE_MAC),
    case("decode-tiles-auto-small-mac", "decode-tiles", {**E2E, "seed": 7, "decode_tiles": "auto"}, SMALL_MAC),
    case("decode-tiles-auto-no-fleet", "decode-tiles", {**E2E, "seed": 7, "decode_tiles": "auto"}),
    # Longer than one reference tile on 4 Macs: auto's tiles sized for the holders, not the reference's.
    case("decode-tiles-auto-4-macs", "decode-tiles", {**WIDE, "decode_tiles": "auto"}, FOUR_MACS),
    case("decode-tiles-off", "decode-tiles", {**E2E, "seed": 7, "decode_tiles": "off"}, ONE_MAC),
    case("diffusion-decode", "decode-tiles", {"prompt": "a fox", "pack": "p", "seed": 5, "height": 64, "width": 256,
                                              "frames": 9, "video_decoder": "diffusion",
                                              "decode_tiles": "48,192,192"}, known={"generation": "2.5"}),
    case("diffusion-decode-farm", "decode-tiles", {"prompt": "a fox", "height": 64, "width": 256, "frames": 9,
                                                   "seed": 5, "pack": "tiny25", "decode_tiles": "48,192,192",
                                                   "video_decoder": "diffusion"}, MAC25),
    # Sequence-parallel stage 1 (the gang's degree cap).
    *[case(f"sp-degree-{asked}", "sequence-parallel", {**GANG, "stage1_parallel": asked}, THREE_MACS)
      for asked in ("1", "2", "3", "8")],
    case("sp-auto-1mac", "sequence-parallel", GANG, ONE_MAC),
    # ... with reference tokens split with the video's (IC-LoRA control at attention 0.5, Dub-It), and on a
    # retake's / extend's pinned stage 1.
    case("sp-ic-lora-control", "sequence-parallel", {**CONTROL, "stage1_parallel": "2"}, TWO_MACS),
    case("sp-dub-it", "sequence-parallel", {**DUB, "stage1_parallel": "2"}),
    case("sp-retake", "sequence-parallel", {**CLIP, "retake": {"start": 0.4, "end": 0.9}, "stage1_parallel": "2"}),
    case("sp-extend", "sequence-parallel", {**CLIP, "extend": {"frames": 2}, "stage1_parallel": "2"}),
    # the HDR grade's one stage carries stage 1's degree table: a gang splits it too
    case("sp-hdr", "sequence-parallel", {**HDR, "stage1_parallel": "2"}, known={"generation": "2.5"}),
    # ... on a guided stage 1: each pass with video a gang task (HQ's guided stage 2 none), the dev clip recipes too.
    *[case(f"sp-{n}", "sequence-parallel", {**spec, "stage1_parallel": "2"}) for n, spec in (
        ("one-stage", ONE), ("two-stage-hq", HQ),
        ("retake-dev", {**CLIP, "pack": "dev", "pipeline": "one-stage", "steps": 2, "retake": {"start": 0.4, "end": 0.9}}),
        ("extend-dev", {**CLIP, "pack": "dev", "pipeline": "two-stage", "stage1_steps": 2, "extend": {"frames": 1}}))],
    # Sparse attention and the forward settings.
    case("sparse-farm", "sparse", {**E2E, "height": 1216, "width": 1792, "frames": 9, "seed": 5, "stage2_tiles": "2x1",
                                   "tile_overlap": 36, "sparse_attention": [1.0, 1.5], "compute_dtype": "float16",
                                   "audio": False, "decode_tiles": "off"}, TWO_MACS),
    case("sparse-untiled", "sparse", {**E2E, "height": 1216, "width": 1792, "frames": 9, "audio": False,
                                      "decode_tiles": "off", "sparse_attention": [1.0, 1.5, 2.0]}, ONE_MAC),
    # User LoRAs.
    case("loras-unfused", "loras", {**LORA_BASE, "decode_tiles": "32,128,128", "lora_mode": "unfused",
                                    "loras": [{"blob": blob("style"), "name": "style.safetensors", "strength": 0.8},
                                              {"file": "detail.safetensors", "strength": -0.5}]}, TWO_MACS),
    case("loras-fused", "loras", {**LORA_BASE, "loras": [{"blob": blob("style"), "strength": 1.0}]}),
    # Unfused on the guided recipes: the set's adapters on every pass's dev DiT (and under the distilled LoRA).
    *[case(f"loras-unfused-{name}", "loras", {**spec, "lora_mode": "unfused",
                                               "loras": [{"blob": blob("style"), "name": "style.safetensors",
                                                          "strength": 0.8}]})
      for name, spec in (("one-stage", ONE), ("two-stage", TWO), ("two-stage-hq", HQ))],
    case("loras-sp-gang", "loras", {**GANG, "stage1_parallel": "2",
                                    "loras": [{"blob": blob("style"), "name": "style.safetensors", "strength": 0.8}]},
         THREE_MACS),
    # The dev DiT's guided recipes.
    case("guided-one-stage", "one-stage", ONE),
    case("guided-one-stage-dev-mac", "one-stage", ONE, DEV_MAC),
    case("guided-two-stage", "two-stage", TWO),
    case("guided-two-stage-hq", "two-stage-hq", HQ),
    case("guided-two-stage-tiled", "two-stage", {**TWO, "steps": 2, "stage2_tiles": "1x2", "tile_overlap": 1}),
    case("guided-two-stage-scales", "guidance", {**TWO, "cfg_scale": 4.0, "stg_scale": 0.5, "rescale": 0.7,
                                                 "modality_scale": 2.0, "audio_cfg_scale": 6.0}),
    case("guided-one-stage-3-steps", "guidance", {**ONE, "steps": 3, "height": 64, "width": 64}),
    case("guided-two-stage-1-step", "guidance", {**{k: v for k, v in TWO.items() if k != "stage1_steps"}, "steps": 1}),
    # A prompt per moment (Prompt Relay): the text task's table beside the contexts of every stage and tile.
    case("relay-farm", "relay", RELAY, TWO_MACS),
    case("relay-one-stage", "relay", {**ONE, "segments": RELAY["segments"], "frames": 25}, DEV_MAC),
    case("relay-chunked", "relay", {**RELAY, "chunked": True, "chunk_pixel_frames": 17, "chunk_carry_frames": 9,
                                    "height": 64, "width": 128, "stage2_tiles": "1x2"}, TWO_MACS),
    # Text to audio: the audio track alone.
    case("t2a", "t2a", T2A),
    case("t2a-dev-mac", "t2a", T2A, DEV_MAC),
    case("t2a-lora", "t2a", {**T2A, "loras": [{"blob": blob("style"), "strength": 0.8}]}),
    case("t2a-skip-step-defaults", "t2a", {**T2A, "steps": 4, "audio_skip_step": 1, "negative_prompt": None,
                                           "frames": 25}),
    # --enhance-prompt: the pack's Gemma writes the prompt first (the negative is encoded as given).
    case("enhance-prompt", "enhance", {**SMALL, "enhance_prompt": True}, ONE_MAC),
    case("enhance-prompt-guided", "enhance", {**TWO, "enhance_prompt": True}),
    # Audio to video.
    case("a2v", "a2v", A2V),
    case("a2v-tiled", "a2v", {**A2V, "stage2_tiles": "1x2", "tile_overlap": 1}),
    *[case(f"a2v-{p}", "a2v", {**A2V, "pack": "dev", "pipeline": p, "stage1_steps": 2, "negative_prompt": "blurry"})
      for p in ("one-stage", "two-stage", "two-stage-hq")],
    case("a2v-probed", "a2v", {**A2V, "audio_input": {"blob": blob("voice"), "start": 0.5, "name": "voice.wav"}},
         ONE_MAC, media=True),
    case("video-encode-tiles", "a2v", {**A2V, "audio_input": None, "source_video": {"blob": blob("clip-source")},
                                       "encode_tiles": "24,128"}),
    # Retake and extend.
    case("retake-keep-audio", "retake", {**CLIP, "retake": {"start": 0.4, "end": 0.9, "regen_audio": False}}),
    case("retake", "retake", {**CLIP, "retake": {"start": 0.4, "end": 0.9}}),
    case("retake-dev", "retake-dev", {**CLIP, "pack": "dev", "pipeline": "one-stage", "steps": 2, "stg_blocks": [1],
                                      "negative_prompt": "blurry", "retake": {"start": 0.4, "end": 0.9}}),
    case("retake-dev-keep-audio", "retake-dev", {**CLIP, "pack": "dev", "pipeline": "one-stage", "cfg_scale": 2.0,
                                                 "retake": {"start": 0.4, "end": 0.9, "regen_audio": False}}),
    case("retake-probed", "retake", {**CLIP, "frames": None, "source_video": {"blob": blob("clip_av"),
                                                                              "name": "clip.mp4"},
                                     "retake": {"start": 0.2, "end": 0.8}}, ONE_MAC, media=True),
    *[case(f"extend-{d}", "extend", {**CLIP, "extend": {"frames": 2, "direction": d}}) for d in ("after", "before")],
    case("extend-no-audio", "extend", {**CLIP, "extend": {"frames": 1}, "audio": False}),
    case("extend-dev", "extend-dev", {**CLIP, "pack": "dev", "pipeline": "two-stage", "stage1_steps": 2,
                                      "stage2_steps": 1, "stg_blocks": [1], "extend": {"frames": 1}}),
    case("extend-dev-before-no-audio", "extend-dev", {**CLIP, "pack": "dev", "pipeline": "two-stage", "audio": False,
                                                      "extend": {"frames": 2, "direction": "before"}}),
    case("extend-tiled", "extend", {**CLIP, "extend": {"frames": 1}, "stage2_tiles": "1x2", "tile_overlap": 1}),
    case("extend-probed", "extend", {**CLIP, "frames": None, "source_video": {"blob": blob("clip_av"), "name": "c.mp4"},
                                     "extend": {"frames": 1}}, ONE_MAC, media=True),
    case("extend-probed-silent", "extend", {**CLIP, "frames": None, "audio": False, "extend": {"frames": 1},
                                            "source_video": {"blob": blob("clip"), "name": "c.mp4"}}, ONE_MAC, media=True),
    # IC-LoRA control and Dub-It.
    case("ic-lora-control", "ic-lora-control", CONTROL, TWO_MACS),
    case("ic-lora-control-untiled", "ic-lora-control", {**CONTROL, "stage2_tiles": None}),
    # --control-stage2 (the MLX port's control-aware refine): the control at full size in stage 2 too
    case("ic-lora-control-stage2", "ic-lora-control", {**CONTROL, "stage2_tiles": None, "control_video": STAGE2}),
    case("ic-lora-control-mask", "ic-lora-control", {**CONTROL, "control_mask": {"blob": blob("mask"), "name": "m.mp4"}}),
    case("ic-lora-control-stage2-mask", "ic-lora-control", {**CONTROL, "stage2_tiles": None, "control_video": STAGE2,
                                                            "control_mask": {"blob": blob("mask"), "name": "m.mp4"}}),
    case("chunked-ic-lora-control-mask", "chunked", {**CONTROL, **CHUNKED,
                                                     "control_mask": {"blob": blob("mask"), "name": "m.mp4"}}),
    case("ic-lora-control-stage2-tiled", "ic-lora-control",
         {**CONTROL, "control_video": {**STAGE2, "attention_strength": 1.0}}, TWO_MACS),
    case("dub-it", "dub-it", DUB),
    case("dub-it-untiled", "dub-it", {**DUB, "stage2_tiles": None}),
    # HDR: the HDR IC-LoRA render, and the HLG master of a plain render.
    case("hdr-ic-lora", "hdr", HDR, known={"generation": "2.5"}),
    case("hdr-ic-lora-encode-tiles", "hdr", {**HDR, "encode_tiles": "24,96"}, known={"generation": "2.5"}),
    case("hdr-ic-lora-plain", "hdr", {**HDR, "hdr_ic_lora": {"blob": blob("hdr-clip"), "keyframes": False,
                                                             "input_colorspace": "srgb"}}, known={"generation": "2.5"}),
    case("hdr-ic-lora-diffusion-decode", "hdr", {**HDR, "width": 256, "video_decoder": "diffusion",
                                                 "decode_tiles": "48,192,192"}, known={"generation": "2.5"}),
    case("hdr-master", "hdr", {**SMALL, "hdr": True}, ONE_MAC),
    # DFR: base path, spatial rounds, temporal rounds, the epilogue.
    case("dfr-base-detailing", "dfr", {**DFR, "dfr": True, "height": 128, "width": 192,
                                       "detailing_lora": "d.safetensors"}, P25),
    case("dfr-spatial-2", "dfr", {**DFR, "spatial_upscalings": 2, "height": 256, "width": 512}, P25),
    case("dfr-temporal-1", "dfr", {**DFR, "frames": 97, "temporal_upscalings": 1, "height": 256, "width": 256}, P25),
    case("dfr-farm", "dfr", {**DFR_FARM, "dfr": True}, MAC25),
    case("dfr-farm-tiled", "dfr", {**DFR_FARM, "temporal_upscalings": 1, "frames": 49, "stage2_tiles": "1x2",
                                   "tile_overlap": 1}, MAC25),
    case("dfr-diffusion-decode", "dfr", {**DFR, "dfr": True, "height": 128, "width": 192,
                                         "video_decoder": "diffusion", "decode_tiles": "48,192,192"}, P25),
    case("stage2-ltx23-euler", "distilled", {"prompt": "a fox", "frames": 25, "pack": "p"}, P23),
    # The length the duration head picks (LTX-2.5): phase 1, then phase 2 at the picked length.
    case("length-phase-1", "auto-duration", LENGTH, MAC25),
    case("length-phase-1-auto-duration", "auto-duration", {**LENGTH, "auto_duration": [1.0, 3.0]}, MAC25),
    case("length-phase-2", "auto-duration", LENGTH, MAC25, known={"frames": 33, "predicted_seconds": 1.3}),
    # Chunked guided recipes: each window the guided graph, pinned on the window before; keyframes per window.
    case("chunked-two-stage", "chunked", {**TWO, **CHUNKED, "stage2_tiles": "1x2", "tile_overlap": 1}, DEV_MAC),
    case("chunked-one-stage-latent", "chunked", {**ONE, **CHUNKED, "chunk_carry": "latent"}, DEV_MAC),
    case("chunked-two-stage-hq", "chunked", {**HQ, **CHUNKED}),
    case("chunked-two-stage-a2v", "chunked", {**TWO, **CHUNKED, "frames": 25,
                                              "audio_input": {**A2V["audio_input"], "start": 0.0}}),
    case("chunked-two-stage-hq-a2v", "chunked", {**HQ, **CHUNKED, "frames": 25,
                                                 "audio_input": {**A2V["audio_input"], "start": 0.0}}),
    case("chunked-keyframes", "chunked", {**SMALL, **CHUNKED, "height": 64, "width": 128, "decode_tiles": "off",
                                          "images": _images((0, None), (12, "guide"), (24, None), (-1, None))},
         TWO_MACS),
    case("chunked-two-stage-keyframe", "chunked", {**TWO, **CHUNKED, "frames": 25,
                                                   "images": _images((20, "guide"))}),
    # Chunked IC-LoRA / Dub-It: each window its slice of the control clip / reference (and its track).
    case("chunked-ic-lora-control", "chunked", {**CONTROL, **CHUNKED}, TWO_MACS),
    case("chunked-dub-it", "chunked", {**DUB, **CHUNKED, "frames": 25}),
]
