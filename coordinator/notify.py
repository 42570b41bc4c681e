"""Webhooks: a render submitted with `--notify URL` gets one POST of JSON when it ends (done, failed or
cancelled). The leader's thread finds finished renders, claims each webhook once (claim_notify.lua:
at most once, even across a failover) and posts it with a short timeout and a few tries."""

from __future__ import annotations

import json
import logging
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Protocol
from urllib.parse import urlsplit

from coordinator.leadership import PassLoop
from protos.states import TERMINAL, RenderState

log = logging.getLogger("farm.notify")
SCAN_RENDERS = 200  # the newest renders looked at each pass
INTERVAL_S = 1.0
TRIES = 3


class NotifyStore(Protocol):
    """The store calls the webhook loop makes: the newest renders, and the one-time claim to notify."""

    def list_renders(self, limit: int = 50) -> list[dict]: ...

    def claim_notify(self, render_id: str) -> bool: ...


def notify_url(spec: dict) -> str | None:
    """The spec's webhook when it is an http(s) URL (other schemes are never opened)."""
    url = spec.get("notify") if isinstance(spec, dict) else None
    return url if isinstance(url, str) and urlsplit(url).scheme in ("http", "https") else None


def payload(render: dict) -> dict:
    """What the webhook says: id, state, prompt, submitter, group, times, error, how to fetch."""
    spec = render.get("spec") if isinstance(render.get("spec"), dict) else {}
    started, finished = int(render.get("started_ms") or 0), int(render.get("finished_ms") or 0)
    return {"render_id": render["id"], "state": render.get("state"), "prompt": spec.get("prompt"),
            "submitter": spec.get("submitter"), "group": spec.get("group"), "error": render.get("error") or None,
            "seconds": (finished - started) / 1000.0 if started and finished else None,
            "fetch": f"farm fetch {render['id']} -o {render['id']}.mp4" if render.get("state") == RenderState.DONE else None}


def post(url: str, body: dict, timeout_s: float = 5.0) -> bool:
    data = json.dumps(body).encode()
    for attempt in range(TRIES):
        request = urllib.request.Request(url, data=data, method="POST",
                                         headers={"Content-Type": "application/json", "User-Agent": "ltx-farm"})
        try:
            with urllib.request.urlopen(request, timeout=timeout_s) as resp:  # noqa: S310 - http(s) only
                if resp.status < 300:
                    return True
        except (urllib.error.URLError, OSError, ValueError) as exc:
            log.warning("webhook %s for %s: %s (try %d/%d)", url, body["render_id"], exc, attempt + 1, TRIES)
        time.sleep(0.5 * 2**attempt)
    return False


def notify_finished(store: NotifyStore) -> int:
    """One pass: post the webhook of every newly finished render that asked for one; returns how many."""
    sent = 0
    for render in store.list_renders(SCAN_RENDERS):
        url = notify_url(render.get("spec") or {})
        if url and render.get("state") in TERMINAL and not render.get("notified_ms") \
                and store.claim_notify(render["id"]):
            sent += post(url, payload(render))
    return sent


class Notifier(PassLoop):
    """The leader's webhook loop until stop(); passes are skipped while `leading()` is false (a stopped or
    unsure coordinator sends nothing). A Redis blip or a bad URL only costs a pass."""

    def __init__(self, store: NotifyStore, leading: Callable[[], bool] = lambda: True, interval_s: float = INTERVAL_S) -> None:
        super().__init__("farm-notify", "webhooks", log, interval_s, leading)
        self.store = store

    def one_pass(self) -> None:
        notify_finished(self.store)
