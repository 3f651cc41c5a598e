"""The tuner on a GPU: tune Qwen3-0.6B's shapes at batch 1 with a small budget, then the rules' plan
and the tuned one decode the same prompt.

Where the tuned plan differs from the rules' only in fields that move work (pools, KV pipeline
depth, placement: ``tune.order_only``), the tokens must be equal. Where it changes rows per tile,
K-chunks or attention's splits, the order of the sums changes, so logits may differ in rounding
(bf16 weights, float32 accumulation) and a greedy token may flip where two logits tie within it:
then the logits must stay close and the tokens equal wherever the rules' top two are apart by more
than that noise.

The recorded comparison (the lead runs it on each GPU):

    python -m megakernel.tune -m 0.6b --random-weights --batch-size 1,8 --max-seq-len 512 --budget-s 500
    python -m megakernel.bench -m 0.6b --random-weights --batch-size 1,8 --max-seq-len 512 \\
        --compare cuda-graph --plan rules,tuned --record bench/results.jsonl
    python -m megakernel.tune -m 8b --random-weights --batch-size 1,8 --max-seq-len 512 --budget-s 500
    python -m megakernel.bench -m 8b --random-weights --batch-size 1,8 --max-seq-len 512 \\
        --compare cuda-graph --plan rules,tuned --record bench/results.jsonl
"""

import pytest
import torch

pytestmark = pytest.mark.gpu


def test_tuned_plan_decodes_as_the_rules_plan():
    from megakernel import MegaQwen3, load_model, tune     # the plan cache: this test's own (conftest)
    model = load_model("0.6b", random_weights=True, progress=False)
    (out,) = tune.tune(model, [1], [512], budget_s=120, show_progress=False)
    e = out.entry
    assert e is not None and e.rules_ms > 0 and e.tuned_ms <= e.rules_ms and e.measured >= 2
    print(f"tuned: {e.describe()}")
    prompt = torch.randint(0, model.config.vocab_size, (1, 100), generator=torch.Generator().manual_seed(0))
    runs = {}
    for plan in ("rules", "tuned"):
        mk = MegaQwen3(model, max_seq_len=512, batch_size=1, plan=plan)
        assert mk.plan_choice.name == plan
        toks, logits = [mk.prefill(prompt)], []
        for _ in range(48):
            logits.append(mk.logits.clone())
            toks.append(mk.step())
        runs[plan] = (torch.stack(toks, 1).cpu(), torch.stack(logits).cpu())
    cand = tune.Candidate(tuple(sorted(e.fields.items())), e.strategy,
                          None if e.workers_per_sm == tune.WORKERS_PER_SM else e.workers_per_sm)
    (ta, la), (tb, lb) = runs["rules"], runs["tuned"]
    if tune.order_only(tune.Candidate(), cand):
        assert torch.equal(ta, tb) and torch.equal(la, lb)
        return
    # the sums' order changed: logits[i] gave token i (greedy), from the same inputs until the
    # tokens first part; there the rules' top two must be within the rounding noise
    n = la.shape[0]
    noise = float(0.05 * la.abs().amax().clamp(min=1.0))
    first_diff = next((i for i in range(n) if not torch.equal(ta[:, i], tb[:, i])), None)
    upto = n if first_diff is None else first_diff + 1
    assert torch.allclose(la[:upto], lb[:upto], atol=noise, rtol=0), (la[:upto] - lb[:upto]).abs().max()
    if first_diff is not None:
        top2 = la[first_diff].topk(2, dim=-1).values
        margin = float((top2[..., 0] - top2[..., 1]).max())
        assert margin < noise, f"tokens part at step {first_diff} where the rules' top two are {margin} apart"
