"""The types that cross a layer or process boundary; the ground floor every other layer builds on.

It imports no other Brigade layer, only ``brigade.sampling_params`` (the user-facing ``SamplingParams`` that
requests carry), so any layer may import it and none has to import another's messages:

- ``engine_io``: front end <-> EngineCore messages (msgspec structs over ZMQ).
- ``scheduler_output``: scheduler -> model runner, one step's plan.
- ``runner_output``: model runner -> scheduler, one step's results (and the handle of one still on the device).
- ``lora_request``: which LoRA adapter a request runs with.
- ``kv_connector``: what a KV connector's scheduler and worker roles exchange, and the request view it reads.
- ``outputs``: what ``LLM.generate`` and the server hand back to users.
- ``stats``: per-step statistics and the interface of the loggers that publish them.
"""

from brigade.interfaces.engine_io import (EngineCoreOutput, EngineCoreOutputs, EngineCoreRequest,
                                          EngineCoreRequestType, EngineCoreUtility, FinishReason, LogprobsLists,
                                          UtilityMethod)
from brigade.interfaces.kv_connector import ConnectorRequest, KVConnectorMetadata
from brigade.interfaces.lora_request import LoRARequest
from brigade.interfaces.outputs import CompletionOutput, Logprob, RequestOutput, SampleLogprobs
from brigade.interfaces.runner_output import AsyncModelRunnerOutput, ModelRunnerOutput, RequestFailure
from brigade.interfaces.scheduler_output import CachedRequestData, NewRequestData, SchedulerOutput
from brigade.interfaces.stats import (FinishedRequestStats, IterationStats, SchedulerStats, SpecDecodingStats,
                                      StatLoggerBase)

__all__ = [
    "AsyncModelRunnerOutput", "CachedRequestData", "CompletionOutput", "ConnectorRequest", "EngineCoreOutput",
    "EngineCoreOutputs", "EngineCoreRequest", "EngineCoreRequestType", "EngineCoreUtility", "FinishedRequestStats",
    "FinishReason", "IterationStats", "KVConnectorMetadata", "Logprob", "LogprobsLists", "LoRARequest",
    "ModelRunnerOutput", "NewRequestData", "RequestFailure", "RequestOutput", "SampleLogprobs", "SchedulerOutput",
    "SchedulerStats", "SpecDecodingStats", "StatLoggerBase", "UtilityMethod",
]
