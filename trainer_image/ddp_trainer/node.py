"""``python -m ddp_trainer.node ARGS...``: the command a node pod runs (the operator renders it):
torchrun under the supervisor that outlives a lost rendezvous store
(:mod:`ddp_trainer.launch.supervisor`). It exits as its workers do
(:func:`ddp_trainer.launch.exits.leave`): at once with its code, without Python's teardown, which
aborts the process (SIGABRT, or SIGSEGV) when a store probe's thread is still inside a TCPStore
call then."""

from __future__ import annotations

from ddp_trainer.launch.exits import leave
from ddp_trainer.launch.supervisor import main

if __name__ == "__main__":
    leave(main)
