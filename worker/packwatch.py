"""The worker notices packs that appear, change or disappear in its packs folder while it runs.

A pack copied or written into the folder by hand (`farm pack tiny DATA/packs/mine`, an rsync, a
`farm pack pull` on this Mac) is announced by registering again, so the coordinator leases its
renders here within seconds; a pack removed is dropped the same way. What is compared is a cheap
listing of the folder (every file's path, size and mtime, hidden entries such as the copy staging
left out), taken at most every SCAN_EVERY_S between leases. A change is announced once the listing
has stayed the same for one more scan: a pack still being written is not registered half-done.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

SCAN_EVERY_S = 0.5

Listing = tuple[tuple[str, int, int], ...]


def listing(packs_dir: Path) -> Listing:
    """(relative path, size, mtime_ns) of every file under the packs folder, links followed, sorted;
    entries whose name starts with '.' (the copy staging, manifests in progress) are skipped."""
    found: list[tuple[str, int, int]] = []
    if not packs_dir.is_dir():
        return ()
    for root, dirs, files in os.walk(packs_dir, followlinks=True):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        for name in files:
            if name.startswith("."):
                continue
            path = Path(root) / name
            try:
                stat = path.stat()
            except OSError:  # a link whose target is gone, a file removed as we walk
                continue
            found.append((str(path.relative_to(packs_dir)), stat.st_size, stat.st_mtime_ns))
    return tuple(sorted(found))


class PackWatch:
    """Compares the packs folder with what was last registered; `settled_change()` says when to register again."""

    def __init__(self, packs_dir: Path, every_s: float = SCAN_EVERY_S) -> None:
        self.packs_dir = Path(packs_dir)
        self.every_s = every_s
        self.registered: Listing = listing(self.packs_dir)
        self._seen: Listing = self.registered
        self._last_scan = time.monotonic()

    def mark_registered(self, seen: Listing) -> None:
        """`seen` (the listing taken before the capabilities were read) is what the coordinator was told."""
        self.registered = self._seen = seen
        self._last_scan = time.monotonic()

    def settled_change(self) -> bool:
        """True once the folder differs from the registered listing and held still for one scan."""
        if time.monotonic() - self._last_scan < self.every_s:
            return False
        self._last_scan = time.monotonic()
        now = listing(self.packs_dir)
        settled = now == self._seen
        self._seen = now
        return settled and now != self.registered
