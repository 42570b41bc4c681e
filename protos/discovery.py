"""Finding a farm on the LAN by DNS-SD over multicast DNS (Bonjour), so a second Mac joins with the
token alone.

The coordinator announces `_ltx-farm._tcp` with its gRPC port, its addresses and, in the TXT record,
the sha256 of its CA (the join token's fingerprint; public, it identifies the farm and opens nothing).
`farm join` browses, keeps the farms whose fingerprint is its token's, and only then dials them: the
TLS handshake pins the CA as every other client does, so an impostor that copies the TXT record
gains nothing. zeroconf (python-zeroconf) is imported lazily: a coordinator without it still serves,
it only is not announced.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import socket
import threading
import time
from dataclasses import dataclass
from typing import Any

SERVICE_TYPE = "_ltx-farm._tcp.local."
ANNOUNCE_ENV = "FARM_ANNOUNCE"  # "0": do not announce (tests that need no LAN presence)
FP_KEY = "fp"

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Farm:
    """One announcement seen on the LAN: its instance name, CA fingerprint and gRPC addresses."""

    name: str
    fingerprint: str
    addresses: tuple[str, ...]  # "HOST:PORT", in the order announced


def announce_wanted(env: dict[str, str] | None = None) -> bool:
    """On unless FARM_ANNOUNCE is 0/false/no/off."""
    value = (os.environ if env is None else env).get(ANNOUNCE_ENV, "1").strip().lower()
    return value not in ("0", "false", "no", "off")


def zeroconf_missing() -> str:
    """Why this Python cannot use mDNS ('' when it can)."""
    try:
        import zeroconf  # noqa: F401
    except ImportError:
        return "python-zeroconf is not installed (pip install zeroconf)"
    return ""


def announced_ips(host: str) -> list[str]:
    """The addresses to announce for a server bound to `host`: that address, or for a wildcard bind
    every IPv4 address of this machine (loopback last, so a LAN peer tries a reachable one first)."""
    if host not in ("0.0.0.0", "::", ""):
        return [socket.gethostbyname(host)]
    import ifaddr

    found = {ip.ip for adapter in ifaddr.get_adapters() for ip in adapter.ips if isinstance(ip.ip, str)}
    return sorted(found, key=lambda ip: (ipaddress.ip_address(ip).is_loopback, ip))


class Announcement:
    """The coordinator's DNS-SD record, registered until close(). Registering probes the name for
    ~2 s first (RFC 6762), so it runs in a thread: the coordinator serves meanwhile."""

    def __init__(self, host: str, port: int, fingerprint: str) -> None:
        from zeroconf import InterfaceChoice, IPVersion, ServiceInfo, Zeroconf

        ips = announced_ips(host)
        label = f"{socket.gethostname().split('.')[0]}-{fingerprint[:8]}-{port}"
        self._zc = Zeroconf(interfaces=InterfaceChoice.All, ip_version=IPVersion.V4Only)
        self._info = ServiceInfo(SERVICE_TYPE, f"ltx-farm {label}.{SERVICE_TYPE}",
                                 addresses=[socket.inet_aton(ip) for ip in ips], port=port,
                                 properties={FP_KEY: fingerprint}, server=f"ltx-farm-{label}.local.")
        self.addresses = [f"{ip}:{port}" for ip in ips]
        self._registered = False
        self._thread = threading.Thread(target=self._register, name="mdns-announce", daemon=True)
        self._thread.start()

    def _register(self) -> None:
        try:
            self._zc.register_service(self._info, allow_name_change=True)
        except Exception as exc:  # noqa: BLE001 - a LAN without multicast must never stop the coordinator
            log.warning("not announced on the LAN (farm join cannot find it): %s", exc)
            return
        self._registered = True
        log.info("announced on the LAN as %s at %s", SERVICE_TYPE, ", ".join(self.addresses))

    def close(self) -> None:
        self._thread.join(timeout=10)
        try:
            if self._registered:
                self._zc.unregister_service(self._info)
        finally:
            self._zc.close()


def announce(host: str, port: int, fingerprint: str) -> Announcement | None:
    """Announce the farm unless FARM_ANNOUNCE=0; None (one log line) when mDNS is not available here,
    which never stops the coordinator: workers can still be given --coordinator."""
    if not announce_wanted() or not fingerprint:
        return None
    missing = zeroconf_missing()
    if missing:
        log.warning("not announced on the LAN (farm join cannot find it): %s", missing)
        return None
    try:
        return Announcement(host, port, fingerprint)
    except (OSError, ValueError, RuntimeError) as exc:  # no multicast socket, a name that does not resolve
        log.warning("not announced on the LAN (farm join cannot find it): %s", exc)
        return None


def browse(seconds: float) -> list[Farm]:
    """Every farm that answers a DNS-SD query within `seconds` (resolved: fingerprint and addresses)."""
    from zeroconf import InterfaceChoice, IPVersion, ServiceBrowser, ServiceStateChange, Zeroconf

    zc = Zeroconf(interfaces=InterfaceChoice.All, ip_version=IPVersion.V4Only)
    names: list[str] = []
    lock = threading.Lock()

    def seen(zeroconf: Any, service_type: str, name: str, state_change: ServiceStateChange) -> None:
        if state_change is ServiceStateChange.Added:
            with lock:
                names.append(name)

    try:
        browser = ServiceBrowser(zc, SERVICE_TYPE, handlers=[seen])
        time.sleep(seconds)
        browser.cancel()
        with lock:
            wanted = list(dict.fromkeys(names))
        return [farm for farm in (_resolve(zc, name) for name in wanted) if farm is not None]
    finally:
        zc.close()


def _resolve(zc: Any, name: str) -> Farm | None:
    info = zc.get_service_info(SERVICE_TYPE, name, timeout=3000)
    if info is None or not info.port:
        return None
    fingerprint = (info.properties.get(FP_KEY.encode()) or b"").decode(errors="replace").lower()
    addresses = tuple(f"{ip}:{info.port}" for ip in info.parsed_addresses())
    return Farm(name, fingerprint, addresses)
