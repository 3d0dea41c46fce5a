"""Engine flags shared by ``brigade serve``, ``generate`` and ``bench``, and their turn into a BrigadeConfig.

Flag names and defaults follow ``vllm serve``'s. Plugin-backed flags (``--quantization``, ``--attention-backend``,
``--kv-transfer-config``'s connector, ``--io-processor-plugin``) are checked against what the installed plugins
registered, which is why plugins load before the CLI parses. A bad value becomes one ConfigError line naming the
flag and what would be right.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from brigade.cache_paths import DEFAULT_MODEL_NAME, default_model, default_model_dir
from brigade.config import (BrigadeConfig, CacheConfig, CompilationConfig, ConfigError, KVTransferConfig,
                            LoRAConfig, ModelConfig, ParallelConfig, SchedulerConfig, SpeculativeConfig)
from brigade.entrypoints.model_hub import resolve_model
from brigade.kv_transfer import check_kv_transfer_config
from brigade.tokenizer import TOKENIZER_FILES, check_model_has_tokenizer

DTYPE_CHOICES = ("auto", "bfloat16", "float16", "float32")
DTYPE_ALIASES = {"half": "float16", "float": "float32"}  # vLLM's other --dtype names
KV_TRANSFER_KEYS = ("kv_connector", "kv_role", "kv_connector_extra_config")
KV_ROLES = ("kv_producer", "kv_consumer", "kv_both")
# Keys of the plugin_choices mapping (brigade.plugins.plugin_choices() returns exactly these).
PLUGIN_KINDS = ("quantization", "attention_backend", "kv_connector", "io_processor")
_CHOICES_DEST = "_brigade_plugin_choices"


def _installed(names: Sequence[str]) -> str:
    return ", ".join(names) if names else "none installed"


def add_engine_args(parser: argparse.ArgumentParser, plugin_choices: Mapping[str, Sequence[str]] | None = None,
                    *, positional_model: bool = True) -> None:
    """Add the engine flags to ``parser``.

    Args:
        plugin_choices: installed names per plugin kind (``brigade.plugins.plugin_choices()``); they are
            shown in --help and checked by ``config_from_args``.
        positional_model: also accept the model as the first positional argument (``brigade serve MODEL``).
    """
    choices = {kind: list((plugin_choices or {}).get(kind, ())) for kind in PLUGIN_KINDS}
    parser.set_defaults(**{_CHOICES_DEST: choices})
    _add_model_args(parser, choices, positional_model=positional_model)
    _add_kv_cache_args(parser, choices)
    _add_scheduler_args(parser)
    _add_lora_args(parser)
    _add_parallel_args(parser)


def _add_model_args(parser: argparse.ArgumentParser, choices: Mapping[str, Sequence[str]], *,
                    positional_model: bool) -> None:
    """The "model" group: which model, its tokenizer, dtype, length, weights, quantization and execution mode."""
    m = parser.add_argument_group("model")
    if positional_model:
        m.add_argument("model_tag", nargs="?", metavar="MODEL", help="HF-format model directory or hub id (org/name, "
                       f"fetched into the cache); default: the {DEFAULT_MODEL_NAME} that scripts/setup.sh built")
    m.add_argument("--model", help="HF-format model directory or hub id (same as the positional MODEL)")
    m.add_argument("--tokenizer", help="tokenizer directory (default: the model's)")
    m.add_argument("--trust-remote-code", action="store_true",
                   help="let transformers run the model folder's own Python code (auto_map in config.json or "
                        "tokenizer_config.json) to read its config and tokenizer; off by default, as in vLLM: give it "
                        "only for a model you trust")
    m.add_argument("--skip-tokenizer-init", action="store_true", default=None,
                   help="load no tokenizer: prompts must be token ids and outputs carry no text")
    m.add_argument("--served-model-name", nargs="+", metavar="NAME",
                   help="the name clients use (default: the model directory's name); several names are all "
                        "accepted as \"model\", and responses carry the first")
    m.add_argument("--dtype", default="auto",
                   help=f"weights and activations: {', '.join(DTYPE_CHOICES)}, or vLLM's half (float16) and float "
                        "(float32)")
    m.add_argument("--max-model-len", type=int, help="longest prompt plus output in tokens")
    m.add_argument("--seed", type=int, help="seed for dummy weights and unseeded sampling (default 0)")
    m.add_argument("--load-format", default="auto", help="auto, safetensors, gguf or dummy")
    m.add_argument("--chat-template", help="Jinja chat template (file or text) replacing the tokenizer's")
    m.add_argument("--generation-config", default="auto",
                   help="auto (generation_config.json defaults), none, or a directory")
    m.add_argument("-q", "--quantization",
                   help=f"quantization method; installed: {_installed(choices['quantization'])}")
    m.add_argument("--enforce-eager", action="store_true", help="never capture CUDA graphs")
    m.add_argument("-O", dest="optimization_level", type=int, metavar="LEVEL",
                   help="-O0 and -O1: eager, no CUDA graphs (no level runs torch.compile); -O2: CUDA graphs for "
                        "decode and mixed steps (default); -O3: -O2 with larger capture sizes")
    m.add_argument("-cc", "--compilation-config", metavar="JSON",
                   help='CUDA-graph settings as JSON (vLLM\'s form), e.g. \'{"cudagraph_mode": "FULL_DECODE_ONLY"}\'; '
                        f"keys: {', '.join(COMPILATION_KEYS)}")
    m.add_argument("--io-processor-plugin",
                   help=f"IO processor plugin; installed: {_installed(choices['io_processor'])}")
    m.add_argument("--attention-backend",
                   help=f"attention backend; installed: {_installed(choices['attention_backend'])}")


def _add_kv_cache_args(parser: argparse.ArgumentParser, choices: Mapping[str, Sequence[str]]) -> None:
    """The "KV cache" group: block size, memory, prefix caching, cache dtype and KV transfer."""
    c = parser.add_argument_group("KV cache")
    c.add_argument("--block-size", type=int, help="tokens per KV block (power of two; default: the platform's)")
    c.add_argument("--gpu-memory-utilization", type=float, default=0.9,
                   help="fraction of GPU memory for weights, activations and the KV cache (default 0.9)")
    c.add_argument("--kv-cache-memory", type=float, dest="kv_cache_memory_gib", metavar="GIB",
                   help="KV cache size in GiB (overrides profiling; CPU default 1)")
    c.add_argument("--num-gpu-blocks-override", type=int, help="force this many KV blocks")
    c.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=None,
                   help="reuse KV blocks of shared prefixes (default on)")
    c.add_argument("--prefix-caching-hash-algo", choices=("sha256", "builtin"), default=None,
                   help="hash of a full KV block's tokens for prefix caching (default sha256)")
    c.add_argument("--kv-cache-dtype", default="auto",
                   help="auto (the model dtype), its name, or fp8 (alias fp8_e4m3): float8 e4m3, half the bytes of "
                        "bfloat16, with per-layer k_scale/v_scale from the checkpoint (else 1.0); not fp8_e5m2")
    c.add_argument("--kv-transfer-config", metavar="JSON",
                   help='{"kv_connector": NAME, "kv_role": "kv_producer"|"kv_consumer"|"kv_both", '
                        f'"kv_connector_extra_config": {{...}}}}; connectors: {_installed(choices["kv_connector"])}')


def _add_scheduler_args(parser: argparse.ArgumentParser) -> None:
    """The "scheduler" and "speculative decoding" groups."""
    s = parser.add_argument_group("scheduler")
    s.add_argument("--max-num-seqs", type=int, help="most requests running at once (default 256)")
    s.add_argument("--max-num-batched-tokens", type=int, help="token budget per step")
    s.add_argument("--enable-chunked-prefill", action=argparse.BooleanOptionalAction, default=None,
                   help="split long prompts across steps (default on)")
    s.add_argument("--long-prefill-token-threshold", type=int, help="cap on one prefill chunk per step")
    s.add_argument("--scheduling-policy", choices=("fcfs", "priority"), default=None,
                   help="fcfs (default): arrival order; priority: lowest request priority value first, then arrival")
    s.add_argument("--async-scheduling", action=argparse.BooleanOptionalAction, default=None,
                   help="schedule step N+1 while step N runs on the device (default: on for GPUs)")
    sp = parser.add_argument_group("speculative decoding")
    sp.add_argument("--speculative-config", metavar="JSON",
                    help='{"method": "ngram", "num_speculative_tokens": K, "prompt_lookup_max": N, '
                         '"prompt_lookup_min": M}: n-gram (prompt-lookup) drafts verified by the model')


def _add_lora_args(parser: argparse.ArgumentParser) -> None:
    """The "LoRA adapters" group."""
    lo = parser.add_argument_group("LoRA adapters")
    lo.add_argument("--enable-lora", action="store_true", default=None,
                    help="serve LoRA adapters on top of the model (requests pick one by its name as \"model\")")
    lo.add_argument("--lora-modules", nargs="+", action="extend", metavar="NAME=PATH",
                    help="adapters to serve: NAME=PATH of a PEFT folder, or JSON {\"name\": ..., \"path\": ...}; "
                         "several values, or the flag repeated")
    lo.add_argument("--max-loras", type=int, help="most distinct adapters in one batch (default 1)")
    lo.add_argument("--max-cpu-loras", type=int,
                    help="most adapters whose weights stay in host memory, least recently used evicted first "
                         "and read again from its folder when needed (default: --max-loras; at least --max-loras)")
    lo.add_argument("--max-lora-rank", type=int, help="largest adapter rank served (default 16)")


def _add_parallel_args(parser: argparse.ArgumentParser) -> None:
    """The "parallelism" group (docs/distributed.md)."""
    p = parser.add_argument_group("parallelism")
    p.add_argument("-tp", "--tensor-parallel-size", type=int, default=1, help="devices that shard each layer")
    p.add_argument("-pp", "--pipeline-parallel-size", type=int, default=1, help="pipeline stages")
    p.add_argument("--enable-expert-parallel", action="store_true", default=None, help="MoE: experts per DP x TP rank")
    p.add_argument("-dp", "--data-parallel-size", type=int, default=1,
                   help="engine replicas behind this front end, each with its own scheduler, KV cache and devices")
    p.add_argument("--distributed-executor-backend", choices=("uni", "mp", "ray"), default=None,
                   help="uni (default): the worker in the engine process; mp: in its own process")


def model_path(args: argparse.Namespace) -> str:
    """The model directory of parsed engine flags (MODEL or --model): a local directory, or a hub id's folder in
    the Hugging Face cache (``brigade.entrypoints.model_hub``), served under the hub id unless named otherwise.

    With neither, the model that ``scripts/setup.sh`` built (``brigade.cache_paths.default_model``) when it
    exists: one line on stderr says so, and ``args.model`` is set to it, so later calls (and the flags
    ``bench serve --launch`` passes on) name it without saying so again.

    Raises:
        ConfigError: none given and no set-up model, both given and different, not a model directory, or
            neither on disk nor fetchable from the hub; the message shows the command's own usage.
    """
    positional, flag = getattr(args, "model_tag", None), args.model
    if positional and flag and positional != flag:
        raise ConfigError(f"MODEL {positional!r} and --model {flag!r} disagree; give the model once")
    model = positional or flag
    command = getattr(args, "command", None) or "serve"
    if command == "bench" and getattr(args, "bench_command", None):
        command = f"bench {args.bench_command}"
    usage = "brigade generate PROMPT MODEL" if command == "generate" else f"brigade {command} MODEL"
    if not model:
        swallowed = [v for v in (getattr(args, "lora_modules", None) or []) if "=" not in v and not v.startswith("{")]
        if swallowed:  # --lora-modules takes several values: a model after it reads as one more adapter
            raise ConfigError(f"no model given: --lora-modules also took {swallowed[-1]!r}; put MODEL before "
                              f"--lora-modules ({usage} --lora-modules NAME=PATH ...)")
        names = _served_names(args)
        if len(names) > 1 and os.path.exists(names[-1]):  # --served-model-name takes several values too
            raise ConfigError(f"no model given: --served-model-name also took {names[-1]!r}; put MODEL before "
                              f"--served-model-name ({usage} --served-model-name NAME ...)")
        prompt = getattr(args, "prompt", None)
        if command == "generate" and isinstance(prompt, str) and os.path.isdir(prompt):
            raise ConfigError(f"the prompt {prompt!r} is a directory and no MODEL follows it: the prompt comes "
                              f"first ({usage}, or --model MODEL)")
        default = default_model()
        if default is None:
            raise ConfigError(f"no model given; pass an HF-format model directory: {usage} (or --model MODEL), "
                              f"or run ./scripts/setup.sh to build {DEFAULT_MODEL_NAME} in {default_model_dir()}")
        print(f"no model given: using the set-up's {DEFAULT_MODEL_NAME} at {default}", file=sys.stderr, flush=True)
        args.model = model = str(default)
    prompt = getattr(args, "prompt", None)
    if not os.path.exists(model) and command == "generate" and isinstance(prompt, str) and os.path.isdir(prompt):
        raise ConfigError(f"MODEL {model!r} does not exist, but the prompt {prompt!r} is a directory: "
                          f"the prompt comes first ({usage})")
    path, hub_id = resolve_model(model)  # a hub id: fetched once, then args name its folder (and it the model)
    if hub_id is not None:
        args.model, args.model_tag = path, None
        args.served_model_name = _served_names(args) or [hub_id]
    return path


def _served_names(args: argparse.Namespace) -> list[str]:
    """``--served-model-name``'s values (a list since it takes several; a string from older callers)."""
    value = getattr(args, "served_model_name", None)
    return [] if value is None else [value] if isinstance(value, str) else list(value)


def _check_choice(flag: str, value: str | None, installed: Sequence[str]) -> None:
    if value is not None and value not in installed:
        raise _unavailable(flag, value, installed)


def _unavailable(what: str, value: str, installed: Sequence[str]) -> ConfigError:
    """"is not installed", or why BRIGADE_PLUGINS keeps it out (brigade.plugins.unavailable_message)."""
    from brigade.plugins import unavailable_message

    return ConfigError(unavailable_message(what, value, installed))


def parse_kv_transfer_config(raw: str | None, connectors: Sequence[str]) -> KVTransferConfig | None:
    """``--kv-transfer-config`` JSON to a KVTransferConfig.

    Raises:
        ConfigError: bad JSON, unknown keys, an uninstalled connector or an unknown role (one line each).
    """
    if raw is None:
        return None
    expected = '{"kv_connector": NAME, "kv_role": "kv_both", "kv_connector_extra_config": {}}'
    try:
        data = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"--kv-transfer-config is not valid JSON ({exc.msg} at column {exc.colno}); "
                          f"expected {expected}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"--kv-transfer-config must be a JSON object; expected {expected}")
    unknown = sorted(set(data) - set(KV_TRANSFER_KEYS))
    if unknown:
        raise ConfigError(f"--kv-transfer-config has unknown keys {unknown}; allowed: {', '.join(KV_TRANSFER_KEYS)}")
    connector = data.get("kv_connector")
    if not isinstance(connector, str) or not connector:
        raise ConfigError(f"--kv-transfer-config needs \"kv_connector\"; installed connectors: "
                          f"{_installed(connectors)}")
    if connector not in connectors:
        raise _unavailable("--kv-transfer-config kv_connector", connector, connectors)
    role = data.get("kv_role", "kv_both")
    if role not in KV_ROLES:
        raise ConfigError(f"--kv-transfer-config kv_role {role!r} is not known; use {', '.join(KV_ROLES)}")
    extra = data.get("kv_connector_extra_config", {})
    if not isinstance(extra, dict):
        raise ConfigError("--kv-transfer-config kv_connector_extra_config must be a JSON object")
    return KVTransferConfig(kv_connector=connector, kv_role=role, kv_connector_extra_config=extra)


COMPILATION_KEYS = ("level", "cudagraph_mode", "cudagraph_capture_sizes", "mixed_capture_sizes")


def parse_compilation_config(raw: str | None, level: int | None) -> CompilationConfig:
    """``--compilation-config`` JSON (and ``-O``) to a CompilationConfig.

    Raises:
        ConfigError: bad JSON, not an object, unknown keys, a level that contradicts -O, or a bad value.
    """
    data: dict = {}
    if raw is not None:
        try:
            data = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"--compilation-config is not valid JSON ({exc.msg} at column {exc.colno}); expected "
                              'e.g. {"cudagraph_mode": "FULL_DECODE_ONLY"}') from None
        if not isinstance(data, dict):
            raise ConfigError('--compilation-config must be a JSON object, e.g. {"cudagraph_mode": "FULL"}')
        unknown = sorted(set(data) - set(COMPILATION_KEYS))
        if unknown:
            raise ConfigError(f"--compilation-config has unknown keys {unknown}; allowed: {', '.join(COMPILATION_KEYS)}")
    if "level" in data:
        if data["level"] not in (0, 1, 2, 3) or isinstance(data["level"], bool):
            raise ConfigError(f"--compilation-config level {data['level']!r} is not a level; use 0, 1, 2 or 3")
        if level is not None and level != data["level"]:
            raise ConfigError(f"-O{level} and --compilation-config level {data['level']} disagree; give one")
    elif level is not None:
        data["level"] = level
    return CompilationConfig(**data)


def parse_speculative_config(raw: str | None) -> SpeculativeConfig | None:
    """``--speculative-config`` JSON to a SpeculativeConfig (vLLM's form).

    Raises:
        ConfigError: bad JSON, not an object, unknown keys, an unsupported method or a bad value (one line each).
    """
    if raw is None:
        return None
    try:
        data = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"--speculative-config is not valid JSON ({exc.msg} at column {exc.colno}); expected "
                          '{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4}') from None
    return SpeculativeConfig.from_dict(data)


def parse_lora_modules(values: Sequence[str] | None) -> dict[str, str]:
    """``--lora-modules`` values (``NAME=PATH``, or vLLM's JSON ``{"name": NAME, "path": PATH}``) to a
    name -> path dict.

    Raises:
        ConfigError: a malformed value, an empty name or path, a name given twice, or a path that is not a folder.
    """
    modules: dict[str, str] = {}
    for value in values or []:
        name = path = None
        if value.lstrip().startswith("{"):
            try:
                data = json.loads(value)
            except json.JSONDecodeError:
                data = None
            if isinstance(data, dict) and isinstance(data.get("name"), str) and isinstance(data.get("path"), str):
                name, path = data["name"], data["path"]
        elif "=" in value:
            name, path = value.split("=", 1)
        if not name or not name.strip() or not path:
            raise ConfigError(f"--lora-modules {value!r} is not NAME=PATH (or JSON {{\"name\": ..., \"path\": ...}}); "
                              "e.g. --lora-modules sql=/adapters/sql-lora")
        if name in modules:
            raise ConfigError(f"--lora-modules: adapter name {name!r} is given twice ({modules[name]} and {path})")
        if not os.path.isdir(path):
            raise ConfigError(f"--lora-modules {name}={path}: {path!r} is not a folder; give a PEFT adapter folder "
                              "(adapter_config.json, adapter_model.safetensors)")
        modules[name] = path
    return modules


def lora_config_from_args(args: argparse.Namespace, served_name: str | list[str]) -> LoRAConfig | None:
    """The LoRAConfig of ``--enable-lora`` and its flags, or None without it.

    Raises:
        ConfigError: ``--lora-modules`` without ``--enable-lora``, a bad ``--lora-modules`` value, an adapter
            named like the served model, or a bad count.
    """
    values = getattr(args, "lora_modules", None)
    if not getattr(args, "enable_lora", None):
        if values:
            raise ConfigError("--lora-modules needs --enable-lora")
        return None
    config = LoRAConfig(**_set(dict(lora_modules=parse_lora_modules(values), max_loras=args.max_loras,
                                    max_cpu_loras=args.max_cpu_loras, max_lora_rank=args.max_lora_rank)))
    config.check_names(served_name)
    return config


def _set(values: Mapping[str, Any]) -> dict[str, Any]:
    """Only the flags the user gave, so each sub-config keeps its own defaults."""
    return {k: v for k, v in values.items() if v is not None}


def check_tokenizer_dir(path: str, flag: str = "--tokenizer") -> None:
    """A cheap look before any tokenizer loads: ``path`` must be a folder holding one of ``TOKENIZER_FILES``
    (or a ``*.tiktoken`` file), else transformers fails later with a long message suggesting packages to install.

    Raises:
        ConfigError: naming the flag, the folder and the files looked for.
    """
    if not os.path.isdir(path):
        raise ConfigError(f"{flag} {path!r} is not a folder; give the folder holding tokenizer.json "
                          "or tokenizer_config.json")
    try:
        names = os.listdir(path)
    except OSError as exc:
        raise ConfigError(f"{flag} {path!r} cannot be read ({exc.strerror or exc})") from None
    if not any(name in TOKENIZER_FILES or name.endswith(".tiktoken") for name in names):
        raise ConfigError(f"{flag} {path!r}: no tokenizer files ({', '.join(TOKENIZER_FILES)}) in that folder; "
                          "give the folder holding them")


def _check_paths(args: argparse.Namespace) -> None:
    """Flags naming files or folders must name existing ones (Brigade never fetches from a hub).

    ``--chat-template`` takes a file or the template text itself: a value with no Jinja markup (``{{``,
    ``{%``, ``{#``) that is not a file is a path with a typo, not a template.
    """
    if args.tokenizer is not None and not args.skip_tokenizer_init:
        check_tokenizer_dir(args.tokenizer)
    gen = args.generation_config
    if gen not in (None, "auto", "none", "vllm") and not os.path.isdir(gen):
        raise ConfigError(f"--generation-config {gen!r} is not a folder; use auto, none or the folder holding "
                          "generation_config.json")
    template = args.chat_template
    if template is not None and not os.path.isfile(template) and not any(m in template for m in ("{{", "{%", "{#")):
        raise ConfigError(f"--chat-template {template!r} is not a file and has no Jinja markup; give the path of "
                          "a .jinja file or the template text")
    if template is not None:
        check_chat_template(template)


def check_chat_template(template: str) -> None:
    """Compile a ``--chat-template`` (a file's path or the text) as transformers will, so a syntax error is
    one line at start-up instead of a 400 blamed on every chat request's messages.

    Raises:
        ConfigError: the file cannot be read, or the template does not compile (with Jinja's message and line).
    """
    import jinja2
    from transformers.utils.chat_template_utils import _compile_jinja_template

    from brigade.tokenizer import chat_template_text

    where = f"--chat-template {template}" if os.path.isfile(template) else "--chat-template"
    try:
        text = chat_template_text(template)
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{where}: cannot read it: {exc}") from exc
    try:
        _compile_jinja_template(text)
    except jinja2.TemplateSyntaxError as exc:
        raise ConfigError(f"{where} does not compile: {exc.message} (line {exc.lineno} of the template)") from exc


def runnable_config_from_args(args: argparse.Namespace) -> BrigadeConfig:
    """``config_from_args``, then ``BrigadeConfig.check_supported``, ``check_kv_transfer_config`` and, for the ray
    executor, ``check_ray_backend``: what every command that starts an engine needs before anything loads.

    Raises:
        ConfigError: a bad flag, or a setting this build cannot run; one line either way.
    """
    config = config_from_args(args)
    config.check_supported()
    check_kv_transfer_config(config.kv_transfer_config)
    if config.parallel_config.distributed_executor_backend == "ray":
        from brigade.executor.ray_cluster import check_ray_backend

        check_ray_backend()
    return config


def config_from_args(args: argparse.Namespace) -> BrigadeConfig:
    """Build the engine's BrigadeConfig from parsed engine flags.

    Raises:
        ConfigError: one line naming the flag and what would be right.
    """
    choices: Mapping[str, Sequence[str]] = getattr(args, _CHOICES_DEST, None) or {}
    model = model_path(args)
    dtype = DTYPE_ALIASES.get(args.dtype, args.dtype)
    if dtype not in DTYPE_CHOICES:
        raise ConfigError(f"--dtype {args.dtype!r} is not known; use one of {', '.join(DTYPE_CHOICES)} (or "
                          f"{', '.join(f'{a} for {n}' for a, n in DTYPE_ALIASES.items())})")
    if args.optimization_level is not None and args.optimization_level not in (0, 1, 2, 3):
        raise ConfigError(f"-O{args.optimization_level} is not a level; use -O0, -O1, -O2 or -O3")
    for flag, value, kind in (("--quantization", args.quantization, "quantization"),
                              ("--attention-backend", args.attention_backend, "attention_backend"),
                              ("--io-processor-plugin", args.io_processor_plugin, "io_processor")):
        _check_choice(flag, value, choices.get(kind, ()))
    _check_paths(args)
    if args.tokenizer is None and not args.skip_tokenizer_init:
        check_model_has_tokenizer(model)
    served_names = _served_names(args)
    for name in served_names:
        if not name.strip():
            raise ConfigError(f"--served-model-name {name!r} is empty; give the name clients send as \"model\", "
                              "or leave the flag out to use the model directory's name")
    model_config = ModelConfig(**_set(dict(
        model=model, tokenizer=args.tokenizer, served_model_name=served_names or None, dtype=dtype,
        max_model_len=args.max_model_len, seed=args.seed, load_format=args.load_format,
        generation_config=args.generation_config, chat_template=args.chat_template,
        quantization=args.quantization, enforce_eager=args.enforce_eager or None,
        io_processor_plugin=args.io_processor_plugin, skip_tokenizer_init=args.skip_tokenizer_init,
        trust_remote_code=getattr(args, "trust_remote_code", None))))
    cache_config = CacheConfig(**_set(dict(
        block_size=args.block_size, gpu_memory_utilization=args.gpu_memory_utilization,
        kv_cache_memory_gib=args.kv_cache_memory_gib, num_gpu_blocks_override=args.num_gpu_blocks_override,
        enable_prefix_caching=args.enable_prefix_caching, cache_dtype=args.kv_cache_dtype,
        prefix_caching_hash_algo=args.prefix_caching_hash_algo)))
    scheduler_config = SchedulerConfig(**_set(dict(
        max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens,
        enable_chunked_prefill=args.enable_chunked_prefill,
        long_prefill_token_threshold=args.long_prefill_token_threshold, policy=args.scheduling_policy,
        async_scheduling=args.async_scheduling)))
    parallel_config = ParallelConfig(**_set(dict(
        tensor_parallel_size=args.tensor_parallel_size, pipeline_parallel_size=args.pipeline_parallel_size,
        data_parallel_size=args.data_parallel_size, enable_expert_parallel=args.enable_expert_parallel,
        distributed_executor_backend=args.distributed_executor_backend)))
    compilation_config = parse_compilation_config(getattr(args, "compilation_config", None), args.optimization_level)
    return BrigadeConfig(
        model_config=model_config, cache_config=cache_config, scheduler_config=scheduler_config,
        parallel_config=parallel_config, compilation_config=compilation_config,
        kv_transfer_config=parse_kv_transfer_config(args.kv_transfer_config, choices.get("kv_connector", ())),
        lora_config=lora_config_from_args(args, model_config.served_model_names),
        attention_backend=args.attention_backend,
        speculative_config=parse_speculative_config(getattr(args, "speculative_config", None)))
