"""Attention: the backend interface, its per-step metadata, and the reference PyTorch backend."""

from brigade.attention.backend import AttentionBackend, AttentionContext, AttentionMetadata

__all__ = ["AttentionBackend", "AttentionContext", "AttentionMetadata"]
