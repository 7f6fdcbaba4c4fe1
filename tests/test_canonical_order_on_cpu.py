"""The canonical order of a step's samples: the same content in any arrival order, under any uids, trains in the
same order (what the trainer's ``_balance_batch`` puts the batch in before verl balances it)."""

from __future__ import annotations

import random
import uuid

from jigsaw_verl.integration.trainer.canonical_order import canonical_order, group_of

# one prompt drawn twice (two GRPO groups of "Count down from 1."), and another prompt; responses as token ids
PROMPT_A, PROMPT_B = [5, 9, 1], [5, 9, 3]
GROUPS = [
    (PROMPT_A, [[1], [1], [1], [2]]),  # one wrong answer: the three "1"s get a positive advantage
    (PROMPT_A, [[1], [1], [1], [1]]),  # all right: every advantage is 0
    (PROMPT_B, [[3, 2, 1], [3, 2], [3, 2, 1], [1]]),
]


def _run(seed: int):
    """The step's samples as one run lists them: fresh uids, sessions shuffled within a group, arrival order."""
    rng = random.Random(seed)
    samples = []
    for prompt, responses in GROUPS:
        uid = str(uuid.UUID(int=rng.getrandbits(128)))
        for session, response in enumerate(rng.sample(responses, len(responses))):
            samples.append((f"{uid}_{session}_0", prompt, response))
    rng.shuffle(samples)
    return samples


def _advantages(samples):
    """GRPO's advantage per sample: its reward (1 for the right answer) minus its group's mean."""
    reward = {tuple(PROMPT_A): [1], tuple(PROMPT_B): [3, 2, 1]}
    rewards = [float(r == reward[tuple(p)]) for _, p, r in samples]
    groups: dict[str, list[float]] = {}
    for (key, _, _), value in zip(samples, rewards, strict=True):
        groups.setdefault(group_of(key), []).append(value)
    return [v - sum(groups[group_of(k)]) / len(groups[group_of(k)]) for (k, _, _), v in zip(samples, rewards)]


def test_the_same_samples_train_in_the_same_order_whatever_their_uids_and_arrival():
    seen = set()
    for seed in range(20):
        samples = _run(seed)
        keys, prompts, responses = zip(*samples, strict=True)
        order = canonical_order(list(keys), list(prompts), list(responses))
        ordered = [samples[i] for i in order]
        advantages = _advantages(samples)
        seen.add(tuple((tuple(p), tuple(r), advantages[i]) for i, (_, p, r) in zip(order, ordered, strict=True)))
    # one sequence of (prompt, response, advantage): the update sums the same terms in the same order every run
    assert len(seen) == 1


def test_ordering_by_prompt_and_response_alone_would_not_fix_it():
    seen = set()
    for seed in range(20):
        samples = _run(seed)
        advantages = _advantages(samples)
        order = sorted(range(len(samples)), key=lambda i: (samples[i][1], samples[i][2], samples[i][0]))
        seen.add(tuple(advantages[i] for i in order))
    assert len(seen) > 1  # the "1"s of the two groups of PROMPT_A carry different advantages and tie on content
