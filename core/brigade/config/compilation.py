"""CompilationConfig: the optimization level (-O) and the CUDA-graph settings it implies."""

from __future__ import annotations

from dataclasses import dataclass

from brigade.config.errors import ConfigError


CUDAGRAPH_MODES = ("NONE", "FULL_DECODE_ONLY", "FULL")


@dataclass
class CompilationConfig:
    """Optimization level and CUDA graphs. Flags set by the user win over the level.

    What each level does (Brigade never runs torch.compile; its speed comes from the platform's hand-written
    kernels, which every level uses alike):

    * -O0 and -O1: eager, no CUDA graphs (-O1 is accepted for vLLM's flag and behaves exactly as -O0);
    * -O2 (default): ``cudagraph_mode`` FULL: decode graphs for batch sizes 1, 2, 4, then every 8 up to
      ``max_num_seqs``, and mixed-step graphs for token counts every 8 up to 256, every 16 up to 512;
    * -O3: as -O2, with decode graphs every 8 up to at least 512 requests and mixed-step graphs on to 1024
      tokens (every 32).
    """

    level: int = 2
    """-O0/-O1 eager, -O2 CUDA graphs (default), -O3 CUDA graphs with larger capture sizes; see the class."""
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
