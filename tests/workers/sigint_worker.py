"""A training run that sends itself SIGINT (test_training_interrupt): ``sigint_worker.py vit|dit ARGS...`` runs
``mmpos train vit ARGS`` or ``scripts/train_dit.py ARGS``; with ``MMPOS_TEST_SIGINT_AT=K`` the K-th loss evaluation
of this process sends SIGINT to its process group (the test starts it in its own session), as a Ctrl-C in a
terminal reaches the trainer and its DataLoader workers mid-update; with ``MMPOS_TEST_SIGINT_RANK=R`` only process
``R`` of a torchrun signals itself."""

import importlib.util
import os
import signal
import sys
from pathlib import Path

import torch

trainer, argv = sys.argv[1], sys.argv[2:]  # sys.argv stays whole: the resume line repeats it
at = int(os.environ.get("MMPOS_TEST_SIGINT_AT", "0"))
only_rank = os.environ.get("MMPOS_TEST_SIGINT_RANK")  # under torchrun: only this process is signalled
calls = 0


def signalling(loss_function):
    def wrapper(*args, **kwargs):
        global calls
        calls += 1
        if calls == at and only_rank is not None:
            if os.environ.get("RANK") == only_rank:
                os.kill(os.getpid(), signal.SIGINT)
        elif calls == at:
            os.killpg(os.getpgrp(), signal.SIGINT)
        return loss_function(*args, **kwargs)

    return wrapper


torch.set_num_threads(1)
if trainer == "vit":
    from mmpos.cli import main
    from mmpos.training.tasks import vit as vit_train

    make_criterion = vit_train._criterion
    vit_train._criterion = lambda config, mixup: signalling(make_criterion(config, mixup))
    sys.exit(main(["train", "vit", *argv]))
from mmpos.training.tasks.dit import DiTTask  # noqa: E402 - after the vit branch, which exits

DiTTask.loss = signalling(DiTTask.loss)
spec = importlib.util.spec_from_file_location("train_dit", Path(__file__).parents[2] / "scripts" / "train_dit.py")
script = importlib.util.module_from_spec(spec)
spec.loader.exec_module(script)
sys.exit(script.main(argv))
