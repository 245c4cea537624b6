"""One process of the sharded resume tests under torchrun (gloo): for each case ``"FAMILY:PE"`` of ``CASES`` (a JSON
list; the tiny models of fsdp_worker), AdamW steps of ``ENGINE`` (``fsdp``: :func:`fully_shard_blocks`, fp64, saved
with :mod:`mmpos.ops.sharded_checkpoint`; ``zero3``: ``deepspeed.initialize`` with configs/accelerate/zero3.yaml,
fp32, DeepSpeed's ``save_checkpoint`` / ``load_checkpoint``). Every step adds noise from the global generator to the
inputs, so that a resume must restore the generators too.

``PHASE`` ``save``: a run of 4 steps without interruption (``straight``), and a run of 2 steps, a checkpoint, 2 more
(``first``). ``PHASE`` ``resume`` (a new launch, a new process group): build, load the checkpoint, 2 steps
(``resumed``). Writes ``{case}.{run}.safetensors`` (rank 0: every whole parameter after the run, and at the
checkpoint as ``saved``) and ``rank{R}.{PHASE}.json`` (per case and run, this rank's losses, or the error raised).

    python -m torch.distributed.run --nproc_per_node 2 tests/workers/resume_worker.py ENGINE PHASE CASES DIR
"""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: `tests` is a package
from mmpos._safe_state import read_json, read_tensors, rng_state, set_rng_state, write_json, write_tensors  # noqa: E402
from mmpos.integrations.pe_parameters import named_pe_parameters  # noqa: E402
from tests.workers.ending import end_process_group  # noqa: E402
from tests.workers.fsdp_worker import batch, loss_of, run, shard, tiny_model  # noqa: E402

MICRO_BATCH, STEPS, LR = 2, 4, 1e-2
DTYPES = {"fsdp": torch.float64, "zero3": torch.float32}  # DeepSpeed partitions fp16, bf16 and fp32 only


class Fsdp:
    """FSDP2 per block, torch's AdamW, the mmpos sharded checkpoint."""

    def __init__(self, family: str, pe: str):
        self.model = shard(family, tiny_model(family, pe, dtype=DTYPES["fsdp"]), variant="")
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=LR, weight_decay=0.05)

    def step(self, inputs, target) -> float:
        loss = loss_of(run(self.model, inputs), target)
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad()
        return loss.item()

    def save(self, folder: Path) -> None:
        from mmpos.ops.sharded_checkpoint import save_sharded_checkpoint

        save_sharded_checkpoint(folder, self.model, self.optimizer, extra={"step": STEPS // 2})

    def load(self, folder: Path) -> int:
        from mmpos.ops.sharded_checkpoint import load_sharded_checkpoint

        return load_sharded_checkpoint(folder, self.model, self.optimizer)["step"]

    def whole_parameters(self) -> dict:
        return {name: p.full_tensor() for name, p in self.model.named_parameters()}  # collective


class Zero3:
    """DeepSpeed ZeRO-3 (the config of test_zero3), torch's AdamW, DeepSpeed's checkpoint plus the generators."""

    def __init__(self, family: str, pe: str):
        import deepspeed

        from tests.workers.zero3_worker import zero3_config

        self.model = tiny_model(family, pe, dtype=DTYPES["zero3"])
        optimizer = torch.optim.AdamW(self.model.parameters(), lr=LR, weight_decay=0.05)
        config = zero3_config(MICRO_BATCH, dist.get_world_size())
        self.engine, *_ = deepspeed.initialize(model=self.model, optimizer=optimizer, config=config)

    def step(self, inputs, target) -> float:
        loss = loss_of(run(self.engine, inputs), target)
        self.engine.backward(loss)
        self.engine.step()
        return loss.item()

    def save(self, folder: Path) -> None:
        """DeepSpeed's checkpoint keeps no generators: each rank writes its own beside it."""
        self.engine.save_checkpoint(str(folder), tag="step", client_state={"step": STEPS // 2})
        write_json(folder / "step" / f"rng_{dist.get_rank()}.json", rng_state())
        dist.barrier()

    def load(self, folder: Path) -> int:
        _, client_state = self.engine.load_checkpoint(str(folder), tag="step")
        set_rng_state(read_json(folder / "step" / f"rng_{dist.get_rank()}.json"))
        return client_state["step"]

    def whole_parameters(self) -> dict:
        import deepspeed

        with deepspeed.zero.GatheredParameters(list(self.model.parameters())):
            return {name: p.detach().clone() for name, p in self.model.named_parameters()}


def train(trainer, family: str, dtype: torch.dtype, steps: range) -> list[float]:
    """The steps of ``steps`` on this rank's half of each global batch, inputs plus noise from the global generator."""
    rank, world = dist.get_rank(), dist.get_world_size()
    mine, losses = slice(MICRO_BATCH * rank, MICRO_BATCH * (rank + 1)), []
    for index in steps:
        inputs, target = batch(family, MICRO_BATCH * world, seed=1 + index, dtype=dtype)
        noisy = (inputs[0] + 0.1 * torch.randn_like(inputs[0]), *inputs[1:])  # the same draw on every rank
        losses.append(trainer.step([x[mine] for x in noisy], target[mine]))
    return losses


def write_parameters(trainer, path: Path) -> None:
    whole = trainer.whole_parameters()
    if dist.get_rank() == 0:
        write_tensors(path, whole)


def save_phase(engine: str, family: str, pe: str, case_dir: Path, records: Path, case: str) -> dict:
    trainer_class, dtype = (Fsdp if engine == "fsdp" else Zero3), DTYPES[engine]
    straight = trainer_class(family, pe)
    losses = {"straight": train(straight, family, dtype, range(STEPS))}
    write_parameters(straight, records / f"{case}.straight.safetensors")
    first = trainer_class(family, pe)
    losses["first"] = train(first, family, dtype, range(STEPS // 2))
    first.save(case_dir)
    write_parameters(first, records / f"{case}.saved.safetensors")
    losses["first"] += train(first, family, dtype, range(STEPS // 2, STEPS))
    write_parameters(first, records / f"{case}.first.safetensors")
    return losses


def resume_phase(engine: str, family: str, pe: str, case_dir: Path, records: Path, case: str) -> dict:
    trainer = (Fsdp if engine == "fsdp" else Zero3)(family, pe)
    start = trainer.load(case_dir)
    losses = {"resumed": train(trainer, family, DTYPES[engine], range(start, STEPS))}
    write_parameters(trainer, records / f"{case}.resumed.safetensors")
    return losses


def main():
    engine, phase, cases, records = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), Path(sys.argv[4])
    if engine == "zero3":
        import deepspeed

        deepspeed.init_distributed(dist_backend="gloo")
    else:
        dist.init_process_group("gloo")
    results = {}
    for case in cases:
        started = time.perf_counter()
        family, _, pe = case.partition(":")
        run_phase = save_phase if phase == "save" else resume_phase
        try:
            results[case] = run_phase(engine, family, pe, records / case.replace(":", "-"), records, case)
        except Exception as error:  # reported to the test, which names the case
            results[case] = dict(error=f"{type(error).__name__}: {error}"[:2000])
        results[case][f"{phase}_seconds"] = time.perf_counter() - started
    (records / f"rank{dist.get_rank()}.{phase}.json").write_text(json.dumps(results, indent=1))
    end_process_group()


if __name__ == "__main__":
    main()


def run_resume(engine: str, cases: list[str], records: Path, port: int) -> list[dict]:
    """Both phases, each its own ``torchrun`` launch of 2 processes (for the tests); per rank, the losses of every
    case and run (``straight``, ``first``, ``resumed``)."""
    results = [{case: {} for case in cases} for _ in range(2)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", **({"DS_ACCELERATOR": "cpu"} if engine == "zero3" else {})}
    for phase in ("save", "resume"):
        command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(port)]
        command += [__file__, engine, phase, json.dumps(cases), str(records)]
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-4000:]
        for rank in (0, 1):
            for case, result in json.loads((records / f"rank{rank}.{phase}.json").read_text()).items():
                results[rank][case].update(result)
    return results


def assert_resumed_bit_identical(results: list[dict], records, cases: list[str]) -> None:
    """Per rank, the losses; on rank 0's whole parameters: straight == first == resumed, and the 2 steps after the
    checkpoint moved every encoding parameter (the resumed steps are no no-ops)."""
    for rank_results in results:
        for case in cases:
            result = rank_results[case]
            assert "error" not in result, (case, result.get("error"))
            assert len(result["straight"]) == STEPS and result["first"] == result["straight"], (case, result)
            assert result["resumed"] == result["first"][2:], (case, result)
    for case in cases:
        runs = {name: read_tensors(records / f"{case}.{name}.safetensors") for name in ("straight", "first", "resumed")}
        saved = read_tensors(records / f"{case}.saved.safetensors")
        assert runs["first"].keys() == runs["resumed"].keys() == runs["straight"].keys() == saved.keys(), case
        for name, expected in runs["straight"].items():
            assert torch.equal(runs["first"][name], expected) and torch.equal(runs["resumed"][name], expected), name
        encoding = [name for name, _ in named_pe_parameters(tiny_model(*case.split(":")))]
        assert encoding and all(not torch.equal(saved[n], runs["resumed"][n]) for n in encoding), (case, encoding)
