"""Where a batch's user tasks run: a bounded thread pool here, or tasks on a Ray cluster.

Both yield each user's outcome as it finishes. Under Ray a task whose worker dies (killed, out of
memory, node lost) is retried by Ray (``retries`` times); the retry runs the same single-user
command, which resumes from the user's folder, so nothing is lost or done twice. Ray workers get
their LM keys from their own environment (the cluster's), never from task arguments: a task carries
only the command line. Ray reuses worker processes, so anything a command caches per process — the
embedded model (``memsteer_dspy.lm.local`` keeps one llama.cpp instance per model file), built
indexes — is loaded once per worker, not once per user.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from typing import Any

from memsteer_dspy.batch.lm_gate import LMGate, LocalSlots, RaySlots
from memsteer_dspy.batch.task import UserOutcome, UserTask, run_user
from memsteer_dspy.errors import MissingExtraError

EXECUTORS = ("local", "ray")


def require_ray():
    try:
        import ray
    except ImportError:
        raise MissingExtraError("ray", "ray", "--executor ray") from None
    return ray


class LocalExecutor:
    """Users in a bounded pool of threads in this process (LM calls release the GIL; the embedded
    model serializes its calls behind one lock)."""

    name = "local"

    def __init__(self, workers: int = 2, max_concurrent_lm: int | None = None) -> None:
        self.workers = max(1, workers)
        self.slots = LocalSlots(max_concurrent_lm) if max_concurrent_lm else None

    def run(self, tasks: Sequence[UserTask]) -> Iterator[dict[str, Any]]:
        callbacks = [LMGate(self.slots)] if self.slots else []
        with ThreadPoolExecutor(
            max_workers=self.workers, thread_name_prefix="memsteer-batch"
        ) as pool:
            futures = {pool.submit(run_user, t, callbacks): t for t in tasks}
            for fut in as_completed(futures):
                yield fut.result()

    def close(self) -> None:
        pass


class RayExecutor:
    """One Ray task per user on the cluster at ``address`` (None: the running one if this process
    is connected, else a local cluster on this machine)."""

    name = "ray"

    def __init__(
        self,
        address: str | None = None,
        *,
        max_concurrent_lm: int | None = None,
        retries: int = 3,
        cpus_per_task: float = 1.0,
        setup_hook: str | None = None,
        batch_id: str = "batch",
    ) -> None:
        ray = require_ray()
        if not ray.is_initialized():
            runtime_env: dict[str, Any] = {}
            if setup_hook:
                runtime_env["worker_process_setup_hook"] = setup_hook
            ray.init(
                address=address,
                runtime_env=runtime_env or None,
                log_to_driver=False,
                namespace="memsteer",
                configure_logging=False,
            )
            self._owns_connection = True
        else:
            self._owns_connection = False
        self.retries = retries
        self.cpus_per_task = cpus_per_task
        self.slots = (
            RaySlots(max_concurrent_lm, name=f"memsteer-lm-slots-{batch_id}-{os.getpid()}")
            if max_concurrent_lm
            else None
        )

    def run(self, tasks: Sequence[UserTask]) -> Iterator[dict[str, Any]]:
        import ray

        callbacks = [LMGate(self.slots)] if self.slots else []
        remote = ray.remote(run_user).options(
            max_retries=self.retries, retry_exceptions=False, num_cpus=self.cpus_per_task
        )
        pending = {remote.remote(t, callbacks): t for t in tasks}
        while pending:
            done, _ = ray.wait(list(pending), num_returns=1)
            for ref in done:
                task = pending.pop(ref)
                try:
                    yield ray.get(ref)
                except Exception as exc:  # the task died more often than Ray retries it
                    yield UserOutcome(
                        user=task.user,
                        status="failed",
                        exit_code=1,
                        key=task.key,
                        error=f"{type(exc).__name__}: {str(exc)[:500]}",
                    ).as_dict()

    def close(self) -> None:
        import ray

        if self.slots is not None:
            try:
                self.slots.close()
            except Exception:  # the actor is gone already
                pass
        if self._owns_connection:
            ray.shutdown()


def make_executor(
    name: str,
    *,
    workers: int = 2,
    ray_address: str | None = None,
    max_concurrent_lm: int | None = None,
    retries: int = 3,
    setup_hook: str | None = None,
):
    if name == "local":
        return LocalExecutor(workers, max_concurrent_lm=max_concurrent_lm)
    if name == "ray":
        return RayExecutor(
            ray_address, max_concurrent_lm=max_concurrent_lm, retries=retries, setup_hook=setup_hook
        )
    raise ValueError(f"unknown executor {name!r}; choose one of {', '.join(EXECUTORS)}")
