"""`farm dashboard`: open the coordinator's dashboard in the browser, logged in.

Why: the dashboard wants the farm token, a 100-character string nobody should have to find and paste.
As Jupyter does, the link carries the secret in its query; the dashboard trades it for the session
cookie at once and redirects to the clean URL (coordinator/dashboard/app.py `link_login`).
"""

from __future__ import annotations

import webbrowser
from typing import Annotated

import typer

from farm_cli.options import Coordinator, Token
from farm_cli.session import fail
from protos.defaults import DASHBOARD_PORT


def dashboard_address(coordinator: str, url: str | None) -> tuple[str, int]:
    """The dashboard's host and port: --url's, else the (first) coordinator's host on the dashboard port."""
    from urllib.parse import urlsplit

    if url:
        parts = urlsplit(url if "//" in url else f"//{url}")
        if not parts.hostname:
            fail(f"--url {url!r}: give the dashboard's address, e.g. http://studio.local:{DASHBOARD_PORT}/")
        return parts.hostname, parts.port or DASHBOARD_PORT
    host = coordinator.split(",")[0].rsplit(":", 1)[0].strip("[]") or "127.0.0.1"
    return host, DASHBOARD_PORT


def dashboard(url: Annotated[str | None, typer.Option(
                  "--url", help=f"The dashboard's address (default: the coordinator's host, port {DASHBOARD_PORT}).")] = None,
              no_open: Annotated[bool, typer.Option("--no-open", help="Print the link only.")] = False,
              *, coordinator: Coordinator, token: Token = None) -> None:
    """Open the dashboard logged in (the link carries the farm token; it is traded for a cookie at once)."""
    from coordinator.dashboard.security import login_url
    from farm_cli.config import local_token

    secret = token or local_token()
    if not secret:
        fail("no farm token to log in with: give --token-file (a copy of the coordinator's DATA/token)")
    link = login_url(*dashboard_address(coordinator, url), secret)
    typer.echo(link)
    if not no_open and not webbrowser.open(link):
        typer.echo("no browser to open here: open the link above", err=True)
