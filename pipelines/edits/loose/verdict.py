"""LooseRoPE's optional verdict-and-restart loop, with the judge as a user callable (no VLM is shipped).

The authors ask a VLM (Qwen3-VL-4B, few-shot) at step 2 whether the decoded x0 prediction shows a success, a
*neglect* (the paste barely changed: loosen more, ``saliency_boost`` -0.045) or a *suppression* (the pasted
object vanished: ``saliency_boost`` +0.05), and restart from step 0 with the same initial noise, at most 4 times.
Here ``verdict(images, attempt) -> "success" | "neglect" | "suppression"`` is any callable (a VLM wrapper, a
metric, a person); :class:`VerdictProbe` is a transformer forward hook that decodes x0 at the verdict step, asks
it, and stops the run with :class:`Restart` when it is not a success. The step comes from the edit context (the
scheduler), so a restart needs no counter reset.
"""

from __future__ import annotations

from typing import Callable, Optional

import torch

from mmpos._validation import check_choice

VERDICTS = ("success", "neglect", "suppression")


class Restart(Exception):
    """Raised from the transformer hook to stop a run whose verdict is not a success."""

    def __init__(self, verdict: str):
        super().__init__(verdict)
        self.verdict = verdict


class VerdictProbe:
    """Forward hook on the Kontext transformer: records the initial latents (step 0) and, at ``step``, decodes
    ``x0 = x_t - sigma * v`` of the target tokens, asks ``verdict(images [B, 3, H, W] in [0, 1], attempt)`` and
    raises :class:`Restart` unless it answers ``"success"`` (or no restart is left). ``context`` is the run's
    :class:`~mmpos.pipelines.edits.context.EditContext` (set by the pipeline before the run)."""

    def __init__(self, pipe, verdict: Callable, step: int, attempt: int, can_restart: bool):
        self.pipe, self.verdict, self.context = pipe, verdict, None
        self.step, self.attempt, self.can_restart = step, attempt, can_restart
        self.initial_latents: Optional[torch.Tensor] = None
        self.answer: Optional[str] = None

    def __call__(self, module, args, kwargs, output):
        target = self.context.segments.target_len
        latents = kwargs["hidden_states"][:, :target]
        if self.context.step == 0 and self.initial_latents is None:
            self.initial_latents = latents.clone()
        if self.context.step != self.step or self.answer is not None:  # once (true-CFG: the positive forward)
            return
        velocity = (output[0] if isinstance(output, tuple) else output.sample)[:, :target]
        x0 = latents.float() - self.context.sigma * velocity.float()
        rows, cols = self.context.segments.target_grid
        images = self.pipe.decode_packed(x0, rows * self.pipe.token_pixels, cols * self.pipe.token_pixels)
        self.answer = self.verdict(images, self.attempt)
        check_choice("verdict answer", self.answer, VERDICTS)
        if self.answer != "success" and self.can_restart:
            raise Restart(self.answer)


def next_boost(config, verdict: str) -> float:
    """The saliency boost after a verdict: ``+boost_neglect`` on neglect, ``+boost_suppression`` on suppression."""
    return config.saliency_boost + (config.boost_neglect if verdict == "neglect" else config.boost_suppression)
