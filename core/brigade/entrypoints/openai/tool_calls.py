"""Tool calling for /v1/chat/completions: OpenAI ``tools`` and ``tool_choice`` on any chat model.

How each ``tool_choice`` is served (the vLLM approach):
- ``"required"`` and a named function are enforced by structured output: the output must be a JSON array
  of ``{"name", "arguments"}`` objects (required) or the named function's arguments object, so every
  call parses and validates against its tool's ``parameters`` schema;
- ``"auto"`` (the default when tools are given) lets the model choose, and the answer is parsed for
  calls: ``<tool_call>{json}</tool_call>`` blocks (Hermes/Qwen style) or a bare JSON object or array with
  ``name`` and ``arguments``; anything else is plain content;
- ``"none"`` ignores the tools.
A chat template that knows nothing of tools (SmolLM2's) gets them described in the system message,
with the call format the parser reads; previous assistant tool calls are written back the same way.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field
from typing import Any

from brigade.entrypoints.openai.errors import OpenAIError
from brigade.entrypoints.openai.responses import DeltaFunctionCall, DeltaToolCall, FunctionCall, ToolCall
from brigade.sampling_params import InvalidParamError, StructuredOutputsParams
from brigade.structured_output import validate_structured_outputs

__all__ = ["ToolPlan", "ToolStream", "make_tool_plan", "parse_tool_calls"]

_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_OPEN, _CLOSE = "<tool_call>", "</tool_call>"
_BLOCK = re.compile(re.escape(_OPEN) + r"(.*?)(?:" + re.escape(_CLOSE) + r"|$)", re.S)
_EMPTY_PARAMETERS = {"type": "object", "properties": {}}


def new_tool_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


@dataclass(frozen=True)
class FunctionTool:
    """One ``{"type": "function", "function": {...}}`` entry of ``tools``."""

    name: str
    description: str | None
    parameters: dict[str, Any]

    def as_prompt_json(self) -> str:
        entry = {"name": self.name, "description": self.description, "parameters": self.parameters}
        return json.dumps({k: v for k, v in entry.items() if v is not None}, ensure_ascii=False)


@dataclass
class ToolPlan:
    """How one request uses its tools.

    Attributes:
        mode: "none", "auto", "required" or "named".
        tools: the request's functions by name (empty when mode is "none").
        named: the forced function's name (mode "named").
        parallel: several calls may be made in one answer (``parallel_tool_calls``, default true).
    """

    mode: str
    tools: dict[str, FunctionTool] = field(default_factory=dict)
    named: str | None = None
    parallel: bool = True

    @property
    def active(self) -> bool:
        return self.mode != "none"

    def finish_reason(self, finish_reason: str | None) -> str | None:
        """The finish reason of a choice that made calls: "tool_calls" for a normal stop when the model chose
        to call (auto, required); a forced named function keeps "stop", as OpenAI and vLLM report it."""
        return "tool_calls" if finish_reason == "stop" and self.mode in ("auto", "required") else finish_reason

    def constraint(self) -> StructuredOutputsParams | None:
        """The grammar that forces the calls (required / named), else None."""
        if self.mode == "named":
            return StructuredOutputsParams(json=self.tools[self.named].parameters)
        if self.mode != "required":
            return None
        calls = [{"type": "object", "properties": {"name": {"type": "string", "enum": [t.name]},
                                                   "arguments": t.parameters},
                  "required": ["name", "arguments"]} for t in self.tools.values()]
        schema: dict[str, Any] = {"type": "array", "minItems": 1,
                                  "items": calls[0] if len(calls) == 1 else {"anyOf": calls}}
        if not self.parallel:
            schema["maxItems"] = 1
        return StructuredOutputsParams(json=schema)

    def system_prompt(self) -> str:
        """The tool description written into the system message for templates without tool support."""
        lines = ["You may call functions to answer. To call one, reply with",
                 _OPEN + '{"name": "<function name>", "arguments": {<arguments as JSON>}}' + _CLOSE,
                 "Available functions:"]
        lines += [t.as_prompt_json() for t in self.tools.values()]
        return "\n".join(lines)

    def calls_from_output(self, text: str) -> list[ToolCall] | None:
        """The calls in a finished answer, or None when it holds none (it is then plain content)."""
        if self.mode == "named":
            return [ToolCall(id=new_tool_call_id(), function=FunctionCall(name=self.named, arguments=text.strip()))]
        if self.mode == "required":
            # A cut-off answer (max_tokens inside the array, e.g. a small model repeating its call) still
            # yields the calls it completed.
            return _calls_from_json(text, self.tools) or _calls_from_items(_complete_array_items(text), self.tools)
        if self.mode == "auto":
            return parse_tool_calls(text, self.tools)[1] or None
        return None


def make_tool_plan(tools: list[dict[str, Any]] | None, tool_choice: str | dict[str, Any] | None,
                   parallel_tool_calls: bool | None, *, other_constraint: bool) -> ToolPlan:
    """Validate ``tools`` and ``tool_choice`` and decide how they are served.

    Args:
        other_constraint: the request also sets response_format or structured_outputs.
    Raises:
        OpenAIError: 400 naming ``tools`` or ``tool_choice`` (malformed entry, duplicate or bad name,
            a parameters schema xgrammar rejects, an unknown forced function, a conflicting constraint).
    """
    choice = "auto" if tool_choice is None else tool_choice
    named = None
    if isinstance(choice, dict):
        function = choice.get("function") if choice.get("type") == "function" else None
        named = function.get("name") if isinstance(function, dict) else None
        if not isinstance(named, str):
            raise OpenAIError.bad_param('tool_choice must be "none", "auto", "required" or '
                                        '{"type": "function", "function": {"name": ...}}', "tool_choice")
        choice = "named"
    elif choice not in ("none", "auto", "required"):
        raise OpenAIError.bad_param(f'tool_choice {choice!r} is not one of "none", "auto", "required" or a named '
                                    "function", "tool_choice")
    if not tools:
        if choice in ("required", "named"):
            raise OpenAIError.bad_param("tool_choice forces a tool call but no tools are given", "tool_choice")
        return ToolPlan("none")
    functions = _parse_tools(tools)
    if choice == "named" and named not in functions:
        raise OpenAIError.bad_param(f"tool_choice names function {named!r}, which is not in tools", "tool_choice")
    if choice in ("required", "named") and other_constraint:
        raise OpenAIError.bad_param("a forced tool call cannot be combined with response_format or "
                                    "structured_outputs", "tool_choice")
    plan = ToolPlan(choice, functions if choice != "none" else {}, named, parallel_tool_calls is not False)
    constraint = plan.constraint()
    if constraint is not None:
        try:
            validate_structured_outputs(constraint, param="tools")
        except InvalidParamError as exc:
            raise OpenAIError.bad_param(str(exc), "tools") from None
    return plan


def _parse_tools(tools: list[dict[str, Any]]) -> dict[str, FunctionTool]:
    functions: dict[str, FunctionTool] = {}
    for i, tool in enumerate(tools):
        function = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(tool, dict) or tool.get("type", "function") != "function" or not isinstance(function, dict):
            raise OpenAIError.bad_param(f'tools[{i}] must be {{"type": "function", "function": {{...}}}}', "tools")
        name = function.get("name")
        if not isinstance(name, str) or not _NAME.match(name):
            raise OpenAIError.bad_param(f"tools[{i}].function.name must be 1-64 letters, digits, _ or -", "tools")
        if name in functions:
            raise OpenAIError.bad_param(f"tools has two functions named {name!r}", "tools")
        parameters = function.get("parameters", _EMPTY_PARAMETERS)
        if not isinstance(parameters, dict):
            raise OpenAIError.bad_param(f"tools[{i}].function.parameters must be a JSON schema object", "tools")
        try:
            validate_structured_outputs(StructuredOutputsParams(json=parameters or _EMPTY_PARAMETERS),
                                        param="tools")
        except InvalidParamError as exc:
            raise OpenAIError.bad_param(f"tools[{i}] ({name}): {exc}", "tools") from None
        description = function.get("description")
        functions[name] = FunctionTool(name, description if isinstance(description, str) else None,
                                       parameters or _EMPTY_PARAMETERS)
    return functions


# ---- conversation -----------------------------------------------------------------------------------

def prepare_conversation(conversation: list[dict[str, Any]], plan: ToolPlan,
                         template_knows_tools: bool) -> list[dict[str, Any]]:
    """Make a template without tool support see the tools and earlier calls (a new list; input unchanged)."""
    if template_knows_tools:
        return conversation
    out = []
    for message in conversation:
        message = dict(message)
        calls = message.pop("tool_calls", None)
        if calls:  # an earlier assistant turn that called tools, written back in the format we parse
            blocks = [_OPEN + json.dumps({"name": c.get("function", {}).get("name"),
                                          "arguments": _json_or_text(c.get("function", {}).get("arguments"))},
                                         ensure_ascii=False) + _CLOSE for c in calls if isinstance(c, dict)]
            message["content"] = "\n".join(filter(None, [message.get("content") or "", *blocks]))
        out.append(message)
    if plan.active:
        if out and out[0].get("role") == "system":
            out[0] = {**out[0], "content": f"{out[0].get('content') or ''}\n\n{plan.system_prompt()}".lstrip()}
        else:
            out.insert(0, {"role": "system", "content": plan.system_prompt()})
    return out


def _json_or_text(value: Any) -> Any:
    if isinstance(value, str):
        try:
            return json.loads(value)
        except json.JSONDecodeError:
            return value
    return value


# ---- parsing ----------------------------------------------------------------------------------------

def _call(obj: Any, tools: dict[str, FunctionTool]) -> ToolCall | None:
    if not isinstance(obj, dict) or obj.get("name") not in tools:
        return None
    arguments = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(arguments, str):
        arguments = _json_or_text(arguments)
    if not isinstance(arguments, dict):
        return None
    return ToolCall(id=new_tool_call_id(), function=FunctionCall(name=obj["name"],
                                                                 arguments=json.dumps(arguments, ensure_ascii=False)))


def _calls_from_json(text: str, tools: dict[str, FunctionTool]) -> list[ToolCall] | None:
    """Calls from a JSON object or array of ``{"name", "arguments"}``; None unless every entry is one."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        return None
    return _calls_from_items(value if isinstance(value, list) else [value], tools)


def _calls_from_items(items: list[Any], tools: dict[str, FunctionTool]) -> list[ToolCall] | None:
    calls = [_call(item, tools) for item in items]
    return calls if calls and all(c is not None for c in calls) else None


def _complete_array_items(text: str) -> list[Any]:
    """The whole items at the start of a JSON array that was cut off: ``[{..}, {..}, {"na`` -> two items.

    Returns [] when ``text`` does not start with an array.
    """
    s = text.lstrip()
    if not s.startswith("["):
        return []
    decoder, items, i = json.JSONDecoder(), [], 1
    while True:
        while i < len(s) and s[i].isspace():
            i += 1
        if i >= len(s) or s[i] == "]":
            return items
        try:
            item, i = decoder.raw_decode(s, i)
        except json.JSONDecodeError:
            return items
        items.append(item)
        while i < len(s) and s[i].isspace():
            i += 1
        if i >= len(s) or s[i] != ",":
            return items
        i += 1


def parse_tool_calls(text: str, tools: dict[str, FunctionTool]) -> tuple[str | None, list[ToolCall]]:
    """Split a free-form answer into (content, calls).

    ``<tool_call>`` blocks are calls when their JSON names a known tool; otherwise a whole answer that is
    JSON naming known tools is one or several calls. A block that does not parse stays in the content,
    so nothing the model wrote is lost.
    """
    if _OPEN in text:
        calls: list[ToolCall] = []
        kept: list[str] = []
        last = 0
        for match in _BLOCK.finditer(text):
            parsed = _calls_from_json(match.group(1).strip(), tools)
            if parsed is None:
                continue
            kept.append(text[last:match.start()])
            last = match.end()
            calls.extend(parsed)
        if calls:
            content = ("".join(kept) + text[last:]).strip()
            return content or None, calls
    stripped = text.strip()
    if stripped[:1] in ("{", "["):
        parsed = _calls_from_json(stripped, tools)
        if parsed:
            return None, parsed
    return text, []


# ---- streaming ----------------------------------------------------------------------------------------

@dataclass
class StreamDelta:
    """What one choice sends in one chunk: content text, tool call deltas, or both."""

    content: str | None = None
    tool_calls: list[DeltaToolCall] | None = None


class ToolStream:
    """One streamed choice under a ToolPlan: holds back text that may become a tool call.

    Named calls stream their arguments as they are generated; required calls are sent whole once the
    array is complete; under "auto", text is streamed as content until it may be starting a call (a
    ``<tool_call>`` tag, or an answer opening with ``{`` or ``[``), and what was held back is parsed at
    the end.
    """

    def __init__(self, plan: ToolPlan):
        self.plan = plan
        self.text = ""
        self.sent = 0  # characters of text already sent as content (auto) or arguments (named)
        self.header_sent = False
        self.call_id = new_tool_call_id()

    def feed(self, new_text: str) -> StreamDelta:
        """The part of ``new_text`` that can be sent now."""
        self.text += new_text
        mode = self.plan.mode
        if mode == "named":
            arguments, self.sent = self.text[self.sent:], len(self.text)
            if not arguments and self.header_sent:
                return StreamDelta()
            return StreamDelta(tool_calls=[self._named_delta(arguments)])
        if mode == "required":
            return StreamDelta()
        if mode == "auto":
            safe = self._auto_safe_end()
            content, self.sent = self.text[self.sent:safe], max(self.sent, safe)
            return StreamDelta(content=content or None)
        content, self.sent = self.text[self.sent:], len(self.text)
        return StreamDelta(content=content)

    def _named_delta(self, arguments: str) -> DeltaToolCall:
        if self.header_sent:
            return DeltaToolCall(index=0, function=DeltaFunctionCall(arguments=arguments))
        self.header_sent = True
        return DeltaToolCall(index=0, id=self.call_id, type="function",
                             function=DeltaFunctionCall(name=self.plan.named, arguments=arguments))

    def _auto_safe_end(self) -> int:
        """Where the text stops being surely plain content."""
        text = self.text
        if not text.strip() or text.lstrip()[0] in "{[":
            return self.sent  # blank so far, or a possible bare-JSON call: hold everything back
        tag = text.find(_OPEN)
        if tag >= 0:
            return max(self.sent, tag)
        for k in range(min(len(_OPEN) - 1, len(text)), 0, -1):  # a tag may be arriving in pieces
            if text.endswith(_OPEN[:k]):
                return max(self.sent, len(text) - k)
        return len(text)

    def finish(self, finish_reason: str | None) -> tuple[StreamDelta, str | None]:
        """The last delta of the choice and its finish reason (ToolPlan.finish_reason when it made calls:
        "tool_calls" under auto and required, "stop" for a forced named function)."""
        mode = self.plan.mode
        if mode == "named":
            delta = StreamDelta(tool_calls=None if self.header_sent else [self._named_delta("")])
            return delta, self.plan.finish_reason(finish_reason)
        rest = self.text[self.sent:]
        if mode not in ("required", "auto"):
            return StreamDelta(content=rest or None), finish_reason
        calls = self.plan.calls_from_output(self.text)
        if not calls:
            return StreamDelta(content=rest or None), finish_reason
        content = None
        if mode == "auto":
            content = parse_tool_calls(rest, self.plan.tools)[0] if _OPEN in rest else None
        deltas = [DeltaToolCall(index=i, id=c.id, type="function",
                                function=DeltaFunctionCall(name=c.function.name, arguments=c.function.arguments))
                  for i, c in enumerate(calls)]
        return StreamDelta(content=content, tool_calls=deltas), self.plan.finish_reason(finish_reason)
