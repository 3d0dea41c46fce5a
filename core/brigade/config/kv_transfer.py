"""KVTransferConfig: the KV connector, its role and its extra settings."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from brigade.config.errors import ConfigError


@dataclass
class KVTransferConfig:
    """--kv-transfer-config: which KV connector plugin moves KV blocks between instances."""

    kv_connector: str
    kv_role: str = "kv_both"
    kv_connector_extra_config: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.kv_role not in ("kv_producer", "kv_consumer", "kv_both"):
            raise ConfigError(f"kv_role {self.kv_role!r} is not known; use kv_producer, kv_consumer or kv_both")
