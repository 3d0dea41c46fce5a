"""MODEL as a user gives it: a local HF-format directory, or a model hub id (``org/name``) fetched into the cache.

A hub id is downloaded with ``huggingface_hub.snapshot_download`` into the Hugging Face cache (``$HF_HOME``, by
default ``~/.cache/huggingface``), with its progress bars, as vLLM does; only the files an engine reads are
fetched. Offline (``HF_HUB_OFFLINE=1``) a hub id is taken from that cache if it is there, else refused in one line
that says how to fetch it elsewhere. This module imports nothing heavy until a hub id needs it.
"""

from __future__ import annotations

import os
import re
import sys

from brigade.config import ConfigError

__all__ = ["HUB_FILE_PATTERNS", "is_hub_id", "resolve_model"]

HUB_FILE_PATTERNS = ["*.json", "*.safetensors", "*.jinja", "*.model", "*.txt", "*.tiktoken", "1_Pooling/*"]
"""What a download fetches: configs, weights, tokenizer and chat-template files (no .bin, .pt, .gguf copies)."""

_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?")


def is_hub_id(model: str) -> bool:
    """Whether ``model`` reads as a hub id (``name`` or ``org/name``) rather than a path (``./x``, ``/x``, ``~/x``,
    ``a/b/c``)."""
    return _HUB_ID.fullmatch(model) is not None and not model.endswith((".", "-"))


def resolve_model(model: str) -> tuple[str, str | None]:
    """The local directory of ``model`` and, when it was a hub id, that id.

    Returns:
        (path, hub_id): ``model`` itself when it exists on disk (hub_id None); for a hub id, its snapshot folder
        in the Hugging Face cache (downloaded first when the hub is reachable) and the id.
    Raises:
        ConfigError: one line: a directory without ``config.json`` ("not a model directory"), a path that does not
            exist, a hub id that is not on the hub, or one that cannot be fetched (offline, or the network fails),
            saying how to fetch it (``hf download ID --local-dir DIR``).
    """
    if os.path.exists(model):
        if os.path.isdir(model) and not os.path.isfile(os.path.join(model, "config.json")):
            raise ConfigError(f"MODEL {model!r} is not a model directory: it has no config.json; pass an HF-format "
                              "directory (config.json, *.safetensors, tokenizer.json) or a hub id such as "
                              "HuggingFaceTB/SmolLM2-135M-Instruct")
        return model, None
    if not is_hub_id(model):
        raise ConfigError(f"MODEL {model!r} does not exist; pass a local HF-format directory (config.json, "
                          "*.safetensors, tokenizer.json) or a hub id such as HuggingFaceTB/SmolLM2-135M-Instruct")
    return _fetch(model), model


def _fetch(repo_id: str) -> str:
    """``repo_id``'s snapshot folder: from the cache when offline or when the hub cannot be reached, else
    downloaded (or brought up to date) into it."""
    from huggingface_hub import constants, model_info, snapshot_download
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError

    how = (f"fetch it where the hub is reachable (hf download {repo_id} --local-dir DIR) and pass DIR as MODEL; "
           "docs/setup.md shows how")
    if constants.HF_HUB_OFFLINE:
        return _cached(repo_id, f"MODEL {repo_id!r} is not a local directory, nor in the hub cache, and "
                                f"HF_HUB_OFFLINE=1 forbids downloading it; {how}")
    try:
        model_info(repo_id, timeout=10)  # one request first: a refusal is one line, before any progress bar
    except GatedRepoError:
        raise ConfigError(f"MODEL {repo_id!r} is gated on the hub: accept its terms on its page, log in "
                          f"(hf auth login) or set HF_TOKEN, then try again; or {how}") from None
    except RepositoryNotFoundError:
        raise ConfigError(f"MODEL {repo_id!r} is neither a local directory nor a model on the hub "
                          f"({constants.ENDPOINT}); check the spelling, or pass a local HF-format directory") from None
    except Exception as exc:  # noqa: BLE001 - the network, a proxy, a certificate: the cache may still have it
        return _cached(repo_id, f"MODEL {repo_id!r} is not a local directory, and the hub at {constants.ENDPOINT} "
                                f"cannot be reached ({_root_cause(exc)}); {how}")
    print(f"MODEL {repo_id!r} is not a local directory: fetching it from {constants.ENDPOINT} into "
          f"{constants.HF_HUB_CACHE}", file=sys.stderr, flush=True)
    try:
        return snapshot_download(repo_id, allow_patterns=HUB_FILE_PATTERNS)
    except Exception as exc:  # noqa: BLE001 - a dropped connection, a full disk: one line with the reason
        raise ConfigError(f"MODEL {repo_id!r} could not be downloaded ({_root_cause(exc)}); {how}") from None


def _cached(repo_id: str, refusal: str) -> str:
    """``repo_id``'s snapshot already in the cache. Raises ConfigError(``refusal``) when there is none."""
    from huggingface_hub import snapshot_download

    try:
        return snapshot_download(repo_id, allow_patterns=HUB_FILE_PATTERNS, local_files_only=True)
    except Exception:  # noqa: BLE001 - any cache miss reads the same to the user
        raise ConfigError(refusal) from None


def _root_cause(exc: BaseException) -> str:
    """``Type: message`` of the innermost exception behind ``exc`` (a ConnectError behind the hub client's)."""
    while exc.__cause__ is not None or exc.__context__ is not None:
        exc = exc.__cause__ or exc.__context__
    text = " ".join(str(exc).split())[:160]
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
