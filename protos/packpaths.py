"""Names and paths inside a pack shelf, as both ends of pack distribution check them.

The coordinator serves only files that pass these checks, and a worker writes only where they allow
(its staging folder and the pack's own folder): one rule on both sides of the wire, so a coordinator
that answers with `../x` cannot make a worker write outside its packs folder.
"""

from __future__ import annotations

from pathlib import PurePosixPath

STAGING = ".farm-staging"  # where a worker assembles a pack before renaming it into place


class PackRefused(ValueError):
    """A pack name or file path that the shelf will not serve (or a worker will not write)."""


def check_pack_name(name: str) -> str:
    """A pack is one folder name: no separators, no `..`, nothing hidden."""
    if not name or "/" in name or "\\" in name or "\0" in name or name.startswith("."):
        raise PackRefused(f"not a pack name: {name!r:.80}")
    return name


def check_relative(path: str) -> str:
    """A file inside a pack: relative, forward slashes, no `..`, no hidden parts."""
    if not path or "\\" in path or "\0" in path or path.startswith("/"):
        raise PackRefused(f"not a pack file path: {path!r:.120}")
    parts = PurePosixPath(path).parts
    if not parts or any(p in ("", ".", "..") or p.startswith(".") for p in parts):
        raise PackRefused(f"not a pack file path: {path!r:.120}")
    return "/".join(parts)
