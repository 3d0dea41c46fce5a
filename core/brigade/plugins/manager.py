"""The plugin manager: discovers entry points, applies the allowlists, registers plugins with pluggy and
fills the registries, once per process.

Loading is idempotent and re-entrant: each group is marked loaded *before* its plugins load (so a
failure is not retried and a plugin that calls back into ``load`` does not recurse), and a lock guards
concurrent callers. A ``fork``ed child inherits the loaded state, which is correct because the same
modules are in its memory; a ``spawn``ed child starts empty and calls ``load`` itself.
"""

from __future__ import annotations

import importlib
import logging
import threading
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

import pluggy

from brigade.plugins import hookspecs
from brigade.plugins.errors import HookspecVersionError, PluginLoadError
from brigade.plugins.groups import (ALL_GROUPS, BUILTIN_PLUGIN, CORE_DISTRIBUTION, GENERAL, SCOPES, PluginGroup,
                                    discover, distribution_of)
from brigade.plugins.kernels import check_kernel, kernel_key, kernel_label
from brigade.plugins.platform_choice import PlatformChoice, choose_platform, unknown_platform_error
from brigade.plugins.records import PluginRecord, PluginStatus
from brigade.plugins.registry import PluginSource, Registration, Registries
from brigade.plugins.settings import ENDPOINT_PLUGINS_ENV, PLUGINS_ENV, STRICT_ENV, PluginSettings

if TYPE_CHECKING:
    from brigade.platforms.interface import Platform

logger = logging.getLogger("brigade.plugins")

SERVER_ONLY_NOTICE = "brigade_server_only"  # log-record attribute: a notice that concerns a server only

BUILTIN_MODULE = "brigade.plugins.builtin"

_Staged = list[tuple[str, str, Any, bool, dict[str, Any]]]  # (hook, name, value, override, extra)


def _quoted(names: Iterable[str]) -> str:
    return ", ".join(map(repr, names))


def _kind(group: PluginGroup) -> str:
    """A group's short name with its article, for messages: "brigade.io_processor_plugins" -> "an io_processor"."""
    kind = group.name.removeprefix("brigade.").removesuffix("_plugins")
    return f"{'an' if kind[:1] in 'aeiou' else 'a'} {kind}"


def _core_source() -> PluginSource:
    from brigade.version import __version__

    return PluginSource(BUILTIN_PLUGIN, CORE_DISTRIBUTION, __version__)


class PluginManager:
    """Owns one process's pluggy manager, registries, plugin records and platform choice."""

    def __init__(self) -> None:
        self._pm = pluggy.PluginManager(hookspecs.PROJECT_NAME)
        self._pm.add_hookspecs(hookspecs)
        self.registries = Registries()
        self.core_source = _core_source()
        self._records: dict[tuple[str, str, str], PluginRecord] = {}  # (group, distribution, name)
        self._loaded_groups: set[str] = set()
        self._settings: PluginSettings | None = None
        self._platform: PlatformChoice | None = None
        self._resolving = False
        self._lock = threading.RLock()

    # ---- public API -------------------------------------------------------------------------------
    @property
    def settings(self) -> PluginSettings:
        """The environment's controls, read on first use in this process."""
        if self._settings is None:
            self._settings = PluginSettings.from_env()
        return self._settings

    def load(self, scope: str = "engine") -> None:
        """Load every group of ``scope`` ("engine": general + platform; "api": all five groups).

        Idempotent per process. Raises PluginLoadError for fatal failures (strict mode, or a plugin the
        operator named), ValueError for an unknown scope.
        """
        if scope not in SCOPES:
            raise ValueError(f"unknown plugin scope {scope!r}; use one of {', '.join(SCOPES)}")
        with self._lock:
            if GENERAL.name not in self._loaded_groups:
                self._check_allowlist_names()
            new_groups = [group for group in SCOPES[scope] if group.name not in self._loaded_groups]
            for group in new_groups:
                self._load_group(group)
            if new_groups:
                logger.info("%s", self.summary(), extra={SERVER_ONLY_NOTICE: True})

    def summary(self) -> str:
        """One line on the plugins loaded so far: their names, those that failed, and the endpoint plugins left
        disabled by default (``brigade plugins`` lists each with its reason)."""
        loaded = [r.name for r in self._records.values()
                  if r.status is PluginStatus.LOADED and r.name != BUILTIN_PLUGIN]
        failed = [r.name for r in self._records.values() if r.status is PluginStatus.FAILED]
        parts = [f"plugins: {len(loaded)} loaded" + (f" ({', '.join(loaded)})" if loaded else "")]
        if failed:
            parts.append(f"{len(failed)} failed ({', '.join(failed)})")
        denied = [r.name for r in self._records.values()
                  if r.status is PluginStatus.DISABLED and r.group in self._endpoint_groups()
                  and self.settings.endpoint_allowlist is None]
        if denied:
            parts.append(f"endpoint plugins off by default: {', '.join(denied)} ({ENDPOINT_PLUGINS_ENV}=name "
                         "enables one)")
        return "; ".join(parts) + "; `brigade plugins` lists them"

    @staticmethod
    def _endpoint_groups() -> set[str]:
        return {g.name for g in ALL_GROUPS if g.endpoint}

    def current_platform(self) -> type[Platform]:
        """The platform class of this process, resolved on first call (loads the engine scope first)."""
        return self.platform_choice().platform_cls

    def check_forced_platform(self) -> None:
        """Refuse a BRIGADE_PLATFORM that no loaded plugin registers, without running any detector (for the
        CLI, before it binds a port or starts an engine). Raises PluginLoadError naming what is installed."""
        forced = self.settings.platform
        self.load("engine")
        names = self.registries.platforms.names()
        if forced is not None and forced not in names:
            raise unknown_platform_error(forced, names)

    def platform_choice(self) -> PlatformChoice:
        """The platform, its plugin and why it was chosen. Raises PluginLoadError when none can be."""
        with self._lock:
            if self._platform is not None:
                return self._platform
            if self._resolving:
                raise PluginLoadError("current_platform() was called from inside platform detection; "
                                      "detectors must not ask for the current platform")
            self.load("engine")
            self._resolving = True
            try:
                self._platform = choose_platform(self.registries, self.settings, core_source=self.core_source,
                                                 report_failure=self._report_failure,
                                                 mark=self._mark_platform)
            finally:
                self._resolving = False
            for record in self._records.values():
                if record.status is PluginStatus.LOADED and set(record.platforms.values()) == {"not detected"}:
                    record.status = PluginStatus.NOT_DETECTED
            logger.info("platform %s: %s", self._platform.name, self._platform.reason)
            return self._platform

    def records(self) -> list[PluginRecord]:
        """Every plugin seen in this process, in load order."""
        return list(self._records.values())

    def loaded_groups(self) -> set[str]:
        return set(self._loaded_groups)

    def select_endpoints(self, supported_tasks: Iterable[str]) -> list[Registration]:
        """Endpoint registrations whose ``required_tasks`` is None or meets ``supported_tasks``.

        Skipped ones are logged at WARNING (the operator enabled them, so dropping them must be visible)
        and noted on their plugin's record.
        """
        tasks = set(supported_tasks)
        chosen = []
        for entry in self.registries.endpoints.entries():
            required = entry.extra.get("required_tasks")
            if required is None or tasks.intersection(required):
                chosen.append(entry)
                continue
            note = (f"endpoint {entry.name!r} skipped: requires tasks {sorted(required)}, "
                    f"server supports {sorted(tasks)}")
            logger.warning("%s (%s)", note, entry.source.describe())
            for record in self._records.values():
                if record.source == entry.source:
                    record.reason = note
        return chosen

    # ---- loading ----------------------------------------------------------------------------------
    def excluded_by_allowlist(self) -> list[PluginRecord]:
        """The installed plugins (endpoint plugins aside) that BRIGADE_PLUGINS kept from loading so far."""
        if self.settings.allowlist is None:
            return []
        endpoint_groups = {g.name for g in ALL_GROUPS if g.endpoint}
        return [r for r in self._records.values()
                if r.status is PluginStatus.DISABLED and r.group not in endpoint_groups]

    def _check_allowlist_names(self) -> None:
        """Every name in BRIGADE_PLUGINS must be an installed plugin: a typo must not load nothing silently.
        An endpoint plugin's name is refused with where it belongs (BRIGADE_ENDPOINT_PLUGINS)."""
        allow = self.settings.allowlist
        if not allow:
            return
        installed = {BUILTIN_PLUGIN} | {ep.name for g in ALL_GROUPS if not g.endpoint for ep in discover(g)}
        missing = allow - installed
        if not missing:
            return
        endpoints = sorted(missing.intersection(ep.name for g in ALL_GROUPS if g.endpoint for ep in discover(g)))
        unknown = sorted(missing - set(endpoints))
        parts = []
        if unknown:
            parts.append(f"{PLUGINS_ENV} names {_quoted(unknown)}, which no installed plugin provides")
        if endpoints:
            verb = "is an endpoint plugin" if len(endpoints) == 1 else "are endpoint plugins"
            parts.append(f"{PLUGINS_ENV} names {_quoted(endpoints)}, but {', '.join(endpoints)} {verb}, enabled "
                         f"with {ENDPOINT_PLUGINS_ENV} instead ({ENDPOINT_PLUGINS_ENV}={','.join(endpoints)})")
        raise PluginLoadError(f"{'; '.join(parts)}; installed: {', '.join(sorted(installed))}")

    def _load_group(self, group: PluginGroup) -> None:
        if group.name in self._loaded_groups:
            return
        # Marked before loading: a failure is not retried, and re-entrant calls return at once.
        self._loaded_groups.add(group.name)
        if group is GENERAL:
            # The core's own plugin loads first and whatever the allowlist says: without it there is no
            # CPU platform and no reference backend.
            self._load_one(group, BUILTIN_PLUGIN, self.core_source.distribution, self.core_source.version,
                           BUILTIN_MODULE, lambda: importlib.import_module(BUILTIN_MODULE), always=True)
        entry_points = discover(group)
        if group.endpoint:
            self._check_endpoint_allowlist(entry_points)
        for ep in entry_points:
            dist, version = distribution_of(ep)
            self._load_one(group, ep.name, dist, version, ep.value, ep.load)

    def _check_endpoint_allowlist(self, entry_points: list[Any]) -> None:
        allow = self.settings.endpoint_allowlist
        if allow:
            installed = {ep.name for ep in entry_points}
            missing = allow - installed
            if missing:
                # A name of another kind of plugin (an io_processor one, say) belongs to BRIGADE_PLUGINS.
                others = {ep.name: g for g in ALL_GROUPS if not g.endpoint for ep in discover(g)}
                others[BUILTIN_PLUGIN] = GENERAL
                misplaced = sorted(missing.intersection(others))
                unknown = sorted(missing - set(misplaced))
                parts = []
                if unknown:
                    parts.append(f"{ENDPOINT_PLUGINS_ENV} names {_quoted(unknown)}, which no installed endpoint "
                                 "plugin provides")
                for name in misplaced:
                    if name == BUILTIN_PLUGIN:
                        parts.append(f"{ENDPOINT_PLUGINS_ENV} names {name!r}, the core's own plugin, which always "
                                     f"loads; remove it from {ENDPOINT_PLUGINS_ENV}")
                        continue
                    parts.append(f"{ENDPOINT_PLUGINS_ENV} names {name!r}, but {name} is {_kind(others[name])} "
                                 f"plugin, not an endpoint plugin: {PLUGINS_ENV} selects it (it loads when "
                                 f"{PLUGINS_ENV} is unset or names it), so remove it from {ENDPOINT_PLUGINS_ENV}")
                raise PluginLoadError(f"{'; '.join(parts)}; installed endpoint plugins: "
                                      f"{', '.join(sorted(installed)) or 'none'}")

    def _load_one(self, group: PluginGroup, name: str, dist: str, version: str, value: str,
                  load: Callable[[], Any], *, always: bool = False) -> None:
        record = PluginRecord(name=name, group=group.name, scope=group.scope, distribution=dist,
                              version=version, value=value)
        self._records[(group.name, dist, name)] = record
        settings = self.settings
        if not always and not settings.allows(name, endpoint=group.endpoint):
            record.status = PluginStatus.DISABLED
            record.reason = self._disabled_reason(group)
            return
        if always:
            required = "the core's builtin plugin is required"
        elif settings.named(name, endpoint=group.endpoint):
            required = f"the operator named it in {ENDPOINT_PLUGINS_ENV if group.endpoint else PLUGINS_ENV}"
        else:
            required = None
        try:
            obj = load()
            self._check_hookspec_version(obj, record)
            self._register(obj, record, group)
        except (Exception, SystemExit) as exc:  # plugin code can raise anything, even sys.exit(); reported
            self._report_failure(record.source, exc, required, record=record)
            return
        logger.debug("loaded plugin %r from %s %s (%s): %s", name, dist, version, group.name, record.registered)

    def _disabled_reason(self, group: PluginGroup) -> str:
        if group.endpoint:
            if self.settings.endpoint_allowlist is None:
                return f"endpoint plugins are denied by default; {ENDPOINT_PLUGINS_ENV} is unset"
            return f"not in {ENDPOINT_PLUGINS_ENV}={','.join(sorted(self.settings.endpoint_allowlist))}"
        return f"not in {PLUGINS_ENV}={','.join(sorted(self.settings.allowlist or ()))}"

    @staticmethod
    def _check_hookspec_version(obj: Any, record: PluginRecord) -> None:
        declared = getattr(obj, "BRIGADE_HOOKSPEC_VERSION", None)
        if declared is None:
            logger.warning("plugin %r (%s %s) does not declare BRIGADE_HOOKSPEC_VERSION; assuming it was "
                           "built for hook specs %s", record.name, record.distribution, record.version,
                           hookspecs.HOOKSPEC_VERSION)
            return
        record.hookspec_version = str(declared)
        if hookspecs.hookspec_major(str(declared)) != hookspecs.hookspec_major(hookspecs.HOOKSPEC_VERSION):
            raise HookspecVersionError(f"plugin {record.name!r} ({record.distribution} {record.version}) was built "
                                       f"for Brigade hook specs {declared} but this Brigade provides hook specs "
                                       f"{hookspecs.HOOKSPEC_VERSION}; install a version of the plugin built "
                                       f"for {hookspecs.hookspec_major(hookspecs.HOOKSPEC_VERSION)}.x")

    def _register(self, obj: Any, record: PluginRecord, group: PluginGroup) -> None:
        """Register ``obj`` with pluggy, run its registration hooks, then commit what they registered."""
        already = self._pm.get_name(obj)
        if already is not None:
            record.reason = f"same object as {already}; its hooks ran once"
            return
        plugin_key = f"{group.name}:{record.distribution}:{record.name}"
        self._pm.register(obj, name=plugin_key)
        try:
            self._pm.check_pending()  # a misspelt hook name must not be ignored
            implemented = {c.name for c in self._pm.get_hookcallers(obj) or []}
            record.hooks = [h for h in hookspecs.REGISTRATION_HOOKS if h in implemented]
            if not record.hooks:
                logger.warning("plugin %r (%s) implements no brigade hooks", record.name, record.distribution)
            staged = self._run_registration_hooks(obj, record, group)
        except BaseException:
            self._pm.unregister(obj)
            raise
        # Commit only when every hook succeeded, so a failing plugin leaves nothing half-registered.
        for hook, name, value, override, extra in staged:
            self.registries.for_hook(hook).add(name, value, record.source, override=override, **extra)
            record.registered.setdefault(hook.removeprefix("register_"), []).append(name)

    def _run_registration_hooks(self, obj: Any, record: PluginRecord, group: PluginGroup) -> _Staged:
        staged: _Staged = []
        for hook in hookspecs.REGISTRATION_HOOKS:
            impls = [impl for impl in getattr(self._pm.hook, hook).get_hookimpls() if impl.plugin is obj]
            if impls and hook == "register_endpoints" and not group.endpoint:
                raise PluginLoadError(f"plugin {record.name!r} implements register_endpoints but is in group "
                                      f"{group.name}; endpoints must come from brigade.endpoint_plugins so "
                                      f"that {ENDPOINT_PLUGINS_ENV} governs them")
            for impl in impls:
                register = self._make_register(hook, record.source, staged)
                impl.function(**{arg: register for arg in impl.argnames})
        return staged

    def _make_register(self, hook: str, source: PluginSource, staged: _Staged) -> Callable[..., None]:
        registry = self.registries.for_hook(hook)
        if hook == "register_kernels":
            return self._make_register_kernel(registry, source, staged)

        def register(name: str, value: Any, *, override: bool = False, **extra: Any) -> None:
            # Validated now, so the error surfaces inside the plugin's own hook with its name on it.
            if hook == "register_endpoints":
                unknown = set(extra) - {"required_tasks"}
                extra.setdefault("required_tasks", ("generate",))
                if extra["required_tasks"] is not None:
                    extra["required_tasks"] = tuple(extra["required_tasks"])
            else:
                unknown = set(extra)
            if unknown:
                raise TypeError(f"{hook}'s register() got unexpected keywords {sorted(unknown)}")
            if any(s[0] == hook and s[1] == name for s in staged):
                raise ValueError(f"{registry.kind} {name!r} registered twice by {source.describe()}")
            registry.check(name, value, source, override=override)
            staged.append((hook, name, value, override, extra))

        register.__doc__ = f"Register one {registry.kind} (see hookspecs.{hook})."
        return register

    @staticmethod
    def _make_register_kernel(registry: Any, source: PluginSource, staged: _Staged) -> Callable[..., None]:
        def register(op: str, platform: str, impl: Any, *, name: str | None = None, override: bool = False) -> None:
            # Validated now, like the other registries, so the error names the plugin's own hook.
            check_kernel(op, platform)
            key = kernel_key(op, platform)
            if any(s[0] == "register_kernels" and s[1] == key for s in staged):
                raise ValueError(f"kernel {key!r} registered twice by {source.describe()}")
            registry.check(key, impl, source, override=override)
            staged.append(("register_kernels", key, impl, override,
                           {"op": op, "platform": platform, "label": name or kernel_label(impl)}))

        register.__doc__ = "Register one kernel (see hookspecs.register_kernels)."
        return register

    # ---- failures ---------------------------------------------------------------------------------
    def _report_failure(self, source: PluginSource, exc: BaseException, required: str | None,
                        record: PluginRecord | None = None) -> None:
        """WARNING with the reason, or PluginLoadError when strict mode is on or ``required`` says why the
        plugin must load (the operator named it, or it is the core's own)."""
        record = record or self._record_for(source)
        reason = f"{type(exc).__name__}: {exc}"
        if record is not None:
            record.status = PluginStatus.FAILED
            record.reason = reason
        where = f"{source.describe()}" + (f" in group {record.group}" if record is not None else "")
        if required is not None or self.settings.strict:
            why = required if required is not None else f"{STRICT_ENV}=1"
            raise PluginLoadError(f"{where} failed ({why}): {reason}") from exc
        logger.warning("%s failed and is skipped: %s", where, reason)

    def _record_for(self, source: PluginSource) -> PluginRecord | None:
        for record in self._records.values():
            if record.source == source and record.status is not PluginStatus.DISABLED:
                return record
        return None

    def _mark_platform(self, source: PluginSource, name: str, state: str) -> None:
        record = self._record_for(source)
        if record is not None:
            record.platforms[name] = state
