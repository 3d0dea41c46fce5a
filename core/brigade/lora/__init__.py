"""Multi-LoRA serving (Hu et al. 2021, arXiv:2106.09685; punica and S-LoRA for batching).

``request`` names an adapter, ``adapter`` loads and checks a PEFT folder, ``layers`` adds the low-rank
delta inside a linear layer, ``manager`` gives the adapters of a batch their weight slots.
"""

from brigade.interfaces import LoRARequest

__all__ = ["LoRARequest"]
