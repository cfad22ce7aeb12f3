"""``pnn-fast train`` with a pause at one chosen point, announced by a flag file, so that a test can
SIGKILL the process exactly there (tests/test_faults.py):

    python tests/fault_target.py FLAG batch EPOCH -- TRAIN-ARGS   # in epoch EPOCH, before its 3rd batch
    python tests/fault_target.py FLAG save EPOCH -- TRAIN-ARGS    # inside epoch EPOCH's checkpoint write:
                                                                  # the new file written, not yet moved in

Nothing here changes what is computed; the pause only holds the process still.
"""
from __future__ import annotations

import signal
import sys
import time

import torch

from pnn_fast import train
from pnn_fast.cli import main


def pause(flag: str) -> None:
    open(flag, "w").close()
    time.sleep(600)  # the test kills us long before this ends


def install(flag: str, stage: str, epoch: int) -> None:
    if stage == "batch":
        batch_loss, seen = train.Trainer._batch_loss, [0]

        def paused_batch_loss(self, users, pos):
            if self.epoch + 1 == epoch:
                seen[0] += 1
                if seen[0] == 3:
                    pause(flag)
            return batch_loss(self, users, pos)

        train.Trainer._batch_loss = paused_batch_loss
    elif stage == "save":
        save = torch.save

        def paused_save(obj, f, *args, **kwargs):
            save(obj, f, *args, **kwargs)
            if str(f).endswith(".tmp") and isinstance(obj, dict) and obj.get("epoch") == epoch:
                pause(flag)

        torch.save = paused_save
    else:
        raise SystemExit(f"fault_target.py: unknown stage {stage!r}")


if __name__ == "__main__":
    # a job started in the background of a non-interactive shell (as CI may start the tests) inherits
    # SIGINT ignored, and Python then installs no KeyboardInterrupt handler; a run in a terminal has one
    signal.signal(signal.SIGINT, signal.default_int_handler)
    flag, stage, epoch, separator, *train_args = sys.argv[1:]
    assert separator == "--", "usage: fault_target.py FLAG STAGE EPOCH -- TRAIN-ARGS"
    install(flag, stage, int(epoch))
    sys.exit(main(train_args))
