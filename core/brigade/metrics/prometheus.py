"""PrometheusStatLogger: publishes engine statistics as ``brigade:`` metrics mirroring vLLM's names.

Each logger owns its CollectorRegistry (no process-global registry), so several apps or tests in one
process never collide. Counters follow Prometheus naming: ``brigade:prompt_tokens`` is exposed as
``brigade:prompt_tokens_total``. Every series has a ``model_name`` label, as in vLLM, so existing
dashboards carry over.

What an engine core reports (``SchedulerStats``: the running / waiting / KV gauges, the prefix-cache and preemption
counters, LoRA info) carries vLLM's ``engine`` label too, the data-parallel engine's index ("0" without data
parallelism): with ``-dp N`` each engine has its own series, and a total is their sum (``sum without (engine)``).
What the front end counts (tokens, finished requests, latencies, speculative-decoding counters) has no ``engine``
label: those series are already totals over the engines.

MoE models add ``brigade:moe_expert_tokens_total`` (labels ``engine``, ``layer``: the decoder layer index,
``expert``: the global expert id): assignments of a token to an expert, summed over steps, so that each layer's
series sum to its tokens times ``top_k``; an operator reads expert imbalance from their spread. The series appear
with the first step an MoE engine reports.
"""

from __future__ import annotations

from prometheus_client import (CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram,
                               disable_created_metrics, generate_latest)

from brigade.interfaces import IterationStats, SchedulerStats, StatLoggerBase

# Bucket edges in seconds: fine below a second, where interactive latencies live, then coarse.
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0, 160.0, 640.0)
ITL_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0,
               10.0, 20.0, 40.0, 80.0)
E2E_BUCKETS = (0.1, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
               240.0, 480.0, 960.0, 1920.0, 7680.0)

FINISH_REASONS = ("stop", "length", "abort", "error")

# The series each engine core reports, one per engine (``engine`` label): key, kind, name, help.
ENGINE_SERIES = (
    ("running", Gauge, "num_requests_running", "Requests in the running batch."),
    ("waiting", Gauge, "num_requests_waiting", "Requests waiting to be scheduled."),
    ("kv_usage", Gauge, "kv_cache_usage_perc", "Fraction of KV cache blocks in use (0 to 1)."),
    ("free_blocks", Gauge, "num_free_blocks", "KV cache blocks in the free pool (cached ones included)."),
    ("total_blocks", Gauge, "num_total_blocks", "KV cache blocks in the pool."),
    ("prefix_queries", Counter, "prefix_cache_queries", "Prompt tokens looked up in the prefix cache."),
    ("prefix_hits", Counter, "prefix_cache_hits", "Prompt tokens found in the prefix cache."),
    ("preemptions", Counter, "num_preemptions", "Requests preempted for lack of KV blocks."),
)


class PrometheusStatLogger(StatLoggerBase):
    """Gauges from the latest SchedulerStats, counters and histograms from every IterationStats.

    Args:
        model_name: the served model name (the ``model_name`` label).
        num_engines: data-parallel engines (``-dp``): their per-engine series exist, at 0, from the start.
        registry: where the metrics live; a fresh CollectorRegistry when None.
        max_loras: ``--max-loras`` when LoRA is enabled: adds vLLM's info gauge ``brigade:lora_requests_info``
            (labels ``max_lora``, ``running_lora_adapters``, ``waiting_lora_adapters``: comma-separated adapter
            names; ``engine``; value: when it was last set, in Unix seconds). Only each engine's latest label set is
            kept.
        num_speculative_tokens: k of ``--speculative-config``: adds vLLM's speculative decoding counters
            ``brigade:spec_decode_num_drafts``, ``..._num_draft_tokens``, ``..._num_accepted_tokens`` and
            ``..._num_accepted_tokens_per_pos`` (label ``position``, 0 to k - 1).
    """

    def __init__(self, model_name: str, registry: CollectorRegistry | None = None, max_loras: int | None = None,
                 num_speculative_tokens: int | None = None, num_engines: int = 1):
        disable_created_metrics()  # no `<counter>_created` series beside each counter, as vLLM exports them
        self.registry = registry if registry is not None else CollectorRegistry()
        labels = ["model_name"]
        reg = self.registry
        self._model_name = model_name
        self._engine_families = {key: kind(f"brigade:{name}", doc, labels + ["engine"], registry=reg)
                                 for key, kind, name, doc in ENGINE_SERIES}
        self._engines: dict[int, dict] = {}  # engine index -> its children of the families above
        for engine_index in range(num_engines):
            self._engine_series(engine_index)

        def counter(name: str, doc: str) -> Counter:
            return Counter(f"brigade:{name}", doc, labels, registry=reg).labels(model_name)

        def histogram(name: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
            return Histogram(f"brigade:{name}", doc, labels, buckets=buckets, registry=reg).labels(model_name)

        self.prompt_tokens = counter("prompt_tokens", "Prompt tokens processed.")
        self.generation_tokens = counter("generation_tokens", "Tokens generated.")
        success = Counter("brigade:request_success", "Finished requests, by finish reason.",
                          labels + ["finished_reason"], registry=reg)
        # Create every reason up front so the series exist (at 0) before the first request finishes.
        self.request_success = {reason: success.labels(model_name, reason) for reason in FINISH_REASONS}
        self._success_family = success
        self.time_to_first_token = histogram("time_to_first_token_seconds", "Time to first token.", TTFT_BUCKETS)
        self.inter_token_latency = histogram("inter_token_latency_seconds", "Time between output tokens.",
                                             ITL_BUCKETS)
        self.e2e_request_latency = histogram("e2e_request_latency_seconds", "Arrival to last token.", E2E_BUCKETS)
        self.max_loras = max_loras
        self.lora_info = None if max_loras is None else Gauge(
            "brigade:lora_requests_info", "Running and waiting LoRA adapters (labels); value: last update time.",
            ["max_lora", "running_lora_adapters", "waiting_lora_adapters", "engine"], registry=reg)
        self._lora_labels: dict[int, tuple[str, str, str, str]] = {}  # engine index -> its current label set
        self.spec_decode = None
        if num_speculative_tokens is not None:
            per_pos = Counter("brigade:spec_decode_num_accepted_tokens_per_pos",
                              "Accepted draft tokens, by position in the drafts (0 = first).",
                              labels + ["position"], registry=reg)
            self.spec_decode = {
                "num_drafts": counter("spec_decode_num_drafts", "Requests' drafts verified (one per request "
                                      "per step with drafts)."),
                "num_draft_tokens": counter("spec_decode_num_draft_tokens", "Draft tokens verified."),
                "num_accepted_tokens": counter("spec_decode_num_accepted_tokens", "Draft tokens accepted."),
                "per_pos": [per_pos.labels(model_name, str(i)) for i in range(num_speculative_tokens)]}
        self.moe_expert_tokens = Counter("brigade:moe_expert_tokens", "Tokens routed to each expert of each MoE "
                                         "layer (a token counts once per expert of its top-k).",
                                         labels + ["engine", "layer", "expert"], registry=reg)
        self.time_per_output_token = histogram("request_time_per_output_token_seconds",
                                               "Mean time per output token after the first, per request.",
                                               ITL_BUCKETS)

    def _engine_series(self, engine_index: int) -> dict:
        """The per-engine children (``engine`` label) of one data-parallel engine, made on first use."""
        series = self._engines.get(engine_index)
        if series is None:
            series = self._engines[engine_index] = {
                key: family.labels(self._model_name, str(engine_index))
                for key, family in self._engine_families.items()}
        return series

    def record(self, scheduler_stats: SchedulerStats | None, iteration_stats: IterationStats) -> None:
        """Fold one step's statistics into the metrics (O(tokens of the step); never blocks). The scheduler
        stats go to the series of their engine (``SchedulerStats.engine_index``)."""
        if scheduler_stats is not None:
            engine = self._engine_series(scheduler_stats.engine_index)
            engine["running"].set(scheduler_stats.num_running_reqs)
            engine["waiting"].set(scheduler_stats.num_waiting_reqs)
            engine["prefix_queries"].inc(scheduler_stats.prefix_cache_queries)
            engine["prefix_hits"].inc(scheduler_stats.prefix_cache_hits)
            engine["preemptions"].inc(scheduler_stats.num_preemptions)
            if scheduler_stats.num_total_blocks:
                self.set_kv_cache_blocks(scheduler_stats.num_free_blocks, scheduler_stats.num_total_blocks,
                                         scheduler_stats.engine_index)
            else:
                engine["kv_usage"].set(scheduler_stats.kv_cache_usage)
            if self.lora_info is not None:
                self._set_lora_info(scheduler_stats)
            if scheduler_stats.expert_tokens:
                self._count_expert_tokens(scheduler_stats)
            spec = scheduler_stats.spec_decoding
            if self.spec_decode is not None and spec is not None:
                self.spec_decode["num_drafts"].inc(spec.num_drafts)
                self.spec_decode["num_draft_tokens"].inc(spec.num_draft_tokens)
                self.spec_decode["num_accepted_tokens"].inc(spec.num_accepted_tokens)
                for child, count in zip(self.spec_decode["per_pos"], spec.num_accepted_tokens_per_pos):
                    child.inc(count)
        self.prompt_tokens.inc(iteration_stats.num_prompt_tokens)
        self.generation_tokens.inc(iteration_stats.num_generation_tokens)
        for ttft in iteration_stats.time_to_first_tokens_s:
            self.time_to_first_token.observe(ttft)
        for itl in iteration_stats.inter_token_latencies_s:
            self.inter_token_latency.observe(itl)
        for finished in iteration_stats.finished_requests:
            self._success(finished.finish_reason).inc()
            self.e2e_request_latency.observe(finished.e2e_latency_s)
            if finished.tpot_s is not None:
                self.time_per_output_token.observe(finished.tpot_s)

    def _count_expert_tokens(self, stats: SchedulerStats) -> None:
        engine = str(stats.engine_index)
        for layer, counts in stats.expert_tokens.items():
            for expert, count in enumerate(counts):
                self.moe_expert_tokens.labels(self._model_name, engine, str(layer), str(expert)).inc(count)

    def _set_lora_info(self, stats: SchedulerStats) -> None:
        labels = (str(self.max_loras), ",".join(sorted(stats.running_lora_adapters)),
                  ",".join(sorted(stats.waiting_lora_adapters)), str(stats.engine_index))
        previous = self._lora_labels.get(stats.engine_index)
        if labels != previous:
            if previous is not None:
                self.lora_info.remove(*previous)
            self._lora_labels[stats.engine_index] = labels
        self.lora_info.labels(*labels).set_to_current_time()

    def set_kv_cache_blocks(self, num_free_blocks: int, num_total_blocks: int, engine_index: int = 0) -> None:
        """Refresh one engine's KV gauges from a block count (a step's stats, or a direct query when idle)."""
        engine = self._engine_series(engine_index)
        engine["free_blocks"].set(num_free_blocks)
        engine["total_blocks"].set(num_total_blocks)
        used = num_total_blocks - num_free_blocks
        engine["kv_usage"].set(used / num_total_blocks if num_total_blocks else 0.0)

    def _success(self, reason: str):
        child = self.request_success.get(reason)
        if child is None:
            child = self.request_success[reason] = self._success_family.labels(self._model_name, reason)
        return child

    def render(self) -> tuple[bytes, str]:
        """The exposition text and its content type, for GET /metrics."""
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
