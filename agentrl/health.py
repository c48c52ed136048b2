"""When the RL loop stops a run: every update skipped, or a collapsed policy, for many steps.

A diverged run (non-finite losses, gradients or new states, every update skipped) or a
collapsed one (a deterministic policy with an exactly zero gradient, which RL cannot move)
only wastes compute; `loop.run` counts consecutive such steps with `unhealthy` and raises
TrainingStopped with `STOP_ADVICE` and the last good checkpoint.
"""
from collections.abc import Mapping
import math
from typing import Any


class TrainingStopped(RuntimeError):
  """The run diverged or collapsed; the message says why and which checkpoint to go back to."""


def unhealthy(record: Mapping[str, Any], updates: int, entropy_floor: float) -> str:
  """'' for a healthy step, else "skipped" (every update dropped) or "collapsed"."""
  if record.get("skipped", 0.0) >= updates:
    return "skipped"
  if record.get("grad_norm", 1.0) == 0.0 and record.get("entropy", math.inf) <= entropy_floor:
    return "collapsed"
  return ""


STOP_ADVICE = {
    "skipped": "every update of the last {n} steps was skipped for a non-finite loss, gradient "
               "or new state; lower optim.lr or check the reward",
    "collapsed": "for {n} steps the policy was deterministic (entropy <= {floor}) and the "
                 "gradient exactly 0, so RL cannot move it; raise the sampling temperature or "
                 "restart from an earlier checkpoint",
}
