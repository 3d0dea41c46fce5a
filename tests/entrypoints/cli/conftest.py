"""Fixtures of the command-line tests: one ``brigade serve`` for the whole run (per pytest-xdist worker), shared by
the files that only talk to it (``brigade chat``, ``bench serve``, the stats log, /docs)."""

from __future__ import annotations

import pytest
from cli_server import start_server


@pytest.fixture(scope="session")
def server(smollm2_path):
    srv = start_server(smollm2_path)
    yield srv
    srv.stop()
