"""The live runtime: stage processes on torch.distributed, live layer migration, monitoring.

``rlpipe run`` launches one process per stage on this machine (:mod:`rlpipe.runtime.launch`);
``torchrun ... -m rlpipe.runtime ARGS`` runs the same worker (:mod:`rlpipe.runtime.worker`) across
machines through torchrun's rendezvous. Nothing else in rlpipe imports this package except the CLI.
"""
