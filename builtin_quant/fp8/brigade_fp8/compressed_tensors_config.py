"""CompressedTensorsFp8Config: FP8 checkpoints in the compressed-tensors format (llm-compressor's output).

Chosen without a flag when ``config.json`` has ``quantization_config.quant_method == "compressed-tensors"``. The
``quantization_config`` is parsed with the ``compressed_tensors`` library's own model (``QuantizationConfig``),
not by hand. Brigade runs the ``float-quantized`` format with 8-bit float symmetric weights and these schemes
(the library's presets):

* ``FP8``: weights per tensor, activations static per tensor (``input_scale``);
* ``FP8_DYNAMIC``: weights per output channel, activations dynamic per token;
* ``FP8_BLOCK``: weights per 128x128 block; the checkpoint's dynamic 1x128 activation groups run per token
  (a coarser activation scale: slightly more activation error than the checkpoint was calibrated with).

A ``kv_cache_scheme`` of static per-tensor FP8 (llm-compressor's) means the checkpoint carries per-layer
``k_scale`` / ``v_scale`` tensors: they are read for ``--kv-cache-dtype fp8`` (``brigade/model_executor/kv_scales.py``)
and unused by a cache in the model dtype. Anything else (other formats or bit widths, int weights, asymmetric or
dynamic weights, other strategies, weight-only schemes, sparsity, another ``kv_cache_scheme``) is refused at
start-up in one line naming it. The
``ignore`` list (names and ``re:`` patterns, HF names) leaves layers unquantized, ``lm_head`` typically.
"""

from __future__ import annotations

from typing import Any

from brigade.model_executor.layers.linear_method import LinearMethod, QuantizationConfig

from brigade_fp8.config import hf_names, is_ignored, quantization_config_dict
from brigade_fp8.method import Fp8LinearMethod, Fp8Scheme

SUPPORTED = ("FP8 (static per-tensor), FP8_DYNAMIC (per-channel weights, per-token activations) and FP8_BLOCK "
             "(128x128 weight blocks) in the float-quantized format")


def _refuse(what: str) -> ValueError:
    return ValueError(f"compressed-tensors checkpoint: {what} is not supported; brigade-fp8 runs {SUPPORTED}")


def _args_text(args: Any) -> str:
    kind, strategy = (getattr(v, "value", v) for v in (args.type, args.strategy))  # the library's str enums
    return (f"{args.num_bits}-bit {kind} {strategy}{' dynamic' if args.dynamic else ''}"
            f"{'' if args.symmetric else ' asymmetric'}")


def scheme_from_compressed_tensors(group: str, scheme: Any) -> Fp8Scheme:
    """The ``Fp8Scheme`` of one compressed-tensors ``QuantizationScheme`` (config group ``group``).

    Raises:
        ValueError (one line): the scheme is not one of the supported FP8 schemes (see the module docstring).
    """
    w, a = scheme.weights, scheme.input_activations
    if w is None or scheme.output_activations is not None:
        raise _refuse(f"group {group!r} (weights {w and _args_text(w)}, output activations "
                      f"{scheme.output_activations and _args_text(scheme.output_activations)})")
    if w.type != "float" or w.num_bits != 8 or not w.symmetric or w.dynamic:
        raise _refuse(f"group {group!r} weights {_args_text(w)}")
    if w.strategy not in ("tensor", "channel", "block"):
        raise _refuse(f"group {group!r} weight strategy {w.strategy!r}")
    block = None
    if w.strategy == "block":
        bs = list(w.block_structure or [])
        if len(bs) != 2:
            raise _refuse(f"group {group!r} block_structure {w.block_structure!r}")
        block = (int(bs[0]), int(bs[1]))
    if a is None:
        raise _refuse(f"group {group!r} with weight-only FP8 (no input_activations)")
    if a.type != "float" or a.num_bits != 8 or not a.symmetric:
        raise _refuse(f"group {group!r} input activations {_args_text(a)}")
    static = not a.dynamic
    if static and a.strategy != "tensor":
        raise _refuse(f"group {group!r} static input activations per {a.strategy}")
    if not static and a.strategy not in ("token", "group", "tensor"):
        raise _refuse(f"group {group!r} dynamic input activations per {a.strategy}")
    return Fp8Scheme(serialized=True, weight_strategy=str(w.strategy), block=block, static_input=static)


class CompressedTensorsFp8Config(QuantizationConfig):
    """compressed-tensors FP8: each config group's targets and scheme, and the ignore list."""

    name = "compressed-tensors"

    def __init__(self, groups: list[tuple[list[str], Fp8Scheme]], ignore: list[str]):
        self.groups = groups
        self.ignore = ignore

    @classmethod
    def from_hf_config(cls, hf_config: Any) -> CompressedTensorsFp8Config:
        """Parse the checkpoint's ``quantization_config`` with ``compressed_tensors.quantization.QuantizationConfig``.

        Raises:
            ValueError (one line): no compressed-tensors config, a config the library rejects, or one Brigade
                does not run (see the module docstring).
        """
        from compressed_tensors.quantization import QuantizationConfig as CTConfig

        qc = quantization_config_dict(hf_config)
        if qc is None or str(qc.get("quant_method", "")).lower() != cls.name:
            raise ValueError("--quantization compressed-tensors needs a compressed-tensors checkpoint (config.json "
                             "quantization_config.quant_method 'compressed-tensors'); drop --quantization, or make "
                             "one with llm-compressor")
        try:
            ct = CTConfig.model_validate({k: v for k, v in qc.items() if k != "sparsity_config"})
        except Exception as e:  # pydantic's ValidationError: many lines; keep the first
            raise ValueError(f"compressed-tensors checkpoint: its quantization_config is invalid: "
                             f"{' '.join(str(e).split())[:300]}") from e
        if qc.get("sparsity_config"):
            raise _refuse("a sparsity_config (sparse compression)")
        kv = ct.kv_cache_scheme
        if kv is not None and (kv.type != "float" or kv.num_bits != 8 or kv.strategy != "tensor" or kv.dynamic):
            raise _refuse(f"a kv_cache_scheme other than static per-tensor FP8 ({_args_text(kv)})")
        groups = []
        for group, scheme in (ct.config_groups or {}).items():
            fmt = getattr(scheme, "format", None) or ct.format
            if fmt != "float-quantized":
                raise _refuse(f"format {fmt!r} (group {group!r})")
            groups.append((list(scheme.targets), scheme_from_compressed_tensors(group, scheme)))
        if not groups:
            raise _refuse("a quantization_config without config_groups")
        return cls(groups, list(ct.ignore or []))

    def get_linear_method(self, prefix: str) -> LinearMethod | None:
        """The FP8 method of the first group targeting ``prefix`` (``Linear``, an exact HF name or an ``re:``
        pattern), None when ``ignore`` lists it or no group targets it.

        Raises:
            ValueError: a merged layer whose projections are split between ignored and quantized, or between
                groups of different schemes.
        """
        from compressed_tensors.utils.match import match_name

        if is_ignored(prefix, lambda n: any(match_name(n, t) for t in self.ignore), "compressed-tensors checkpoint"):
            return None
        schemes = set()
        for name in hf_names(prefix):
            for targets, scheme in self.groups:
                if any(t == "Linear" or match_name(name, t) for t in targets):
                    schemes.add(scheme)
                    break
            else:
                schemes.add(None)
        if len(schemes) > 1:
            raise ValueError(f"compressed-tensors checkpoint: the projections of {prefix} are quantized with "
                             "different schemes; Brigade merges them into one layer, which needs one scheme")
        scheme = schemes.pop()
        return None if scheme is None else Fp8LinearMethod(scheme, prefix)

