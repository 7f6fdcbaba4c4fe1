"""``MigratingLLMServerClient``: verl's resuming client that also survives a replica dying mid-generation.

verl's ``FullyAsyncLLMServerClient`` (``verl/workers/rollout/llm_server.py``) already turns an ``aborted``
answer into a resubmission of prompt + tokens so far. This subclass treats a dead server the same way, so the
fault path is the migration path: the attempt on the dead replica counts as aborted with no new tokens, the
balancer drops replicas that no longer answer, and the request resumes elsewhere from the tokens it had.
"""

from __future__ import annotations

import logging

from ray.exceptions import RayActorError
from verl.workers.rollout.llm_server import FullyAsyncLLMServerClient, LLMServerClient
from verl.workers.rollout.replica import TokenOutput

logger = logging.getLogger(__name__)


class _AttemptSurvivesDeadServer(LLMServerClient):
    async def generate(self, request_id, **kwargs) -> TokenOutput:
        try:
            return await super().generate(request_id, **kwargs)
        except RayActorError as err:
            dropped = await self._load_balancer.drop_dead_servers.remote()
            logger.warning("rollout replica died during request %s (%s); dropped %s", request_id, err, dropped)
            return TokenOutput(token_ids=[], log_probs=[], stop_reason="aborted", extra_fields={})


class MigratingLLMServerClient(FullyAsyncLLMServerClient, _AttemptSurvivesDeadServer):
    """Resumes aborted (migrated) requests and requests whose replica died, on the replicas still routing.

    Needs a balancer with ``drop_dead_servers`` (:class:`~jigsaw_verl.rollout.load_balancer.MigratingLoadBalancer`).
    """
