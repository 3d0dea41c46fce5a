"""Name -> component registries filled by the registration hooks (mini-sglang style lazy factories).

A registration's value is either the object itself or a lazy ``"module:Attr"`` string that is imported on
the first ``get``, so registering never imports heavy code (Triton kernels, model files) and import
order between the core's modules does not matter.
"""

from __future__ import annotations

import importlib
import logging
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, fields
from types import MappingProxyType
from typing import Any, Generic, TypeVar

from brigade.plugins.errors import DuplicateNameError, PluginLoadError, UnknownNameError

logger = logging.getLogger(__name__)

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class PluginSource:
    """Who registered something: the plugin (entry-point name) and its distribution."""

    plugin: str
    distribution: str  # distribution name, e.g. "brigade-cuda"
    version: str

    def describe(self) -> str:
        return f"plugin {self.plugin!r} ({self.distribution} {self.version})"


@dataclass(frozen=True, slots=True)
class Registration:
    """One registered name. ``value`` is the object or a ``"module:Attr"`` string; ``extra`` holds
    per-registry options (the endpoints' ``required_tasks``)."""

    name: str
    value: Any
    source: PluginSource
    extra: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))


def parse_lazy_path(value: str) -> tuple[str, str]:
    """Split ``"package.module:Attr.sub"``; raises ValueError unless there is exactly one colon."""
    module, sep, attr = value.partition(":")
    if not sep or not module or not attr or ":" in attr:
        raise ValueError(f"lazy path {value!r} must look like 'package.module:Attr'")
    return module, attr


def import_lazy_path(value: str) -> Any:
    """Import ``"module:Attr"`` and return the attribute (dotted attributes are followed)."""
    module_name, attr = parse_lazy_path(value)
    obj: Any = importlib.import_module(module_name)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


class Registry(Generic[T]):
    """A mapping from names to components of one kind (attention backends, models, ...).

    Invariant: a name has one registration; a second one for the same name raises DuplicateNameError
    naming both distributions unless it passes ``override=True``. Resolved lazy values are cached.
    """

    def __init__(self, kind: str, *, callable_values: bool = False):
        """``callable_values``: every value must be a class or factory (or a lazy path to one); checked at
        registration, so a plugin that registers anything else fails at start-up with its name."""
        self.kind = kind  # human-readable, e.g. "attention backend"
        self.callable_values = callable_values
        self._entries: dict[str, Registration] = {}
        self._resolved: dict[str, T] = {}
        self._lock = threading.Lock()

    # ---- registration ---------------------------------------------------------------------------
    def check(self, name: str, value: Any, source: PluginSource, *, override: bool) -> None:
        """Validate one registration without storing it. Raises ValueError or DuplicateNameError."""
        if not isinstance(name, str) or not name:
            raise ValueError(f"{self.kind} name must be a non-empty string, got {name!r}")
        if isinstance(value, str):
            parse_lazy_path(value)
        elif value is None:
            raise ValueError(f"{self.kind} {name!r} registered with value None")
        elif self.callable_values and not callable(value):
            raise ValueError(f"{self.kind} {name!r} must be registered as a class or factory (or a "
                             f"'module:Attr' path to one), got {type(value).__name__} {value!r:.60}")
        existing = self._entries.get(name)
        if existing is not None and not override and existing.source != source:
            raise DuplicateNameError(
                f"{self.kind} {name!r} from {source.describe()} conflicts with the one from "
                f"{existing.source.describe()}; remove one of the two distributions, disable one with "
                f"BRIGADE_PLUGINS, or register with override=True to replace it on purpose")

    def add(self, name: str, value: Any, source: PluginSource, *, override: bool = False,
            **extra: Any) -> None:
        """Register ``name``. Raises as ``check`` does."""
        self.check(name, value, source, override=override)
        with self._lock:
            previous = self._entries.get(name)
            if previous is not None and previous.source != source:
                logger.info("%s %r from %s overrides the one from %s", self.kind, name, source.describe(),
                            previous.source.describe())
            self._entries[name] = Registration(name, value, source, MappingProxyType(dict(extra)))
            self._resolved.pop(name, None)

    def remove(self, name: str) -> None:
        """Forget ``name`` (no error when it is not registered): tests and scoped overrides only."""
        with self._lock:
            self._entries.pop(name, None)
            self._resolved.pop(name, None)

    # ---- lookup ---------------------------------------------------------------------------------
    def get(self, name: str) -> T:
        """The component registered as ``name``, importing a lazy path on first use.

        Raises:
            UnknownNameError: nobody registered ``name``; the message lists the installed names.
            PluginLoadError: the lazy path of ``name`` failed to import; the message names the plugin.
        """
        if name in self._resolved:
            return self._resolved[name]
        entry = self.entry(name)
        if not isinstance(entry.value, str):
            return entry.value
        try:
            obj = import_lazy_path(entry.value)
        except (ImportError, AttributeError) as exc:
            raise PluginLoadError(f"{self.kind} {name!r} from {entry.source.describe()} points at "
                                  f"{entry.value!r}, which failed to import: {type(exc).__name__}: {exc}") from exc
        with self._lock:
            self._resolved[name] = obj
        return obj

    def create(self, name: str, *args: Any, **kwargs: Any) -> Any:
        """Call the class or factory registered as ``name`` with these arguments (a plugin's stat logger,
        endpoint router...), naming the plugin when it fails.

        Raises:
            UnknownNameError, PluginLoadError: as ``get``; PluginLoadError also when the value is not
                callable or the call raises (the message names the plugin and the reason).
        """
        factory = self.get(name)
        source = self.entry(name).source
        if not callable(factory):
            raise PluginLoadError(f"{self.kind} {name!r} from {source.describe()} is a {type(factory).__name__}, "
                                  "not a class or factory")
        try:
            return factory(*args, **kwargs)
        except Exception as exc:
            raise PluginLoadError(f"{self.kind} {name!r} from {source.describe()} failed to start: "
                                  f"{type(exc).__name__}: {exc}") from exc

    def entry(self, name: str) -> Registration:
        """The registration record of ``name``; raises UnknownNameError listing installed names."""
        try:
            return self._entries[name]
        except KeyError:
            raise UnknownNameError(self.kind, name, self._entries) from None

    def names(self) -> list[str]:
        """Registered names, sorted."""
        return sorted(self._entries)

    def entries(self) -> list[Registration]:
        """Registration records, sorted by name."""
        return [self._entries[n] for n in self.names()]

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}, names={self.names()})"


@dataclass
class Registries:
    """Every registry of one process, one per registration hook (field name = hook name minus
    ``register_``)."""

    platforms: Registry = field(default_factory=lambda: Registry("platform"))
    attention_backends: Registry = field(default_factory=lambda: Registry("attention backend"))
    models: Registry = field(default_factory=lambda: Registry("model architecture"))
    quantization_methods: Registry = field(default_factory=lambda: Registry("quantization method"))
    kv_connectors: Registry = field(default_factory=lambda: Registry("KV connector"))
    io_processors: Registry = field(default_factory=lambda: Registry("IO processor"))
    endpoints: Registry = field(default_factory=lambda: Registry("endpoint", callable_values=True))
    stat_loggers: Registry = field(default_factory=lambda: Registry("stat logger", callable_values=True))
    logits_processors: Registry = field(default_factory=lambda: Registry("logits processor",
                                                                         callable_values=True))
    kernels: Registry = field(default_factory=lambda: Registry("kernel", callable_values=True))
    """Keyed ``"op@platform"`` (``brigade.plugins.kernels``); ``extra`` holds op, platform and label."""

    def for_hook(self, hook_name: str) -> Registry:
        """The registry a ``register_*`` hook fills."""
        return getattr(self, hook_name.removeprefix("register_"))

    def as_names(self) -> dict[str, list[str]]:
        """{registry field: sorted names}, for listings."""
        return {f.name: getattr(self, f.name).names() for f in fields(self)}
