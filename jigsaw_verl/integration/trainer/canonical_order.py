"""A step's samples in an order that depends on their content only, so that a step's update does too.

verl's v1 trainer lists a step's samples in the order their responses finished, which varies from run to run and
with what else runs on the pool; the sample keys (``{uid}_{session}_{i}``, ``verl/trainer/ppo/v1/agent_loop_tq.py``)
do not fix it: the uid is a fresh ``uuid4`` per prompt (``trainer_base.py``, ``_fetch_one_gen_batch``). Ordering by
(prompt, response) alone leaves ties between equal samples of different GRPO groups, whose advantages may differ
(the same prompt text drawn twice, "1" answered in two groups with different rewards around it); the keys then
broke the tie at random, and the update summed the same gradients in another order. Here each sample sorts by its
prompt, then by its group's content (every member's response), then by its own response: samples that still tie
are equal members of groups with equal content, so they carry the same advantage and their order changes nothing.
"""

from __future__ import annotations

from collections.abc import Sequence


def group_of(key: str) -> str:
    """The GRPO group (prompt uid) of a sample key ``{uid}_{session}_{i}``."""
    return key.split("_", 1)[0]


def canonical_order(keys: Sequence[str], prompts: Sequence[list[int]], responses: Sequence[list[int]]) -> list[int]:
    """The permutation of the samples (by position) that sorts them by prompt, group content, response."""
    members: dict[str, list[list[int]]] = {}
    for key, response in zip(keys, responses, strict=True):
        members.setdefault(group_of(key), []).append(response)
    content = {uid: sorted(rs) for uid, rs in members.items()}
    return sorted(range(len(keys)), key=lambda i: (prompts[i], content[group_of(keys[i])], responses[i], keys[i]))
