"""Structured output: grammar constraints (JSON schema, regex, choice, EBNF) through xgrammar."""

from brigade.structured_output.manager import StructuredOutputManager
from brigade.structured_output.spec import GrammarSpec, validate_structured_outputs

__all__ = ["GrammarSpec", "StructuredOutputManager", "validate_structured_outputs"]
