"""Configuration: small dataclasses, one per component, composed into BrigadeConfig."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from dataclasses import dataclass, field
from typing import Any


class ConfigError(ValueError):
    """A bad setting; the message says what is wrong and what would be right, in one line."""


_DTYPES = ("auto", "bfloat16", "float16", "float32", "half", "float", "bf16", "fp16", "fp32")


@dataclass
class ModelConfig:
    """What model to run and how its weights and tokenizer are read."""

    model: str = ""
    """Path of an HF-format directory (config.json, *.safetensors, tokenizer.json)."""
    tokenizer: str | None = None
    """Tokenizer directory; defaults to model."""
    served_model_name: str | list[str] | None = None
    """The name clients use, or several (vLLM's ``--served-model-name a b``): each is accepted as ``model`` and
    listed by /v1/models, the first is the one responses and metrics carry. Defaults to the model path's
    basename."""
    dtype: str = "auto"
    """auto (the config's torch_dtype on GPU, float32 on CPU), bfloat16, float16 or float32."""
    max_model_len: int | None = None
    """Longest prompt plus output, in tokens; defaults to the config's max_position_embeddings."""
    seed: int = 0
    """Seed for dummy weights and unseeded random sampling."""
    load_format: str = "auto"
    """auto, safetensors, gguf or dummy (random weights from config.json alone)."""
    generation_config: str = "auto"
    """auto reads generation_config.json defaults; none ignores it; or a directory."""
    chat_template: str | None = None
    """A Jinja chat template (text or file) to use instead of the tokenizer's."""
    quantization: str | None = None
    """A quantization method name registered by a plugin."""
    enforce_eager: bool = False
    """Never capture CUDA graphs."""
    io_processor_plugin: str | None = None
    """Name of an IO-processor plugin to apply to requests and outputs."""
    skip_tokenizer_init: bool = False
    """Load no tokenizer: prompts must be token ids and outputs carry no text (dummy-weight benchmarks)."""
    trust_remote_code: bool = False
    """Let transformers run the model folder's own code (``auto_map``) to read its config and tokenizer."""

    def __post_init__(self) -> None:
        if self.dtype not in _DTYPES:
            raise ConfigError(f"--dtype {self.dtype!r} is not known; use one of auto, bfloat16, float16, float32")
        if self.load_format not in ("auto", "safetensors", "gguf", "dummy"):
            raise ConfigError(f"--load-format {self.load_format!r} is not known; use auto, safetensors, gguf or dummy")
        if self.max_model_len is not None and self.max_model_len < 1:
            raise ConfigError(f"--max-model-len must be a positive integer, got {self.max_model_len}")

    @property
    def name(self) -> str:
        """The served model's (first) name: what responses and metrics carry."""
        return self.served_model_names[0]

    @property
    def served_model_names(self) -> list[str]:
        """Every name the model is served under, the first being ``name``."""
        names = self.served_model_name
        if isinstance(names, str):
            names = [names]
        names = list(dict.fromkeys(n for n in names or () if n))  # in order, each once
        return names or [os.path.basename(os.path.normpath(self.model)) or self.model]


MIN_KV_BLOCKS = 2
"""The least KV pool that can hold a token: block 0 is the null block (``BlockPool``), padding that never holds any."""


@dataclass
class CacheConfig:
    """The paged KV cache: block size, memory budget and prefix caching."""

    block_size: int | None = None
    """Tokens per KV block; None lets the platform choose (16 on most)."""
    gpu_memory_utilization: float = 0.9
    """Fraction of device memory Brigade may use for weights, activations and KV cache (GPU only)."""
    kv_cache_memory_gib: float | None = None
    """KV pool size in GiB; overrides profiling. On the CPU it defaults to 1 GiB."""
    num_gpu_blocks_override: int | None = None
    """Force this many KV blocks (tests use it to force preemption); at least 2, as block 0 is the null block."""
    enable_prefix_caching: bool = True
    """Reuse KV blocks across requests sharing a prefix (chained block hashes)."""
    cache_dtype: str = "auto"
    """KV cache dtype: auto, or the model dtype's name (bfloat16, float16, float32). The KV cache is stored in the
    model dtype; fp8 caches (vLLM's fp8, fp8_e4m3, fp8_e5m2) are refused, as is a dtype other than the model's
    (checked once the model dtype is resolved, ``check_cache_dtype``)."""
    prefix_caching_hash_algo: str = "sha256"
    """sha256 (cryptographic, seed may be fixed) or builtin (Python hash with a random seed)."""

    def __post_init__(self) -> None:
        if self.block_size is not None and (self.block_size < 1 or self.block_size & (self.block_size - 1)):
            raise ConfigError(f"--block-size must be a power of two such as 16, got {self.block_size}")
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ConfigError(f"--gpu-memory-utilization must be in (0, 1], got {self.gpu_memory_utilization}")
        if self.num_gpu_blocks_override is not None and self.num_gpu_blocks_override < MIN_KV_BLOCKS:
            raise ConfigError(f"--num-gpu-blocks-override must be at least {MIN_KV_BLOCKS}, got "
                              f"{self.num_gpu_blocks_override}: block 0 is the KV cache's null block (padding, it "
                              "never holds tokens), so N blocks hold N - 1 blocks of tokens")
        if self.kv_cache_memory_gib is not None and self.kv_cache_memory_gib <= 0:
            raise ConfigError(f"--kv-cache-memory must be a positive number of GiB, got {self.kv_cache_memory_gib}")
        if self.cache_dtype.startswith("fp8"):
            raise ConfigError(f"--kv-cache-dtype {self.cache_dtype}: no attention backend here stores an fp8 KV cache "
                              "(the cache is kept in the model dtype); use --kv-cache-dtype auto")
        if self.cache_dtype not in ("auto", "bfloat16", "float16", "float32"):
            raise ConfigError(f"--kv-cache-dtype {self.cache_dtype!r} is not known; use auto (the model dtype) or its "
                              "name: bfloat16, float16, float32")

    def check_cache_dtype(self, model_dtype: str) -> None:
        """Refuse a --kv-cache-dtype naming a dtype other than the model's (``model_dtype``, e.g. "bfloat16"),
        once that is resolved.

        Raises:
            ConfigError: one line naming both dtypes and the two ways out.
        """
        if self.cache_dtype not in ("auto", model_dtype):
            raise ConfigError(f"--kv-cache-dtype {self.cache_dtype} differs from the model dtype {model_dtype}; the KV "
                              f"cache is kept in the model dtype: use --kv-cache-dtype auto (or --dtype "
                              f"{self.cache_dtype})")


@dataclass
class SchedulerConfig:
    """Continuous batching limits per step."""

    max_num_seqs: int = 256
    """Most requests running at once."""
    max_num_batched_tokens: int | None = None
    """Token budget per step; defaults to max(8192, max_model_len) when chunked prefill is on."""
    enable_chunked_prefill: bool = True
    """Split long prompts across steps and mix them with decodes."""
    long_prefill_token_threshold: int = 0
    """Cap on one prefill chunk's tokens per step; 0 disables it."""
    policy: str = "fcfs"
    """fcfs (arrival order; the last admitted running request is preempted first) or priority (lowest
    ``(priority, arrival_time)`` first; the running request with the largest priority value, then the latest
    arrival, is preempted first)."""
    async_scheduling: bool | None = None
    """Schedule and launch step N+1 before step N's tokens reach the host, hiding host work behind the
    device. None turns it on for GPUs. Requests whose sampling reads earlier outputs on the host
    (penalties, bad words, min_tokens, grammars) still run step by step."""

    def __post_init__(self) -> None:
        if self.max_num_seqs < 1:
            raise ConfigError(f"--max-num-seqs must be at least 1, got {self.max_num_seqs}")
        if self.max_num_batched_tokens is not None and self.max_num_batched_tokens < 1:
            raise ConfigError(f"--max-num-batched-tokens must be at least 1, got {self.max_num_batched_tokens}")
        if self.policy not in ("fcfs", "priority"):
            raise ConfigError(f"--scheduling-policy {self.policy!r} is not known; use fcfs or priority")
        if self.long_prefill_token_threshold < 0:
            raise ConfigError(f"--long-prefill-token-threshold must be 0 (off) or more, got "
                              f"{self.long_prefill_token_threshold}")


@dataclass
class ParallelConfig:
    """How the model is spread over devices."""

    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    data_parallel_size: int = 1
    distributed_executor_backend: str | None = None
    """uni, mp or ray; None picks uni for one device and mp for more."""
    worker_cls: str = "auto"
    """Dotted path of the Worker class; the platform sets it in check_and_update_config."""

    def __post_init__(self) -> None:
        for name in ("tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size"):
            if getattr(self, name) < 1:
                raise ConfigError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(self, name)}")
        if self.distributed_executor_backend not in (None, "uni", "mp", "ray"):
            raise ConfigError(f"--distributed-executor-backend {self.distributed_executor_backend!r} "
                              "is not known; use uni, mp or ray")

    @property
    def world_size(self) -> int:
        return self.tensor_parallel_size * self.pipeline_parallel_size


CUDAGRAPH_MODES = ("NONE", "FULL_DECODE_ONLY", "FULL")


@dataclass
class CompilationConfig:
    """Optimization level and CUDA graphs. Flags set by the user win over the level."""

    level: int = 2
    """-O0 none, -O1 compile only, -O2 compile + decode CUDA graphs (default), -O3 adds larger capture sizes."""
    cudagraph_capture_sizes: list[int] | None = None
    """Decode batch sizes to capture; None derives them from level and max_num_seqs."""
    use_cudagraph: bool | None = None
    """None follows the level."""
    cudagraph_mode: str | None = None
    """Which steps replay CUDA graphs, in vLLM's names: NONE; FULL_DECODE_ONLY (decode steps, and speculative
    verification steps); FULL (those, and mixed steps of up to 512 tokens, 1024 at -O3: prefills, chunks and
    decodes together). None follows the level: FULL from -O2."""
    mixed_capture_sizes: list[int] | None = None
    """Token counts to capture mixed-step graphs for (FULL); None derives them from the level and the step
    budget (every 8 up to 256, every 16 up to 512; -O3 every 32 on to 1024)."""

    def __post_init__(self) -> None:
        if self.level not in (0, 1, 2, 3) or isinstance(self.level, bool):
            raise ConfigError(f"optimization level {self.level!r} is not a level; use 0, 1, 2 or 3")
        if self.cudagraph_mode is not None:
            mode = str(self.cudagraph_mode).upper()
            if mode in ("PIECEWISE", "FULL_AND_PIECEWISE"):
                raise ConfigError(f"cudagraph_mode {self.cudagraph_mode!r}: Brigade has no piecewise graphs; it captures "
                                  "mixed steps as full graphs: use FULL (the default from -O2), FULL_DECODE_ONLY or NONE")
            if mode not in CUDAGRAPH_MODES:
                raise ConfigError(f"cudagraph_mode {self.cudagraph_mode!r} is not known; use one of "
                                  f"{', '.join(CUDAGRAPH_MODES)}")
            self.cudagraph_mode = mode
        for name in ("cudagraph_capture_sizes", "mixed_capture_sizes"):
            sizes = getattr(self, name)
            if sizes is not None and (not isinstance(sizes, list) or not sizes
                                      or not all(isinstance(n, int) and not isinstance(n, bool) and n > 0
                                                 for n in sizes)):
                raise ConfigError(f"{name} must be a non-empty list of positive integers, got {sizes!r}")

    def resolved_cudagraph_mode(self, enforce_eager: bool) -> str:
        """The mode in force: NONE under --enforce-eager, -O0/-O1 or use_cudagraph=False (unless the mode was
        set explicitly: a flag the user passes wins over the level), else the mode or FULL."""
        if enforce_eager or self.use_cudagraph is False:
            return "NONE"
        if self.cudagraph_mode is not None:
            return self.cudagraph_mode
        return "FULL" if self.use_cudagraph or self.level >= 2 else "NONE"


POSSIBLE_MAX_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # vLLM's; an adapter of a lower rank fits too


@dataclass
class LoRAConfig:
    """Multi-LoRA serving (--enable-lora, Hu et al. 2021 arXiv:2106.09685). Present on a
    BrigadeConfig only when LoRA is enabled."""

    max_loras: int = 1
    """Most distinct adapters in one batch (one weight slot each on the device); vLLM's default 1."""
    max_cpu_loras: int | None = None
    """Most adapters whose weights are kept in host memory (an LRU cache; one evicted is read again from its
    folder when a request needs it); None: ``max_loras``, as in vLLM. It does not cap the adapters served."""
    max_lora_rank: int = 16
    """Largest adapter rank accepted; the slots are sized for it (vLLM's default 16)."""
    lora_modules: dict[str, str] = field(default_factory=dict)
    """Adapters loaded at start-up: name (what clients send as ``model``) -> PEFT adapter folder."""

    def __post_init__(self) -> None:
        if self.max_loras < 1:
            raise ConfigError(f"--max-loras must be at least 1, got {self.max_loras}")
        if self.max_cpu_loras is None:
            self.max_cpu_loras = self.max_loras
        elif self.max_cpu_loras < self.max_loras:
            raise ConfigError(f"--max-cpu-loras must be at least --max-loras ({self.max_loras}), got "
                              f"{self.max_cpu_loras}: the host cache holds every adapter of a batch; give "
                              f"--max-cpu-loras {self.max_loras} or more, or leave it out (it defaults to --max-loras)")
        if self.max_lora_rank not in POSSIBLE_MAX_LORA_RANKS:
            raise ConfigError(f"--max-lora-rank must be one of {', '.join(map(str, POSSIBLE_MAX_LORA_RANKS))} "
                              f"(as in vLLM), got {self.max_lora_rank}")
        for name, path in self.lora_modules.items():
            if not name or not name.strip():
                raise ConfigError(f"--lora-modules: an adapter name is empty (path {path!r}); give NAME=PATH")

    def check_names(self, served_model_names: str | list[str]) -> None:
        """Raises ConfigError when an adapter is named like the served model, or like one of its names
        (requests could not pick it)."""
        names = [served_model_names] if isinstance(served_model_names, str) else served_model_names
        for name in names:
            if name in self.lora_modules:
                raise ConfigError(f"--lora-modules: adapter name {name!r} is the served model's name; "
                                  "give the adapter another name")


@dataclass
class KVTransferConfig:
    """--kv-transfer-config: which KV connector plugin moves KV blocks between instances."""

    kv_connector: str
    kv_role: str = "kv_both"
    kv_connector_extra_config: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.kv_role not in ("kv_producer", "kv_consumer", "kv_both"):
            raise ConfigError(f"kv_role {self.kv_role!r} is not known; use kv_producer, kv_consumer or kv_both")


SPECULATIVE_METHODS = ("ngram",)
SPECULATIVE_KEYS = ("method", "num_speculative_tokens", "prompt_lookup_max", "prompt_lookup_min")


MAX_SPECULATIVE_TOKENS = 64  # more drafts than this per step only add rejected work (and metric series)


@dataclass
class SpeculativeConfig:
    """--speculative-config: speculative decoding with an n-gram (prompt-lookup) proposer, in vLLM's form
    ``{"method": "ngram", "num_speculative_tokens": K, "prompt_lookup_max": N, "prompt_lookup_min": M}``
    (Leviathan et al. 2023, arXiv:2211.17192). Present on a BrigadeConfig only when enabled.

    As in vLLM, when neither lookup bound is given both are 5, and when one is given the other equals it.

    Raises:
        ConfigError: another method (eagle, medusa, a draft model...), a count below 1, or
            ``prompt_lookup_min > prompt_lookup_max``; one line each.
    """

    method: str = "ngram"
    """Only ngram (prompt lookup: drafts copied from earlier in the prompt and output) is supported."""
    num_speculative_tokens: int = 0
    """Drafts proposed per request per step (k); required, at least 1."""
    prompt_lookup_max: int | None = None
    """Longest suffix n-gram looked up."""
    prompt_lookup_min: int | None = None
    """Shortest suffix n-gram looked up."""

    def __post_init__(self) -> None:
        flag = "--speculative-config"
        if self.method != "ngram":
            raise ConfigError(f"{flag} method {self.method!r} is not supported; supported: "
                              f"{', '.join(SPECULATIVE_METHODS)} (eagle, medusa, mtp and draft models are not)")
        for name in ("num_speculative_tokens", "prompt_lookup_max", "prompt_lookup_min"):
            value = getattr(self, name)
            if (value is None and name == "num_speculative_tokens") or (
                    value is not None and (isinstance(value, bool) or not isinstance(value, int))):
                raise ConfigError(f"{flag} {name} must be a whole number, got {value!r}")
        if not 1 <= self.num_speculative_tokens <= MAX_SPECULATIVE_TOKENS:
            raise ConfigError(f"{flag} num_speculative_tokens must be from 1 to {MAX_SPECULATIVE_TOKENS}, got "
                              f"{self.num_speculative_tokens}")
        for name in ("prompt_lookup_min", "prompt_lookup_max"):  # the values given, before defaults fill in
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ConfigError(f"{flag} {name} must be at least 1, got {getattr(self, name)}")
        if self.prompt_lookup_max is None and self.prompt_lookup_min is None:
            self.prompt_lookup_max = self.prompt_lookup_min = 5  # vLLM's defaults
        elif self.prompt_lookup_min is None:
            self.prompt_lookup_min = self.prompt_lookup_max
        elif self.prompt_lookup_max is None:
            self.prompt_lookup_max = self.prompt_lookup_min
        for name in ("prompt_lookup_min", "prompt_lookup_max"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{flag} {name} must be at least 1, got {getattr(self, name)}")
        if self.prompt_lookup_min > self.prompt_lookup_max:
            raise ConfigError(f"{flag} prompt_lookup_min {self.prompt_lookup_min} is above prompt_lookup_max "
                              f"{self.prompt_lookup_max}; use prompt_lookup_min <= prompt_lookup_max")

    @classmethod
    def from_dict(cls, data: Any) -> SpeculativeConfig:
        """Build from vLLM's dict form (``LLM(..., speculative_config={...})``, the CLI's JSON).

        Raises:
            ConfigError: not an object, unknown keys, or a bad value (one line).
        """
        if isinstance(data, SpeculativeConfig):
            return data
        if not isinstance(data, dict):
            raise ConfigError('--speculative-config must be a JSON object such as {"method": "ngram", '
                              '"num_speculative_tokens": 4, "prompt_lookup_max": 4}')
        data = dict(data)
        if "method" not in data and data.get("model") in ("ngram", "[ngram]"):  # vLLM's older spelling
            data.pop("model")
            data["method"] = "ngram"
        if "method" in data and data["method"] not in SPECULATIVE_METHODS:  # before its keys (model, ...)
            raise ConfigError(f"--speculative-config method {data['method']!r} is not supported; supported: "
                              f"{', '.join(SPECULATIVE_METHODS)} (eagle, medusa, mtp and draft models are not)")
        unknown = sorted(set(data) - set(SPECULATIVE_KEYS))
        if unknown:
            raise ConfigError(f"--speculative-config has unknown keys {unknown}; allowed: {', '.join(SPECULATIVE_KEYS)}")
        if "method" not in data:
            raise ConfigError(f"--speculative-config needs \"method\"; supported: {', '.join(SPECULATIVE_METHODS)}")
        if "num_speculative_tokens" not in data and data["method"] == "ngram":
            raise ConfigError("--speculative-config needs \"num_speculative_tokens\" (drafts per step, at least 1)")
        return cls(**data)


@dataclass
class BrigadeConfig:
    """Everything one engine needs. Each component receives only its own sub-config."""

    model_config: ModelConfig
    cache_config: CacheConfig = field(default_factory=CacheConfig)
    scheduler_config: SchedulerConfig = field(default_factory=SchedulerConfig)
    parallel_config: ParallelConfig = field(default_factory=ParallelConfig)
    compilation_config: CompilationConfig = field(default_factory=CompilationConfig)
    kv_transfer_config: KVTransferConfig | None = None
    lora_config: LoRAConfig | None = None
    """Set (even empty of adapters) when LoRA is enabled; None otherwise."""
    speculative_config: SpeculativeConfig | None = None
    """Set when speculative decoding is enabled (--speculative-config); None otherwise."""
    attention_backend: str | None = None
    """Name of a registered attention backend; None lets the platform choose."""
    device: str = "auto"
    """Platform device type, filled in from the active platform."""

    def resolve(self, hf_config) -> None:
        """Fill in what depends on the model's config.json: max_model_len and the step token budget.

        Raises ConfigError when --max-model-len exceeds the model's max_position_embeddings.
        """
        limit = getattr(hf_config, "max_position_embeddings", None)
        mc = self.model_config
        if mc.max_model_len is None:
            mc.max_model_len = limit or 2048
        elif limit is not None and mc.max_model_len > limit:
            raise ConfigError(f"--max-model-len {mc.max_model_len} exceeds the model's "
                              f"max_position_embeddings ({limit}); use at most {limit}")
        sc = self.scheduler_config
        if sc.max_num_batched_tokens is None:
            sc.max_num_batched_tokens = 8192 if sc.enable_chunked_prefill else max(8192, mc.max_model_len)
        if not sc.enable_chunked_prefill and sc.max_num_batched_tokens < mc.max_model_len:
            raise ConfigError(f"--max-num-batched-tokens {sc.max_num_batched_tokens} is below --max-model-len "
                              f"{mc.max_model_len}; without chunked prefill it must be at least that")

    def check_supported(self) -> None:
        """Refuse, in one line, settings that parse (they are vLLM's flags) but that this build cannot run yet,
        so they fail before anything loads instead of later or, worse, silently.

        The KV connector of ``--kv-transfer-config`` is checked by ``brigade.kv_transfer.check_kv_transfer_config``
        (it needs the plugin registry, a layer above this one).

        Raises:
            ConfigError: tensor, pipeline or data parallelism above 1; the ray executor.
        """
        parallel = self.parallel_config
        world = parallel.world_size
        if world != 1:
            raise ConfigError(f"tensor/pipeline parallelism of {world} is not implemented yet; run with -tp 1 -pp 1")
        if parallel.data_parallel_size != 1:
            raise ConfigError(f"data parallelism of {parallel.data_parallel_size} is not implemented yet; run with "
                              "-dp 1 (or one server per device behind a load balancer)")
        if parallel.distributed_executor_backend not in (None, "uni", "mp"):
            raise ConfigError(f"--distributed-executor-backend {parallel.distributed_executor_backend} is not "
                              "available in this build; use uni or mp")

    def compute_hash(self) -> str:
        """A hash of every field that changes the compute graph (for compile caches)."""
        factors = dataclasses.asdict(self)
        return hashlib.sha256(json.dumps(factors, sort_keys=True, default=str).encode()).hexdigest()[:16]


_SUB_CONFIGS = {"model_config": ModelConfig, "cache_config": CacheConfig, "scheduler_config": SchedulerConfig,
                "parallel_config": ParallelConfig, "compilation_config": CompilationConfig}


_LORA_KWARGS = ("enable_lora", "max_loras", "max_cpu_loras", "max_lora_rank", "lora_modules")


_SCALAR_TYPES: dict[str, tuple[type, ...]] = {"int": (int,), "float": (int, float), "bool": (bool,),
                                               "str": (str, os.PathLike)}


def _checked_value(name: str, annotation: Any, value: Any) -> Any:
    """``value`` for the field ``name`` annotated ``annotation`` (a string, as this module's annotations are),
    when the annotation is a plain scalar (``int``, ``float | None``...); a path-like for a ``str`` becomes its
    str. Other annotations are left to the config classes' own checks.

    Raises:
        TypeError: naming the argument, the type it takes and the value given (``LLM(m, max_model_len="abc")``).
    """
    parts = [p.strip() for p in str(annotation).split("|")]
    kinds = [p for p in parts if p != "None"]
    if not kinds or any(k not in _SCALAR_TYPES for k in kinds):
        return value
    if value is None and "None" in parts:
        return value
    ok = value is not None and any(isinstance(value, _SCALAR_TYPES[k]) for k in kinds)
    if isinstance(value, bool) and "bool" not in kinds:  # True is an int to Python, not a length
        ok = False
    if not ok:
        expected = " or ".join(kinds) + (" or None" if "None" in parts else "")
        raise TypeError(f"engine argument {name} must be {expected}, got {type(value).__name__} {value!r:.60}")
    return os.fspath(value) if isinstance(value, os.PathLike) else value


def config_from_kwargs(model: str, **kwargs: Any) -> BrigadeConfig:
    """Build a BrigadeConfig from flat keyword arguments named like the sub-configs' fields.

    ``LLM(model, dtype="float32", block_size=16, max_num_seqs=8)`` routes each name to its sub-config;
    ``attention_backend``, ``kv_transfer_config`` and ``speculative_config`` (dicts) go to BrigadeConfig itself;
    ``compilation_config`` (a level, a dict or a CompilationConfig, as vLLM's ``LLM`` takes it) fills the
    CompilationConfig; ``kv_cache_dtype`` (vLLM's name) is ``cache_dtype``; ``enable_lora=True``
    (with ``max_loras``, ``max_cpu_loras``, ``max_lora_rank``, ``lora_modules`` as a ``{name: path}`` dict) builds
    a LoRAConfig.

    Raises:
        TypeError: for a name no sub-config has, or a value of the wrong type for a scalar field (an int, float,
            bool or str one; ``max_model_len="abc"``), naming the argument and the type it takes.
        ConfigError: for a bad value.
    """
    parts: dict[str, dict[str, Any]] = {name: {} for name in _SUB_CONFIGS}
    parts["model_config"]["model"] = model
    top: dict[str, Any] = {}
    lora = {k: kwargs.pop(k) for k in _LORA_KWARGS if k in kwargs}
    if lora.pop("enable_lora", False):
        modules = lora.get("lora_modules") or {}
        lora["lora_modules"] = dict(modules)
        top["lora_config"] = LoRAConfig(**lora)
    elif lora.get("lora_modules"):
        raise ConfigError("lora_modules needs enable_lora=True")
    for key, value in kwargs.items():
        if key == "kv_cache_dtype":  # vLLM's name for it
            key = "cache_dtype"
        if key in ("attention_backend",):
            top[key] = value
            continue
        if key == "speculative_config":
            top[key] = None if value is None else SpeculativeConfig.from_dict(value)
            continue
        if key == "compilation_config":  # vLLM's LLM takes a level, a dict or a CompilationConfig
            if isinstance(value, CompilationConfig):
                value = dataclasses.asdict(value)
            elif isinstance(value, int) and not isinstance(value, bool):
                value = {"level": value}
            if not isinstance(value, dict):
                raise ConfigError(f"compilation_config must be a level (0-3), a dict or a CompilationConfig, "
                                  f"got {type(value).__name__}")
            unknown = sorted(set(value) - {f.name for f in dataclasses.fields(CompilationConfig)})
            if unknown:
                raise ConfigError(f"compilation_config has unknown keys {unknown}; allowed: "
                                  f"{', '.join(f.name for f in dataclasses.fields(CompilationConfig))}")
            parts["compilation_config"].update(value)
            continue
        if key == "kv_transfer_config":
            top[key] = value if value is None or isinstance(value, KVTransferConfig) else KVTransferConfig(**value)
            continue
        for part, cls in _SUB_CONFIGS.items():
            fields = {f.name: f for f in dataclasses.fields(cls)}
            if key in fields:
                parts[part][key] = _checked_value(key, fields[key].type, value)
                break
        else:
            known = sorted([f.name for cls in _SUB_CONFIGS.values() for f in dataclasses.fields(cls)]
                           + list(_LORA_KWARGS) + ["attention_backend", "compilation_config", "kv_transfer_config",
                                                   "speculative_config"])
            raise TypeError(f"unknown engine argument {key!r}; known: {', '.join(known)}")
    config = BrigadeConfig(**{part: cls(**parts[part]) for part, cls in _SUB_CONFIGS.items()}, **top)
    if config.lora_config is not None:
        config.lora_config.check_names(config.model_config.served_model_names)
    return config
