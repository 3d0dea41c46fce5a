"""Model loading: read the HF config, pick the architecture's class, build it on the device, fill its weights.

The class comes from the model registry (``brigade.plugins.registries.models``), so plugin packages
can add or override architectures. Weights come from the directory's safetensors files (streamed,
one tensor at a time) or, with ``load_format="dummy"``, from a seeded random generator, which lets
benchmarks run a large model's shape from ``config.json`` alone.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import torch
from torch import nn

from brigade.attention.backend import AttentionBackend
from brigade.config import ConfigError, ModelConfig
from brigade.distributed import get_ep_group, get_tp_group
from brigade.model_executor.layers.linear_method import fold_norms_wanted
from brigade.model_executor.models.interface import CausalLM
from brigade.model_executor.quant_summary import quantization_summary
from brigade.model_executor.weight_utils import initialize_dummy_weights, safetensors_weights_iterator

logger = logging.getLogger(__name__)


def get_hf_config(model_path: str, trust_remote_code: bool = False) -> Any:
    """Read ``config.json`` of an HF-format directory with transformers' AutoConfig, running the folder's own
    config code (``auto_map``) only with ``trust_remote_code`` (``--trust-remote-code``).

    Raises:
        ConfigError: the path is not a directory holding a config.json that transformers can read, or the config
            needs its own code and ``trust_remote_code`` is off.
    """
    from transformers import AutoConfig  # heavy; only the processes that build models need it

    if not os.path.isfile(os.path.join(model_path, "config.json")):
        raise ConfigError(f"model {model_path!r} is not a directory with a config.json; Brigade loads local "
                          "HF-format directories (nothing is fetched from a hub)")
    try:
        return AutoConfig.from_pretrained(model_path, trust_remote_code=trust_remote_code)
    except ValueError as e:
        if not trust_remote_code and "trust_remote_code" in str(e):
            raise ConfigError(f"model {model_path!r} has its own config code (auto_map in config.json), which runs "
                              "only with --trust-remote-code; give that flag if you trust the folder") from e
        raise ConfigError(f"cannot read the config of {model_path!r}: {' '.join(str(e).split())}") from e
    except Exception as e:  # a config.json that is not JSON (OSError), or the folder's own code failing (anything)
        raise ConfigError(f"cannot read the config of {model_path!r}: {type(e).__name__}: "
                          f"{' '.join(str(e).split())}") from e


def get_model_class(hf_config: Any) -> type[nn.Module]:
    """The registered class of the first of ``hf_config.architectures`` that is registered.

    Architectures come from ``registries.models``, filled by the ``register_models`` hook (the core's
    builtin plugin registers the Llama family; plugins may add or override).

    Raises:
        ConfigError: the config names no architecture, or none of them is registered.
    """
    from brigade.plugins import load_plugins, registries

    load_plugins("engine")  # idempotent; makes the loader usable outside an engine process (tests, tools)
    models = registries.models
    architectures = list(getattr(hf_config, "architectures", None) or [])
    if not architectures:
        raise ConfigError("the model's config.json has no 'architectures' entry, so its class is unknown")
    for arch in architectures:
        if arch in models.names():
            model_cls = models.get(arch)
            if not (isinstance(model_cls, type) and issubclass(model_cls, CausalLM)):
                raise ConfigError(f"the class registered for architecture {arch!r} ({model_cls!r}) does not implement "
                                  "Brigade's model interface; make it a subclass of "
                                  "brigade.model_executor.models.interface.CausalLM")
            return model_cls
    raise ConfigError(f"architecture {', '.join(architectures)} is not supported; installed: "
                      f"{', '.join(sorted(models.names()))}")


def check_model_config(hf_config: Any, config: Any) -> None:
    """Let the architecture's class refuse a config it cannot run (``BrigadeConfig`` ``config``): --enable-lora for
    a class without ``capabilities.lora``, after the class's own ``CausalLM.check_config`` (the MoE models: router,
    expert counts against the expert-parallel group; other families: rope types, attention features).

    Raises:
        ConfigError: from ``get_model_class`` or the class's check.
    """
    model_cls = get_model_class(hf_config)
    model_cls.check_config(hf_config, config)
    if config.lora_config is not None and not model_cls.capabilities.lora:
        raise ConfigError(f"{model_cls.__name__} does not take LoRA adapters; serve it without --enable-lora")


# Quantization methods of Brigade's own plugin packages (builtin_quant/), so that a checkpoint whose method is not
# installed can name the package to install. Only names: the core never imports a plugin.
QUANT_METHOD_PACKAGES = {"fp8": "brigade-fp8", "compressed-tensors": "brigade-fp8", "awq": "brigade-awq",
                         "gptq": "brigade-gptq"}


def get_quant_config(model_config: ModelConfig, hf_config: Any) -> Any | None:
    """The quantization config object for this model, or None.

    The method is ``--quantization`` when given, else the checkpoint's own
    ``quantization_config["quant_method"]``, unless the model class dequantizes that format at load
    (``CausalLM.dequantized_checkpoint_formats``: no method then). Its registered class builds itself with
    ``from_hf_config(hf_config)`` (see ``layers/linear_method.QuantizationConfig``).

    Raises:
        ConfigError (one line): no loaded plugin provides the method (naming the package to install when it is
            one of Brigade's, e.g. ``brigade-gptq`` for a GPTQ checkpoint), or the method's ``from_hf_config``
            refused the checkpoint (its ValueError's message, e.g. ``--quantization gptq`` on an unquantized one).
    """
    name = model_config.quantization
    checkpoint_quant = getattr(hf_config, "quantization_config", None)
    from_checkpoint = name is None and isinstance(checkpoint_quant, dict)
    if from_checkpoint:
        name = checkpoint_quant.get("quant_method")
        if name in get_model_class(hf_config).dequantized_checkpoint_formats:
            return None  # the model class turns these tensors into its dtype while loading (gpt-oss's MXFP4)
    if name is None:
        return None
    from brigade.plugins import load_plugins, registries

    load_plugins("engine")
    methods = registries.quantization_methods
    if name not in methods.names():
        package = QUANT_METHOD_PACKAGES.get(name)
        installed = ", ".join(sorted(methods.names())) or "none"
        where = (f"the checkpoint is quantized with {name!r} (config.json quantization_config.quant_method), but "
                 "no loaded plugin provides that method" if from_checkpoint
                 else f"quantization method {name!r} is not provided by any loaded plugin")
        hint = (f"install {package} (pip install {package})" if package
                else "install the plugin package that provides it")
        raise ConfigError(f"{where}; {hint}, or check BRIGADE_PLUGINS if it is installed; installed methods: "
                          f"{installed}")
    try:
        return methods.get(name).from_hf_config(hf_config)
    except ConfigError:
        raise
    except ValueError as e:
        raise ConfigError(str(e)) from e


def check_quantized_layers(model_config: ModelConfig, hf_config: Any, *, tensor_parallel_size: int = 1) -> None:
    """Build the quantized model on the ``meta`` device (no memory, no weights, no kernels) so that a
    quantization method refuses a layer it cannot hold (``LinearMethod.create_weights`` raising ValueError, e.g.
    a GPTQ layer whose width does not divide into packed words) before any engine starts. Under ``-tp`` above 1
    it is built as rank 0 of the layout would build it (``distributed.tp_layout_preview``; every rank holds the
    same shapes), so a split that cuts a packed word or a quantization group is refused here too. Does nothing for
    an unquantized model. A model class that cannot be built on ``meta`` is skipped here (the real build checks).

    Raises:
        ConfigError (one line): from ``get_quant_config``, or the method's ValueError for a layer.
    """
    quant_config = get_quant_config(model_config, hf_config)
    if quant_config is None:
        return
    from brigade.attention.reference import ReferenceAttentionBackend
    from brigade.distributed import tp_layout_preview

    model_cls = get_model_class(hf_config)
    try:
        with torch.device("meta"), tp_layout_preview(tensor_parallel_size):
            model_cls(hf_config, dtype=torch.float16, attn_backend=ReferenceAttentionBackend,
                      quant_config=quant_config)
    except ConfigError:
        raise
    except ValueError as e:
        raise ConfigError(str(e)) from e
    except Exception as e:  # noqa: BLE001 - a model not meant for meta tensors: the engine's own build will tell
        logger.debug("skipped the meta-device check of %s: %s: %s", model_cls.__name__, type(e).__name__, e)


def load_model(model_config: ModelConfig, hf_config: Any, *, dtype: torch.dtype, device: torch.device,
               attn_backend: type[AttentionBackend], fold_norms: bool = True,
               expert_parallel: bool = False) -> nn.Module:
    """Build the model on ``device`` in ``dtype`` and load its weights; returns it in eval mode. Logs at INFO
    which quantization method holds each layer family (quant_summary).

    ``load_format``: "auto"/"safetensors" stream ``*.safetensors`` from ``model_config.model``;
    "dummy" draws random weights seeded by ``model_config.seed`` and each parameter's name, on its whole shape
    (the same values whatever the tensor-parallel layout). Under tensor parallelism (the process's TP group,
    ``brigade.distributed``) each rank reads only its slices of the checkpoint. Quantization methods get their
    ``process_weights_after_loading`` call after either. Where the platform registered an ``rms_norm_gemm``
    (a ``register_kernels`` kernel), the model's ``fold_norm_weights`` then runs, when it declares
    ``capabilities.fold_norms``,
    unless ``fold_norms`` is False (LoRA: the adapters' deltas read the normalized input, norm weight included).
    ``expert_parallel`` (``--enable-expert-parallel``) is passed to the model class, an MoE one (the engine refuses
    the flag for the others): its ranks hold whole experts, and read only theirs.

    Raises:
        ConfigError: unsupported architecture or load format.
        ValueError: the checkpoint does not match the model (missing or unexpected tensors).
        FileNotFoundError: no safetensors files.
    """
    model_cls = get_model_class(hf_config)
    quant_config = get_quant_config(model_config, hf_config)
    with torch.device(device):
        # The default device places parameters and binds CustomOps to the device's kernels.
        kwargs = {"dtype": dtype, "attn_backend": attn_backend, "max_model_len": model_config.max_model_len}
        if quant_config is not None:
            kwargs["quant_config"] = quant_config
        if expert_parallel:
            kwargs["expert_parallel"] = True
        model = model_cls(hf_config, **kwargs)
    fmt = model_config.load_format
    if fmt == "dummy":
        initialize_dummy_weights(model, model_config.seed)
    elif fmt in ("auto", "safetensors"):
        with torch.no_grad():
            # Under tensor (or expert) parallelism the tensors stay unread until each layer's loader narrows them
            # to the rank's slice (skips another rank's experts): no rank reads the whole model.
            lazy = get_tp_group().world_size > 1 or get_ep_group().world_size > 1
            loaded = model.load_weights(safetensors_weights_iterator(model_config.model, lazy=lazy))
        logger.info("loaded %d tensors from %s", len(loaded), model_config.model)
    else:
        raise ConfigError(f"--load-format {fmt} is not supported by the model loader yet; convert the "
                          "checkpoint to an HF safetensors directory (scripts/fetch_model.py does for GGUF)")
    process_weights_after_loading(model)
    logger.info("%s", quantization_summary(model, quant_config))
    if fold_norms and fold_norms_wanted(device.type) and model_cls.capabilities.fold_norms:
        with torch.no_grad():
            folded = model.fold_norm_weights()
        logger.info("folded %d RMSNorm weights into the projections that follow them", folded)
    return model.eval()


def process_weights_after_loading(model: nn.Module) -> None:
    """Let every layer's quantization method turn checkpoint-format weights into kernel format."""
    for module in model.modules():
        quant_method = getattr(module, "quant_method", None)
        if quant_method is not None:
            quant_method.process_weights_after_loading(module)
