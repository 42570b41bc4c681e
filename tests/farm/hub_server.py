"""A real HTTP server on 127.0.0.1 that answers the few Hugging Face hub endpoints `snapshot_download`
uses, serving a local folder as one repo, so `farm pack pull REPO` runs its real download path in
tests (HF_ENDPOINT points here). It records every file it sends, so a test can check what was asked.
A gated repo is refused as the hub refuses one whose licence the caller has not accepted: 401 without
a token, 403 with one, `X-Error-Code: GatedRepo` on every endpoint.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlparse

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def _files(root: Path) -> list[str]:
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())


class _Hub(BaseHTTPRequestHandler):
    root: Path
    repo: str
    sent: list[str]
    gated: bool = False

    def log_message(self, *args) -> None:  # quiet test output
        pass

    def _json(self, value: object) -> None:
        body = json.dumps(value).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _refuse_gated(self) -> bool:
        """The hub's answer to a gated repo: 401 (no token) or 403 (a token whose user did not accept)."""
        path = urlparse(self.path).path
        if not self.gated or not path.startswith((f"/api/models/{self.repo}/", f"/{self.repo}/resolve/")):
            return False
        body = json.dumps({"error": f"Access to model {self.repo} is restricted and you are not in the "
                                    "authorized list. Visit the repo page to ask for access."}).encode()
        self.send_response(403 if self.headers.get("Authorization") else 401)
        self.send_header("X-Error-Code", "GatedRepo")
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
        return True

    def _api(self, path: str) -> None:
        base = f"/api/models/{self.repo}/"
        if path == base + "auth-check":
            return self._json({})
        if path.startswith(base + "revision/"):
            siblings = [{"rfilename": f} for f in _files(self.root)]
            return self._json({"id": self.repo, "sha": COMMIT, "siblings": siblings, "private": False})
        if path.startswith(base + "tree/"):
            entries = [{"type": "file", "path": f, "size": (self.root / f).stat().st_size,
                        "oid": hashlib.sha1((self.root / f).read_bytes()).hexdigest()} for f in _files(self.root)]
            return self._json(entries)
        self.send_error(404)

    def _resolve(self, path: str, body: bool) -> None:
        prefix = f"/{self.repo}/resolve/"
        rel = unquote(path[len(prefix):]).split("/", 1)[1]
        file = self.root / rel
        if ".." in rel.split("/") or not file.is_file():
            self.send_error(404)
            return
        data = file.read_bytes()
        start = 0
        ranged = self.headers.get("Range", "")
        if ranged.startswith("bytes="):
            start = int(ranged[6:].split("-")[0] or 0)
        self.send_response(206 if start else 200)
        self.send_header("X-Repo-Commit", COMMIT)
        self.send_header("ETag", f'"{hashlib.sha256(data).hexdigest()}"')
        self.send_header("Content-Length", str(len(data) - start))
        if start:
            self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        self.end_headers()
        if body:
            self.sent.append(rel)
            self.wfile.write(data[start:])

    def do_HEAD(self) -> None:
        path = urlparse(self.path).path
        if self._refuse_gated():
            return
        if path.startswith(f"/{self.repo}/resolve/"):
            self._resolve(path, body=False)
        else:
            self.send_error(404)

    def do_GET(self) -> None:
        path = urlparse(self.path).path
        if self._refuse_gated():
            return
        if path.startswith("/api/models/"):
            self._api(path)
        elif path.startswith(f"/{self.repo}/resolve/"):
            self._resolve(path, body=True)
        else:
            self.send_error(404)


@contextmanager
def _serving(handler: type) -> Iterator[str]:
    """The endpoint URL of a threaded HTTP server on 127.0.0.1 running `handler`, until the block ends."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@contextmanager
def serve_repo(root: Path, repo: str, gated: bool = False) -> Iterator[tuple[str, list[str]]]:
    """(endpoint URL, list of files sent) for a hub serving `root` as `repo` (gated: refused to anyone,
    as to a user who has not accepted its licence), until the block ends."""
    sent: list[str] = []
    handler = type("Hub", (_Hub,), {"root": Path(root), "repo": repo, "sent": sent, "gated": gated})
    with _serving(handler) as url:
        yield url, sent


class _Hubs(_Hub):
    """Several repos on one endpoint: each request is answered by the repo its path names."""

    repos: dict[str, Path]

    def _pick(self) -> None:
        path = urlparse(self.path).path
        for repo, root in self.repos.items():
            if path.startswith((f"/api/models/{repo}/", f"/{repo}/resolve/")):
                self.repo, self.root = repo, Path(root)

    def do_HEAD(self) -> None:
        self._pick()
        super().do_HEAD()

    def do_GET(self) -> None:
        self._pick()
        super().do_GET()


@contextmanager
def serve_repos(repos: dict[str, Path]) -> Iterator[tuple[str, list[str]]]:
    """(endpoint URL, files sent) for a hub serving each folder as its repo id."""
    sent: list[str] = []
    handler = type("Hubs", (_Hubs,), {"repos": dict(repos), "repo": "", "root": Path("."), "sent": sent})
    with _serving(handler) as url:
        yield url, sent
