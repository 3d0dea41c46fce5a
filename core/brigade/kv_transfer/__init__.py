"""KV transfer between instances: the connector contract and its lookup in the plugin registry.

Connectors come from plugins (``register_kv_connectors``); the core only knows ``KVConnectorBase``. The engine
core makes the scheduler-role instance, each model runner the worker-role one, both by the name given in
``--kv-transfer-config``.
"""

from __future__ import annotations

from brigade.config import ConfigError, KVTransferConfig
from brigade.kv_transfer.base import KVCacheLayout, KVConnectorBase, KVConnectorRole
from brigade.kv_transfer.keys import extend_block_keys
from brigade.kv_transfer.prompt_blocks import PromptBlocks


def get_connector_class(config: KVTransferConfig) -> type[KVConnectorBase]:
    """The connector class registered under ``config.kv_connector`` (plugins are loaded first if needed).

    Raises:
        ConfigError: no installed plugin registered that name, or it is not a ``KVConnectorBase`` subclass
            (one line naming the installed connectors, or the plugin).
        PluginLoadError: the registered lazy path failed to import (names the plugin).
    """
    from brigade.plugins import load_plugins, registries, unavailable_message

    load_plugins("engine")
    connectors = registries.kv_connectors
    name = config.kv_connector
    if name not in connectors:
        raise ConfigError(unavailable_message("--kv-transfer-config kv_connector", name, connectors.names()))
    cls = connectors.get(name)
    if not (isinstance(cls, type) and issubclass(cls, KVConnectorBase)):
        raise ConfigError(f"KV connector {name!r} from {connectors.entry(name).source.describe()} is not a "
                          "subclass of brigade.kv_transfer.KVConnectorBase")
    return cls


def check_kv_transfer_config(config: KVTransferConfig | None) -> None:
    """Refuse, in one line and before anything loads, a ``--kv-transfer-config`` whose connector no installed
    plugin registers or whose ``kv_connector_extra_config`` the connector refuses (``KVConnectorBase.check_config``).
    Nothing to check without one.

    Raises:
        ConfigError, PluginLoadError: as ``get_connector_class``, or from the connector's ``check_config``.
    """
    if config is not None:
        get_connector_class(config).check_config(config)


def make_kv_connector(config: KVTransferConfig, role: KVConnectorRole, layout: KVCacheLayout) -> KVConnectorBase:
    """Instantiate the configured connector for ``role``.

    Raises:
        ConfigError, PluginLoadError: as ``get_connector_class``; PluginLoadError also when the constructor raises
            (the message names the plugin and the reason).
    """
    from brigade.plugins import registries

    get_connector_class(config)
    return registries.kv_connectors.create(config.kv_connector, config, role, layout)


__all__ = ["KVCacheLayout", "KVConnectorBase", "KVConnectorRole", "PromptBlocks",
           "check_kv_transfer_config", "extend_block_keys", "get_connector_class", "make_kv_connector"]
