"""What the serving tests share as fixtures: no token from the shell, a certificate made here."""

from __future__ import annotations

import ssl
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import trustme

from aenvs._serving.auth import TOKEN_ENV


@pytest.fixture(autouse=True)
def no_token_in_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """The tests run with no token in the environment, whatever the shell running them has:
    a test that wants one passes it, or sets AENVS_SERVE_TOKEN itself."""
    monkeypatch.delenv(TOKEN_ENV, raising=False)


@dataclass
class Certificate:
    """A test bench's TLS: a certificate for 127.0.0.1 and localhost, signed by a throwaway
    authority, as contexts and as PEM files."""

    server: ssl.SSLContext  # holds the certificate and its key
    client: ssl.SSLContext  # trusts the authority that signed it
    certfile: Path
    keyfile: Path
    cafile: Path


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Certificate]:
    authority = trustme.CA()
    issued = authority.issue_cert("127.0.0.1", "localhost")
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    issued.configure_cert(server)
    client = ssl.create_default_context()
    authority.configure_trust(client)
    folder = tmp_path_factory.mktemp("tls")
    certfile, keyfile, cafile = folder / "cert.pem", folder / "key.pem", folder / "ca.pem"
    certfile.write_bytes(b"".join(blob.bytes() for blob in issued.cert_chain_pems))
    issued.private_key_pem.write_to_path(str(keyfile))
    authority.cert_pem.write_to_path(str(cafile))
    yield Certificate(server, client, certfile, keyfile, cafile)
