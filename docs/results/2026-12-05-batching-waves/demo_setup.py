"""What the engine-alone scripts of this folder share: the demo pair as `quickdraft serve` loads it
on this machine, the loadgen's prompts through the chat template, its 32 greedy tokens, and the
order of interleaved rounds; and a goodput policy that remembers what each step showed it."""
from collections.abc import Iterator

import torch
from quickdraft import SamplingParams
from quickdraft.batch.policy import GoodputPolicy
from quickdraft.hardware import machine_config
from quickdraft.models.loading import load_model
from quickdraft.prompts import chat_prompt_ids
from quickdraft.server.loadgen import PROMPTS

PARAMS = SamplingParams(max_new_tokens=32, temperature=0.0, ignore_eos=True)


class TracingPolicy(GoodputPolicy):
    """The goodput policy, remembering what it was shown."""

    def choose(self, rows, joining=0):
        self.shown = [(row.behind, round(row.acceptance, 2)) for row in rows]
        self.joining = joining
        return super().choose(rows, joining)


def load_demo():
    """(target, draft, prompt ids of the loadgen's prompts), 2 torch threads."""
    torch.set_num_threads(2)
    target = load_model("qwen2.5-coder-1.5b-instruct")
    draft = load_model("qwen2.5-coder-0.5b-instruct", dtype="float32",
                       quantization=machine_config("cpu").draft_quantization)
    ids = [chat_prompt_ids(target.tokenizer, [{"role": "user", "content": p}]) for p in PROMPTS]
    return target, draft, ids


def interleaved(names: list[str], repeats: int) -> Iterator[str]:
    """Each name once a round for ``repeats`` rounds, the order reversed every other round, so that
    going first or second in a round weighs on each alike."""
    for round_ in range(repeats):
        yield from (names if round_ % 2 == 0 else names[::-1])


def serve_clients(engine, ids, clients: int, per_client: int, on_step=None) -> tuple[int, int, float]:
    """Drive a batched engine as a loaded server: ``clients`` requests in flight, each client
    sending ``per_client`` requests (the prompts ``ids`` in turn, ``PARAMS``) one after another;
    ``on_step(events)`` after each step. Returns (tokens, steps, seconds)."""
    import time
    left = {c: per_client for c in range(clients)}
    owner, sent, tokens, steps = {}, 0, 0, 0
    for c in range(clients):
        owner[engine.add(ids[sent % len(ids)], PARAMS)] = c
        sent, left[c] = sent + 1, left[c] - 1
    start = time.perf_counter()
    while owner:
        events = engine.step()
        steps += 1
        if on_step is not None:
            on_step(events)
        for event in events:
            tokens += len(event.chunk.token_ids)
            if event.done:
                c = owner.pop(event.request_id)
                if left[c]:
                    owner[engine.add(ids[sent % len(ids)], PARAMS)] = c
                    sent, left[c] = sent + 1, left[c] - 1
    return tokens, steps, time.perf_counter() - start
