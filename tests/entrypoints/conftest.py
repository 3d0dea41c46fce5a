"""Fixtures of the entrypoint tests. Being a conftest of this folder, it also puts the folder on ``sys.path``,
so the tests of ``cli/`` and ``openai/`` import the helpers here (``remote_server``, ``cli_runner``,
``fake_engine``)."""
