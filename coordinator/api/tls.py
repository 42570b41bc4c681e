"""The farm's CA and the coordinator's server certificate, created once in DATA/tls.

Coordinators sharing a data folder (leader + standbys) share one CA and one server certificate, so
one join token works for all of them. The folder is built aside and renamed into place, so two
coordinators starting at once end up with the same CA (the loser of the rename drops its own).
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import shutil
import socket
import tempfile
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from protos.auth import SERVER_NAME, cert_fingerprint

TLS_DIR = "tls"
CA_YEARS = 20
SERVER_YEARS = 10


@dataclass(frozen=True)
class FarmTLS:
    """What the server needs (key, chain) and what the join token pins (the CA's fingerprint)."""

    server_key_pem: bytes
    chain_pem: bytes  # server certificate followed by the CA: clients take the CA from the handshake
    ca_pem: bytes
    fingerprint: str


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "ltx-farm"),
                      x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _alt_names() -> list[x509.GeneralName]:
    """SERVER_NAME (what clients check) plus the names this machine is known by, for other tools."""
    host = socket.gethostname()
    names: list[x509.GeneralName] = [x509.DNSName(n) for n in dict.fromkeys(
        [SERVER_NAME, "localhost", host, host.split(".")[0] + ".local"]) if n]
    names += [x509.IPAddress(ipaddress.ip_address(a)) for a in ("127.0.0.1", "::1")]
    return names


def _issue(years: int) -> tuple[datetime.datetime, datetime.datetime]:
    now = datetime.datetime.now(datetime.UTC)
    return now - datetime.timedelta(days=1), now + datetime.timedelta(days=365 * years)


def _build(folder: Path) -> None:
    ca_key = ec.generate_private_key(ec.SECP256R1())
    start, end = _issue(CA_YEARS)
    ca = (x509.CertificateBuilder().subject_name(_name("ltx-farm CA")).issuer_name(_name("ltx-farm CA"))
          .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
          .not_valid_before(start).not_valid_after(end)
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    start, end = _issue(SERVER_YEARS)
    server = (x509.CertificateBuilder().subject_name(_name(SERVER_NAME)).issuer_name(ca.subject)
              .public_key(key.public_key()).serial_number(x509.random_serial_number())
              .not_valid_before(start).not_valid_after(end)
              .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
              .add_extension(x509.SubjectAlternativeName(_alt_names()), critical=False)
              .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
              .sign(ca_key, hashes.SHA256()))
    pem = serialization.Encoding.PEM
    for name, data, mode in (("ca.key", _key_pem(ca_key), 0o600), ("ca.pem", ca.public_bytes(pem), 0o644),
                             ("server.key", _key_pem(key), 0o600), ("server.pem", server.public_bytes(pem), 0o644)):
        fd = os.open(folder / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
        with os.fdopen(fd, "wb") as f:
            f.write(data)


def load_or_create_tls(data_dir: Path) -> FarmTLS:
    """DATA/tls's CA and server certificate, made on first start."""
    data_dir = Path(data_dir)
    folder = data_dir / TLS_DIR
    if not (folder / "server.pem").is_file():
        data_dir.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=".tls-", dir=data_dir))
        try:
            os.chmod(staging, 0o700)
            _build(staging)
            os.rename(staging, folder)  # fails when another coordinator got there first: use theirs
        except OSError:
            if not (folder / "server.pem").is_file():
                raise
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    ca_pem = (folder / "ca.pem").read_bytes()
    der = x509.load_pem_x509_certificate(ca_pem).public_bytes(serialization.Encoding.DER)
    return FarmTLS(server_key_pem=(folder / "server.key").read_bytes(),
                   chain_pem=(folder / "server.pem").read_bytes() + ca_pem,
                   ca_pem=ca_pem, fingerprint=cert_fingerprint(der))
