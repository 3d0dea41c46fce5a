"""Brigade's hook specifications, version 1.0: the one contract between the core and its plugins.

Every hook is keyword-only and contributes things through a ``register`` callable that the host
validates at registration time (the llm/datasette style). The core calls each plugin's registration
hooks once per process at startup; nothing here runs on the per-step hot path.

A plugin declares the major version it was built for as a module attribute::

    BRIGADE_HOOKSPEC_VERSION = "1.x"

A plugin whose major version differs from ``HOOKSPEC_VERSION``'s is refused with a message naming both.
Minor versions only ever add hooks or optional ``register`` keywords, so any 1.x plugin works with 1.y.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

import pluggy

if TYPE_CHECKING:
    from brigade.platforms.interface import Platform

PROJECT_NAME = "brigade"
HOOKSPEC_VERSION = "1.0"
"""Version of this set of hook specs: major changes break plugins, minor ones only add."""

hookspec = pluggy.HookspecMarker(PROJECT_NAME)
hookimpl = pluggy.HookimplMarker(PROJECT_NAME)

PlatformDetector = Callable[[], "type[Platform] | None"]
"""Returns the Platform subclass when its hardware is present, else None; must have no side effects."""


class RegisterPlatform(Protocol):
    def __call__(self, name: str, detect: PlatformDetector | str) -> None: ...


class RegisterComponent(Protocol):
    """``register(name, value, *, override=False)``; value is a class/factory or a lazy "module:Attr"."""

    def __call__(self, name: str, value: Any, *, override: bool = False) -> None: ...


class RegisterKernel(Protocol):
    """``register(op, platform, impl, *, name=None, override=False)``; see ``register_kernels``."""

    def __call__(self, op: str, platform: str, impl: Any, *, name: str | None = None,
                 override: bool = False) -> None: ...


class RegisterEndpoint(Protocol):
    def __call__(self, name: str, router_factory: Callable[[Any], Any] | str, *,
                 required_tasks: tuple[str, ...] | None = ("generate",), override: bool = False) -> None: ...


@hookspec
def register_platforms(register: RegisterPlatform) -> None:
    """Contribute hardware platforms and their detectors.

    Args:
        register: ``register(name, detect)``. ``detect()`` returns a ``Platform`` subclass when the
            hardware is present and usable, else None. It must have no side effects: no CUDA context,
            no device allocation, nothing that makes a later ``fork`` unsafe. It may also be a lazy
            ``"module:function"`` string.

    Returns:
        None. Not firstresult: every implementation runs. Exactly one detecting plugin platform beats the
        core's CPU platform; two detecting ones are an error unless ``BRIGADE_PLATFORM`` picks one.
    """


@hookspec
def register_attention_backends(register: RegisterComponent) -> None:
    """Contribute paged-attention backends (subclasses of ``brigade.attention.backend.AttentionBackend``).

    Args:
        register: ``register(name, backend, *, override=False)``. ``backend`` is the class or a lazy
            ``"module:Attr"`` string imported on first use. Selected with ``--attention-backend NAME``
            or by the platform's ``default_attention_backend``.

    Returns:
        None. Not firstresult: every implementation runs.
    """


@hookspec
def register_models(register: RegisterComponent) -> None:
    """Contribute model architectures, keyed by the ``architectures`` entry of the HF ``config.json``.

    Args:
        register: ``register(architecture, model_cls, *, override=False)``. ``model_cls`` (or its
            ``"module:Attr"``) implements the model interface: a subclass of
            ``brigade.model_executor.models.interface.CausalLM``.

    Returns:
        None. Not firstresult: every implementation runs.
    """


@hookspec
def register_quantization_methods(register: RegisterComponent) -> None:
    """Contribute quantization methods, selected with ``--quantization NAME``.

    Args:
        register: ``register(name, method_cls, *, override=False)``; the class or ``"module:Attr"``.

    Returns:
        None. Not firstresult: every implementation runs.
    """


@hookspec
def register_kv_connectors(register: RegisterComponent) -> None:
    """Contribute KV connectors, selected by ``--kv-transfer-config '{"kv_connector": NAME, ...}'``.

    Args:
        register: ``register(name, connector_cls, *, override=False)``; the class or ``"module:Attr"``, a subclass
            of ``brigade.kv_transfer.KVConnectorBase``, instantiated once per role (scheduler, worker) as
            ``connector_cls(kv_transfer_config, role, kv_cache_layout)``.

    Returns:
        None. Not firstresult: every implementation runs.
    """


@hookspec
def register_io_processors(register: RegisterComponent) -> None:
    """Contribute IO processors, selected by ``--io-processor-plugin NAME`` or the model config's
    ``io_processor_plugin`` field. Loaded in the API process only.

    Args:
        register: ``register(name, processor_cls, *, override=False)``; a subclass of
            ``brigade.plugins.io_processor.IOProcessor`` or ``"module:Attr"``.

    Returns:
        None. Not firstresult: every implementation runs.
    """


@hookspec
def register_endpoints(register: RegisterEndpoint) -> None:
    """Contribute extra HTTP routes to the API server. Denied by default: only plugins of the
    ``brigade.endpoint_plugins`` group named in ``BRIGADE_ENDPOINT_PLUGINS`` are loaded.

    Args:
        register: ``register(name, router_factory, *, required_tasks=("generate",), override=False)``.
            ``router_factory(app_state)`` returns a ``fastapi.APIRouter``; ``app_state`` carries
            ``engine_client`` and ``api_key``. The route is mounted only when the server supports one of
            ``required_tasks`` (None means any task).

    Returns:
        None. Not firstresult: every implementation runs.
    """


@hookspec
def register_stat_loggers(register: RegisterComponent) -> None:
    """Contribute stat loggers that receive every step's statistics in the API process.

    Args:
        register: ``register(name, logger_cls, *, override=False)``. ``logger_cls(config)`` takes the
            ``BrigadeConfig`` and returns a ``brigade.metrics.StatLoggerBase``; or ``"module:Attr"``.

    Returns:
        None. Not firstresult: every implementation runs.
    """


@hookspec
def register_logits_processors(register: RegisterComponent) -> None:
    """Contribute logits processors the sampler may apply.

    Args:
        register: ``register(name, processor_cls, *, override=False)``; the class or ``"module:Attr"``.

    Returns:
        None. Not firstresult: every implementation runs.
    """


@hookspec
def register_kernels(register: RegisterKernel) -> None:
    """Contribute fast implementations of the core's kernel ops for one platform.

    Args:
        register: ``register(op, platform, impl, *, name=None, override=False)``. ``op`` is one of
            ``brigade.plugins.kernels.KERNEL_OPS`` (``rms_norm``, ``dense_gemm``, ``fused_sampler``...; each
            entry gives the function's contract); ``platform`` is a platform name (``"cuda"``); ``impl`` is the
            function or a lazy ``"module:function"`` string imported when a layer first binds it; ``name`` is
            the kernel's label in ``brigade plugins`` (default: the function's name). One implementation per
            (op, platform): a second one is an error naming both distributions unless ``override=True``.
            Environment switches that choose among kernels are read here, at start-up, not at import.

    Returns:
        None. Not firstresult: every implementation runs. Layers bind their kernel once, when they are
        built on the active platform's device; nothing is looked up per step.
    """


REGISTRATION_HOOKS: tuple[str, ...] = (
    "register_platforms", "register_attention_backends", "register_models", "register_quantization_methods",
    "register_kv_connectors", "register_io_processors", "register_endpoints", "register_stat_loggers",
    "register_logits_processors", "register_kernels",
)
"""Names of every hook above, in the order the core calls them for one plugin."""


def hookspec_major(version: str) -> str:
    """The major part of a version such as "1.0", "1.x" or "2"; raises ValueError on an empty string."""
    major = str(version).strip().split(".", 1)[0]
    if not major:
        raise ValueError(f"not a hook-spec version: {version!r}")
    return major
