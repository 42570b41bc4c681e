"""The corpus's refusals: the bad inputs the tests submit or plan, each recorded with its one line.

Why: a refusal's wording is what a person reads at `farm submit` / `farm plan`; the refactor keeps it.
"""

from __future__ import annotations

from tests.planner_corpus.cases import (
    A2V,
    CHUNKED,
    CLIP,
    CONTROL,
    DFR,
    DUB,
    HDR,
    KEYS,
    LENGTH,
    NONE,
    P23,
    P25,
    PLANNER,
    RELAY,
    T2A,
    case,
)
from tests.planner_corpus.run import blob

GOOD = {"prompt": "a fox", "pack": "tiny"}  # tests/farm/test_validation.py: each bad field on a good spec
BAD_FIELDS = {
    "frame-rate-huge": {"frame_rate": 1e300}, "frame-rate-inf": {"frame_rate": float("inf")},
    "frame-rate-nan": {"frame_rate": float("nan")}, "frame-rate-0": {"frame_rate": 0},
    "prompt-not-text": {"prompt": 5}, "prompt-a-list": {"prompt": ["a", "b"]},
    "sigmas-nan": {"stage2_sigmas": [float("nan"), 0.0]}, "sigmas-rising": {"stage2_sigmas": [0.4, 0.7, 0.0]},
    "sigmas-not-ending-at-0": {"stage2_sigmas": [0.9, 0.5]}, "seed-beyond-2^63": {"seed": 2**64},
    "seed-a-bool": {"seed": True}, "height-text": {"height": "tall"}, "unknown-field": {"colour": "red"},
    "image-blob-not-a-sha": {"image": {"blob": "../../x", "frame": 0, "strength": 1.0}},
    "group-with-a-colon": {"group": "g:1"},
}
UNIT_BAD = {  # tests/unit/test_planner.py
    "prompt-blank": {"prompt": " "}, "width-300": {"width": 300}, "frames-26": {"frames": 26},
    "seed-negative": {"seed": -2}, "tiles-9x9": {"stage2_tiles": "9x9"}, "tiles-zz": {"stage2_tiles": "zz"},
    "image-frame-99": {"image": {"blob": blob("image"), "frame": 99}},
    "height-too-big": {"height": 4096, "width": 4096}, "too-long": {"frames": 505},
}
CLIP_BAD = {  # tests/unit/test_clip_plan.py
    "extend-0-frames": {"extend": {"frames": 0}}, "extend-direction-up": {"extend": {"frames": 1, "direction": "up"}},
    "retake-empty": {"retake": {"start": 0.5, "end": 0.5}}, "retake-past-end": {"retake": {"start": 0.1, "end": 2.0}},
    "retake-tiled": {"retake": {"start": 0.1, "end": 0.5}, "stage2_tiles": "1x2"},
    "retake-two-stage": {"retake": {"start": 0.1, "end": 0.5}, "pipeline": "two-stage"},
    "retake-dev-image": {"retake": {"start": 0.1, "end": 0.5}, "pipeline": "one-stage",
                         "images": [{"blob": blob("image"), "frame": 0}]},
    "retake-dev-stage2-sigmas": {"retake": {"start": 0.1, "end": 0.5}, "pipeline": "one-stage",
                                 "stage2_sigmas": [0.9, 0.0]},
    "extend-one-stage": {"extend": {"frames": 1}, "pipeline": "one-stage"},
    "extend-dev-tiled": {"extend": {"frames": 1}, "pipeline": "two-stage", "stage2_tiles": "1x2"},
    "extend-short-source": {"extend": {"frames": 1}, "frames": 17},
    "extend-no-source": {"extend": {"frames": 1}, "source_video": None},
}
A2V_BAD = {  # tests/unit/test_media_in.py
    "t2a": {"pipeline": "t2a"}, "audio-cfg": {"pipeline": "two-stage", "audio_cfg_scale": 7.0},
    "no-audio": {"audio": False}, "encode-tiles-7": {"audio_input": None, "encode_tiles": "7,7",
                                                     "source_video": {"blob": blob("clip-source")}},
}
KEYFRAMES_BAD = {  # tests/unit/test_keyframes_plan.py: (frame, binding) per image
    "frame-25": [(25, None)], "frame-minus-26": [(-26, None)], "two-replace-0": [(0, None), (0, "replace")],
    "two-replace-3": [(-8, "replace"), (17, "replace")], "replace-frame-5": [(5, "replace")],
    "binding-over": [(0, "over")], "crf-52": [(0, None, 52)], "too-many": [(0, None)] * 17,
}
GENERATED_BAD = {  # (fleet, changes)
    "on-2.3": (P23, {}), "no-fleet": (NONE, {}), "with-dfr-rounds": (P25, {"temporal_upscalings": 1, "frames": 49}),
    "too-many-for-9-frames": (P25, {"frames": 9, "num_generated_keyframes": 8}),
}
DFR_BAD = {  # tests/unit/test_dfr25_plan.py
    "spatial-height-192": {"spatial_upscalings": 2, "height": 192},
    "spatial-with-image": {"spatial_upscalings": 2, "images": [{"blob": blob("image"), "frame": 0}]},
    "dfr-generated-keyframes": {"dfr": True, "num_generated_keyframes": 1},
}
T2A_BAD = {  # tests/unit/test_t2a_local.py: video flags on the audio track alone
    "decode-tiles": {"decode_tiles": "off"}, "cfg-scale": {"cfg_scale": 2.0}, "width": {"width": 768},
    "no-audio": {"audio": False}, "image": {"images": [{"blob": blob("image"), "frame": 0}]},
    "apg": {"apg_eta": 0.5}, "dfr": {"dfr": True},
}
RELAY_BAD = {  # tests/unit/test_prompt_relay.py, tests/farm/test_relay_farm.py
    "past-the-end": {"segments": [*RELAY["segments"], {"text": "it rests", "seconds": 0.5}]},
    "no-latent-frame": {"segments": [{"text": "the fox sleeps", "seconds": 0.55}, {"text": "blink", "seconds": 0.05}]},
    "knob-alone": {"segments": []}, "epsilon-1": {"relay_epsilon": 1.0},
    "on-t2a": {"pipeline": "t2a", "stage2_tiles": None, "decode_tiles": "auto"},
}
FLEET_BAD = {  # tests/unit/test_planner.py, tests/farm/test_pack_refusals.py, test_lowram_farm.py
    "unknown-pack": ({**PLANNER, "pack": "big"}, [{"packs": ["tiny"], "memory_bytes": 1 << 36}]),
    "too-big-for-1gib": ({**PLANNER, "height": 2048, "width": 2048, "frames": 257},
                         [{"packs": ["tiny"], "memory_bytes": 1 << 30}]),
    "no-task-fits": ({**PLANNER, "pack": "tiny", "decode_tiles": "off"},
                     [{"packs": ["tiny"], "memory_gb": 0.001, "disk": True}]),
    "decode-fits-no-mac": ({**PLANNER, "pack": "tiny", "decode_tiles": "auto"},
                           [{"packs": ["tiny"], "memory_gb": 8 / 1024, "disk": True}]),
    "no-mac-holds-it": ({**PLANNER, "pack": "tiny25"}, [{"packs": ["tiny"], "memory_gb": 64, "disk": True}]),
    "generations-disagree": ({**PLANNER, "pack": "p"}, [*P23, *P25]),
    "missing-component": ({**PLANNER, "pack": "p"}, [{"packs": ["p"], "memory_bytes": 2**40,
                                                      "pack_components": {"p": ["transformer", "connector"]}}]),
    "text-encoder-not-held": ({**PLANNER, "pack": "p", "text_encoder": "gemma-3-12b"},
                              [{"packs": ["p"], "memory_bytes": 2**40, "pack_components": {"p": ["transformer"]},
                                "text_encoders": {}}]),
}


def _image(k: int, frame, binding=None, crf=None) -> dict:
    return {"blob": blob(f"image{k}"), "frame": frame, **({"binding": binding} if binding else {}),
            **({"crf": crf} if crf is not None else {})}


REFUSED = [
    *[case(f"refuse-field-{n}", "refusal", {**GOOD, **bad}) for n, bad in BAD_FIELDS.items()],
    *[case(f"refuse-unit-{n}", "refusal", {**PLANNER, **bad}) for n, bad in UNIT_BAD.items()],
    *[case(f"refuse-clip-{n}", "refusal", {**CLIP, **bad}) for n, bad in CLIP_BAD.items()],
    *[case(f"refuse-a2v-{n}", "refusal", {**A2V, **bad}) for n, bad in A2V_BAD.items()],
    *[case(f"refuse-keyframes-{n}", "refusal", {**KEYS, "images": [_image(k, *im) for k, im in enumerate(ims, 1)]}, P23)
      for n, ims in KEYFRAMES_BAD.items()],
    *[case(f"refuse-generated-{n}", "refusal", {**KEYS, "num_generated_keyframes": 2, **changes}, fleet)
      for n, (fleet, changes) in GENERATED_BAD.items()],
    *[case(f"refuse-dfr-{n}", "refusal", {**DFR, "height": 256, "width": 256, **bad}, P25) for n, bad in DFR_BAD.items()],
    *[case(f"refuse-fleet-{n}", "refusal", spec, fleet) for n, (spec, fleet) in FLEET_BAD.items()],
    case("refuse-hdr-no-frames", "refusal", {**HDR, "frames": None}, known={"generation": "2.5"}),
    case("refuse-hdr-generated-keyframes", "refusal", {**HDR, "num_generated_keyframes": 1},
         known={"generation": "2.5"}),  # the grade places its own seam slots
    # --stage1-parallel beside a cached guided stage (the cache is one process's)
    case("refuse-sp-step-cache-one-stage", "refusal", {**KEYS, "pack": "dev", "pipeline": "one-stage", "steps": 2,
                                                       "stage1_parallel": "2", "step_cache": 0.5}),
    *[case(f"refuse-hdr-{n}", "refusal", {**HDR, **bad}, known={"generation": "2.5"})  # the grade has no stage 2
      for n, bad in {"stage2-sigmas": {"stage2_sigmas": [0.9, 0.0]}, "sparse-attention": {"sparse_attention": [1.0]}}.items()],
    case("refuse-diffusion-decode-2.3", "refusal", {"prompt": "a fox", "pack": "p", "height": 64, "width": 256,
                                                    "frames": 9, "video_decoder": "diffusion"}, P23),
    case("refuse-guided-one-stage-tiles", "refusal", {**KEYS, "pack": "dev", "pipeline": "one-stage", "steps": 2,
                                                      "stage2_tiles": "1x2"}),
    case("refuse-guided-dfr", "refusal", {**KEYS, "pack": "dev", "pipeline": "two-stage", "steps": 2,
                                          "temporal_upscalings": 1}),
    case("refuse-length-on-2.3", "refusal", {**LENGTH, "pack": "tiny", "auto_duration": [1.0, 3.0]}),
    *[case(f"refuse-t2a-{n}", "refusal", {**T2A, **bad}) for n, bad in T2A_BAD.items()],
    case("refuse-t2a-no-frames-2.5", "refusal", {**T2A, "pack": "p", "frames": None}, P25),
    *[case(f"refuse-relay-{n}", "refusal", {**RELAY, **bad}) for n, bad in RELAY_BAD.items()],
    case("refuse-control-no-ic-lora", "refusal", {**CONTROL, "ic_lora": None}),
    case("refuse-dub-no-ic-lora", "refusal", {**DUB, "ic_lora": None}),
    case("refuse-control-stage2-tiled-attention", "refusal",
         {**CONTROL, "control_video": {**CONTROL["control_video"], "stage2": True}}),
    case("refuse-dub-control-mask", "refusal", {**DUB, "control_mask": {"blob": blob("mask"), "name": "m.mp4"}}),
    case("refuse-control-stage2-dfr", "refusal",
         {**CONTROL, "stage2_tiles": None, "control_video": {**CONTROL["control_video"], "stage2": True}, "dfr": True}),
    # no guided IC-LoRA control or Dub-It upstream or in the MLX port: one line says so
    case("refuse-control-two-stage", "refusal", {**CONTROL, "pack": "dev", "pipeline": "two-stage"}),
    case("refuse-dub-one-stage", "refusal", {**DUB, "pack": "dev", "pipeline": "one-stage"}),
    case("refuse-chunked-dfr", "refusal", {**DFR, "height": 128, "width": 128, "dfr": True, "chunked": True,
                                           "chunk_pixel_frames": 17, "chunk_carry_frames": 9}, P25),
    case("refuse-chunked-ic-lora-dfr", "refusal", {**CONTROL, **CHUNKED, "dfr": True}),
    case("refuse-chunked-dub-it-epilogue", "refusal", {**DUB, **CHUNKED, "spatial_upscalings": 2}),
    case("refuse-chunked-generated-keyframes", "refusal", {**KEYS, "frames": 33, "chunked": True,
                                                           "chunk_pixel_frames": 17, "chunk_carry_frames": 9,
                                                           "num_generated_keyframes": 1}, P25),
    case("refuse-chunked-keyframe-outside", "refusal", {**KEYS, "frames": 33, "chunked": True, "chunk_pixel_frames": 17,
                                                        "chunk_carry_frames": 9, "images": [_image(1, 33)]}, P23),
    case("refuse-enhance-2.5-tower", "refusal", {"prompt": "a fox", "pack": "tiny25", "height": 64, "width": 64,
                                                 "frames": 9, "enhance_prompt": True},
         [{"packs": ["tiny25"], "memory_gb": 64, "disk": True}]),
]
