"""A request's chat-template options, resolved as vLLM resolves them, before anything is rendered.

``chat_template_kwargs`` override the server's defaults for the template's variables: ``add_generation_prompt``,
``continue_final_message``, ``documents`` and any free variable the template reads (``enable_thinking``, a
special token...). Keys that are ``apply_chat_template``'s own control arguments (CONTROL_ARGUMENTS: the
conversation, the template itself, tokenizing and its outputs, and ``tools``, which comes from the request's
``tools`` field) are refused with a 400 naming them, instead of reaching the call twice (a TypeError, once a
500).

A ``chat_template`` in the request body is refused: vLLM takes one only from a server started with
``--trust-request-chat-template``, since a request's template is Jinja the server runs; this server takes no
request templates (``--chat-template`` sets the server's).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any

from brigade.entrypoints.openai.errors import OpenAIError

TEMPLATE_VARIABLES = frozenset({"add_generation_prompt", "continue_final_message", "documents"})
"""apply_chat_template's arguments that are passed on to the template as variables: a request may set them."""

CONTROL_ARGUMENTS = frozenset({"conversation", "messages", "tools", "chat_template", "tokenize", "return_dict",
                               "return_tensors", "padding", "truncation", "max_length", "return_assistant_tokens_mask",
                               "tokenizer_kwargs", "sanitize_control_tokens", "self"})
"""apply_chat_template's (and the template renderer's) own arguments, which a request's chat_template_kwargs may
not set; control_arguments() adds those of the installed transformers."""


def control_arguments(tokenizer: Any) -> frozenset[str]:
    """CONTROL_ARGUMENTS plus every other named parameter of ``tokenizer.apply_chat_template`` that is not a
    template variable (a newer transformers may add some)."""
    try:
        params = inspect.signature(tokenizer.apply_chat_template).parameters.values()
    except (AttributeError, TypeError, ValueError):  # no tokenizer, or a signature inspect cannot read
        return CONTROL_ARGUMENTS
    named = {p.name for p in params if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)}
    return CONTROL_ARGUMENTS | (named - TEMPLATE_VARIABLES)


@dataclass
class TemplateOptions:
    """What the template is rendered with: the two flags the server itself reads, and the other variables."""

    add_generation_prompt: bool
    continue_final_message: bool
    variables: dict[str, Any] = field(default_factory=dict)


def template_options(kwargs: dict[str, Any] | None, *, add_generation_prompt: bool, continue_final_message: bool,
                     control: frozenset[str] = CONTROL_ARGUMENTS) -> TemplateOptions:
    """Merge a request's ``chat_template_kwargs`` over its ``add_generation_prompt`` and
    ``continue_final_message`` fields (the kwargs win, as in vLLM).

    Continuing the final message turns the generation prompt off unless the kwargs ask for it explicitly.

    Raises:
        OpenAIError: 400 naming chat_template_kwargs for a control argument (``control``), a non-boolean
            add_generation_prompt or continue_final_message, or add_generation_prompt set true by the kwargs
            while the final message is continued.
    """
    variables = dict(kwargs or {})
    refused = sorted(k for k in variables if k in control)
    if refused:
        names = ", ".join(repr(k) for k in refused)
        hint = "; send tools in the request's tools field" if "tools" in refused else ""
        raise OpenAIError.bad_param(f"chat_template_kwargs may not set {names}: an argument of the chat template "
                                    f"call, not a template variable{hint}", "chat_template_kwargs")
    for key in ("add_generation_prompt", "continue_final_message"):
        if key in variables and not isinstance(variables[key], bool):
            raise OpenAIError.bad_param(f"chat_template_kwargs.{key} must be true or false, got "
                                        f"{variables[key]!r}", "chat_template_kwargs")
    continue_final = variables.pop("continue_final_message", continue_final_message)
    add_prompt = variables.pop("add_generation_prompt", add_generation_prompt and not continue_final)
    if add_prompt and continue_final:  # only when the kwargs set add_generation_prompt true
        raise OpenAIError.bad_param("chat_template_kwargs sets add_generation_prompt true while "
                                    "continue_final_message is true; they exclude each other", "chat_template_kwargs")
    return TemplateOptions(add_prompt, continue_final, variables)


def refuse_request_chat_template(template: str | None) -> None:
    """Raises OpenAIError: 400 naming chat_template when a request brings its own template (null is "not given")."""
    if template is not None:
        raise OpenAIError.bad_param("this server does not accept chat templates in requests; start it with "
                                    "--chat-template to use another template", "chat_template")
