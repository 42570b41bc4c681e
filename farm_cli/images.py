"""`--image PATH FRAME STRENGTH` (repeatable) with `--image-binding` / `--image-crf` applied per image in
order, as the spec's `images`; the decoded pixels travel beside them (uploaded as one blob each).

FRAME: a pixel index, negative from the end (-1 = the last frame), or `last`. BINDING: replace | guide |
auto (default auto: frame 0 replaces, any other frame guides). CRF: the H.264 round trip before encoding
(default: 33 on an LTX-2.3 pack, 18 on 2.5; 0 = none). One line, exit 2, for what cannot be an image.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from farm_cli.common import read_image
from farm_cli.session import fail
from protos.spec import IMAGE_BINDINGS, MAX_CRF, MAX_IMAGES

ImageArg = tuple[Path, str, float]


def _frame(text: str, path: Path) -> int | str:
    value = str(text).strip().lower()
    if value == "last":
        return "last"
    try:
        return int(value)
    except ValueError:
        fail(f"--image {path}: frame {text!r} is not an integer (negative from the end) or 'last'")


def _per_image(values: Sequence, n: int, flag: str) -> list:
    values = list(values or ())
    if len(values) > n:
        fail(f"{flag} given {len(values)} times for {n} --image: give at most one per image, in order")
    return values + [None] * (n - len(values))


def _binding(value: str | None) -> str | None:
    if value is not None and value not in IMAGE_BINDINGS:
        fail(f"--image-binding {value!r} is not one of {', '.join(IMAGE_BINDINGS)}")
    return value


def _crf(value: int | None) -> int | None:
    if value is not None and not 0 <= value <= MAX_CRF:
        fail(f"--image-crf {value} is outside 0..{MAX_CRF} (0: no H.264 round trip)")
    return value


def _file_sha(path: Path) -> str:
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()
    except OSError as exc:
        fail(f"cannot read image {path}: {exc.strerror or exc}")


def cli_images(images: Sequence[ImageArg] | None, bindings: Sequence[str] | None = None,
               crfs: Sequence[int] | None = None, read: bool = True) -> tuple[list[dict], list[np.ndarray]]:
    """The spec's `images` entries and each image's decoded pixels (`read=False`, for `farm plan`: the
    file's own sha256 stands in for the blob, nothing decoded)."""
    given = [im for im in images or () if im and im[0] is not None]
    if len(given) > MAX_IMAGES:
        fail(f"{len(given)} --image: at most {MAX_IMAGES} per render")
    entries, pixels = [], []
    for (path, frame, strength), binding, crf in zip(given, _per_image(bindings, len(given), "--image-binding"),
                                                     _per_image(crfs, len(given), "--image-crf"), strict=True):
        entry = {"frame": _frame(frame, path), "strength": float(strength)}
        entry |= {k: v for k, v in (("binding", _binding(binding)), ("crf", _crf(crf))) if v is not None}
        if read:
            pixels.append(read_image(Path(path)))
        else:
            entry["blob"] = _file_sha(Path(path))
        entries.append(entry)
    return entries, pixels


def with_blobs(spec: dict, blobs: Sequence[str]) -> dict:
    """The spec with each uploaded image's sha filled in, in order (a new dict; the given one unchanged)."""
    images = [dict(im) for im in spec.get("images") or ()]
    for entry, sha in zip(images, blobs, strict=True):
        entry["blob"] = sha
    return {**spec, "images": images}
