"""Platforms: what hardware Brigade runs on. The CPU platform lives in core; others are plugins."""

from brigade.platforms.interface import Platform

__all__ = ["Platform"]
