"""What a KV connector's two roles exchange with the scheduler and with each other (vLLM's KVConnectorBase_V1
contract): the per-step metadata and the view of a request the scheduler-role connector reads."""

from __future__ import annotations

from typing import Protocol


class KVConnectorMetadata:
    """Base of the message a scheduler-role connector sends its worker-role peer each step (inside
    ``SchedulerOutput.kv_connector_metadata``). Subclasses are slotted dataclasses that pickle: with the
    multiprocess executor they cross a pipe."""

    __slots__ = ()


class ConnectorRequest(Protocol):
    """What a scheduler-role connector may read of a request (the scheduler's ``Request`` satisfies it).

    Token counts are in tokens; ``num_computed_tokens`` counts tokens whose KV is in the local cache (or will be
    once the step's loads are done).
    """

    @property
    def request_id(self) -> str: ...

    @property
    def all_token_ids(self) -> list[int]: ...  # prompt + output so far

    @property
    def num_tokens(self) -> int: ...  # len(all_token_ids)

    @property
    def num_prompt_tokens(self) -> int: ...

    @property
    def num_computed_tokens(self) -> int: ...

    @property
    def cache_salt(self) -> str | None: ...  # mixed into the first block's key, as into its prefix-cache hash

    @property
    def lora_name(self) -> str | None: ...  # the request's LoRA adapter, None for the base model
