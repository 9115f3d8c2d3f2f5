"""The live runtime: stage processes on torch.distributed, live layer migration, monitoring.

:class:`AdaptivePipeline` is the library API: a user's own script, loop and data under torchrun.
``rlpipe run`` launches one process per stage on this machine (:mod:`rlpipe.runtime.launch`), each a
loop around it (:mod:`rlpipe.runtime.worker`); ``torchrun ... -m rlpipe.runtime ARGS`` runs the same
worker across machines through torchrun's rendezvous. Nothing else in rlpipe imports this package
except the CLI.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rlpipe.runtime.config import PipelineConfig

if TYPE_CHECKING:
    from rlpipe.runtime.pipeline import AdaptivePipeline

__all__ = ["AdaptivePipeline", "PipelineConfig"]


def __getattr__(name: str) -> Any:
    """``AdaptivePipeline`` on first use: a command that only reads the run's options (``rlpipe
    --help``, ``rlpipe partition``) does not import torch.distributed."""
    if name == "AdaptivePipeline":
        from rlpipe.runtime.pipeline import AdaptivePipeline

        return AdaptivePipeline
    raise AttributeError(f"module 'rlpipe.runtime' has no attribute '{name}'")
