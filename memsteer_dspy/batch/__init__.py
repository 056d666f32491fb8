"""Many users at once: ``memsteer batch`` and the cross-user design scorer.

* :func:`build_tasks` / :func:`run_batch` — one single-user command (``ingest``, ``generate``,
  ``evaluate``, ``optimize``) per user, each writing ``OUT/<user>`` exactly as the single-user
  command does, on a :class:`LocalExecutor` (a bounded pool here) or a :class:`RayExecutor` (Ray
  tasks, retried when a worker dies); ``batch_summary.json`` / ``.md`` per user and pooled.
* :class:`CrossUserScorer` — one shared design scored across users on shards (threads or Ray
  actors) that load each user once and keep its built memory systems.
* :class:`LMGate` — ``--max-concurrent-lm``: LM calls in flight per endpoint, across workers.
"""

from memsteer_dspy.batch.executors import EXECUTORS, LocalExecutor, RayExecutor, make_executor
from memsteer_dspy.batch.lm_gate import LMGate, LocalSlots, RaySlots
from memsteer_dspy.batch.run import COMMANDS, build_tasks, run_batch
from memsteer_dspy.batch.scorer import CrossUserScorer, UserShard, UserSource
from memsteer_dspy.batch.task import UserTask, attempts, run_user
from memsteer_dspy.batch.users import list_users, resolve_users

__all__ = [
    "COMMANDS",
    "EXECUTORS",
    "CrossUserScorer",
    "LMGate",
    "LocalExecutor",
    "LocalSlots",
    "RayExecutor",
    "RaySlots",
    "UserShard",
    "UserSource",
    "UserTask",
    "attempts",
    "build_tasks",
    "list_users",
    "make_executor",
    "resolve_users",
    "run_batch",
    "run_user",
]
