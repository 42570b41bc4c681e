"""`--audio FILE [--audio-start S]` on the client: the file as a blob named by its sha256.

The file is read here only to hash it and send it (once: a second render with it sends nothing new, as
an `--image` or a client `--lora`); what it holds is the coordinator's media probe's business, in a
child process there (`coordinator/admit/media_check.py`), and `farm render --local` runs the same probe
before it renders. What can be said without reading it (no such file, a start without a file) is one
line here, exit 2.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path

from farm_cli.session import fail


@dataclass
class ClientMedia:
    """The spec fields of a render's media and the client files its blobs are (sha256 -> path)."""

    fields: dict = field(default_factory=dict)
    files: dict[str, Path] = field(default_factory=dict)

    def add(self, flag: str, given: Path) -> dict:
        """A client file as {blob, name} (its sha256 and file name), kept for the upload; one line, exit
        2, when it is not a readable file. The clip pipelines' flags (a source video) use it too."""
        path = Path(given).expanduser()
        if not path.is_file():
            fail(f"{flag} {given}: no such file")
        try:
            sha = _sha256(path)
        except OSError as exc:
            fail(f"{flag} {given}: cannot read it ({exc.strerror or exc})")
        self.files[sha] = path.resolve()
        return {"blob": sha, "name": path.name}


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def resolve(audio: Path | None, audio_start: float | None) -> ClientMedia:
    """The `audio_input` field of `--audio` / `--audio-start` (none given: no fields)."""
    out = ClientMedia()
    if audio is None:
        if audio_start is not None:
            fail("--audio-start needs --audio FILE")
        return out
    blob = out.add("--audio", audio)
    out.fields["audio_input"] = {**blob, "start": float(audio_start or 0.0)}
    return out


def add_control(
    out: ClientMedia,
    control: tuple[Path, float] | None,
    attention: float | None,
    ic_lora: tuple[Path, float] | None,
    dub: Path | None,
    stage2: bool = False,
    mask: Path | None = None,
) -> None:
    """IC-LoRA control's `control_video` and Dub-It's `dub_video`, each with the `ic_lora` it needs (its
    `reference_downscale_factor` read here from the file's header, so `farm plan` sizes the control's
    encode; the coordinator reads the uploaded blob's again). One line, exit 2, for what is missing."""
    if control is None and dub is None:
        for flag, given in (("--ic-lora", ic_lora), ("--control-attention", attention),
                            ("--control-stage2", stage2 or None), ("--control-mask", mask)):
            if given is not None:
                fail(f"{flag} needs --control-video FILE STRENGTH or --dub VIDEO")
        return
    if ic_lora is None:
        flag = "--control-video" if control is not None else "--dub"
        fail(f"{flag} needs --ic-lora FILE STRENGTH (the IC-LoRA it was trained with)")
    # both clips, or --control-attention / --control-stage2 with --dub: sent as given, the planner's recipe table refuses them
    clips = [("control_video", "--control-video", control[0], control[1])] if control is not None else []
    clips += [("dub_video", "--dub", dub, 1.0)] if dub is not None else []
    for key, flag, clip, strength in clips:
        out.fields[key] = {
            **out.add(flag, clip),
            "strength": float(strength),
            "attention_strength": 1.0 if attention is None else float(attention),
            **({"stage2": True} if stage2 else {}),
        }
    if mask is not None:  # the planner's recipe table refuses it beside --dub
        out.fields["control_mask"] = out.add("--control-mask", mask)
    lora = out.add("--ic-lora", ic_lora[0])
    out.fields["ic_lora"] = {
        **lora,
        "strength": float(ic_lora[1]),
        "downscale": _downscale(out.files[lora["blob"]]),
    }


def _downscale(path: Path) -> int:
    from ltx_engine.rules.ic_lora import ControlError, control_downscale

    try:
        return control_downscale([path])
    except ControlError as exc:
        fail(f"--ic-lora {path.name}: {str(exc).removeprefix(f'{path}: ')}")


def resolve_clip(out: ClientMedia, asked: dict) -> ClientMedia:
    """Retake/extend: `source_video` and the `retake` / `extend` field of the asked flags."""
    a = asked
    if a["retake"] is None and (a["start"] is not None or a["end"] is not None or a["no_regen_audio"]):
        fail("--start / --end / --no-regen-audio need --retake VIDEO")
    if a["extend"] is None and (a["extend_frames"] is not None or a["direction"] is not None):
        fail("--extend-frames / --direction need --extend VIDEO")
    if a["retake"] is not None and a["extend"] is not None:
        fail("--retake and --extend: give one of them")
    if a["retake"] is not None:
        if a["start"] is None or a["end"] is None:
            fail("--retake needs --start S and --end E (seconds into the clip)")
        out.fields["source_video"] = out.add("--retake", a["retake"])
        out.fields["retake"] = {"start": a["start"], "end": a["end"], "regen_audio": not a["no_regen_audio"]}
    if a["extend"] is not None:
        if a["extend_frames"] is None:
            fail("--extend needs --extend-frames N (latent frames to add)")
        out.fields["source_video"] = out.add("--extend", a["extend"])
        out.fields["extend"] = {"frames": a["extend_frames"], "direction": a["direction"] or "after"}
    return out


def add_hdr_clip(
    out: ClientMedia, clip: Path | None, no_keyframes: bool, input_colorspace: str | None
) -> None:
    """`--hdr-ic-lora CLIP` as the `hdr_ic_lora` field; the render is video only and writes
    the HLG master (`hdr`). The keyframe and colourspace flags mean nothing without a clip."""
    if clip is None:
        if no_keyframes or input_colorspace:
            fail("--no-keyframes / --input-colorspace are --hdr-ic-lora options: give --hdr-ic-lora CLIP")
        return
    blob = out.add("--hdr-ic-lora", clip)
    record = {**blob, "keyframes": not no_keyframes, "input_colorspace": input_colorspace or "srgb_gamma"}
    out.fields |= {"hdr_ic_lora": record, "hdr": True, "audio": False}


def upload_to(files: dict[str, Path], coordinator: str, token: str | None) -> None:
    """Each media file as a blob (the coordinator keeps it only when it hashes to its name)."""
    if not files:
        return
    from farm_cli.remote import client
    from farm_cli.session import one_line

    with one_line(), client(coordinator, token) as farm:
        for sha, path in files.items():
            if farm.put_blob(path.read_bytes()) != sha:
                fail(f"{path}: changed while it was uploaded; submit again")
