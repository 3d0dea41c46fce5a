"""SpeculativeConfig: the speculative decoding method and its draft settings."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from brigade.config.errors import ConfigError


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
