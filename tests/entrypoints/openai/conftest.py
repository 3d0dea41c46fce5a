"""Fixtures of the OpenAI-server tests: one ``brigade serve`` (``shared_server.start_server``) for the whole run,
per pytest-xdist worker, with the official client and an httpx client on it. The files that only send requests
share it; a file that needs other flags defines its own ``server`` (and ``client``/``http``) fixtures."""

from __future__ import annotations

import httpx
import pytest
from shared_server import start_server


@pytest.fixture(scope="session")
def server(smollm2_path):
    srv = start_server(smollm2_path)
    yield srv
    srv.stop()


@pytest.fixture(scope="session")
def client(server):
    return server.openai_client()


@pytest.fixture(scope="session")
def http(server):
    with httpx.Client(base_url=server.base_url, timeout=120) as c:
        yield c
