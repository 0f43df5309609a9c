"""The lm-evaluation-harness adapter (`lm-eval` extra): requests scored by our code, and a whole
lm-eval task run through `simple_evaluate` on a local dataset. Skipped where lm-eval is missing."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from types import SimpleNamespace

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax.numpy as jnp
import numpy as np
import pytest

from experiment.errors import ConfigError
from tests.conftest import import_extra

lm_eval = import_extra("lm_eval", "lm-eval")

from eval.harness import PairEncoder  # noqa: E402
from eval.scoring import score_requests  # noqa: E402

VOCAB, OFFSET, EOS = 260, 4, 3


def encode(text: str) -> list[int]:
    """Bytes as tokens: a tokenizer anyone can check by hand."""
    return [b + OFFSET for b in text.encode("utf-8")]


def prefix_mean_model(seed: int = 0):
    rng = np.random.default_rng(seed)
    emb = jnp.asarray(rng.normal(size=(VOCAB, 16)).astype(np.float32))
    out = jnp.asarray(rng.normal(size=(16, VOCAB)).astype(np.float32))

    def logits_fn(tokens, **_):
        x = emb[tokens]
        return (jnp.cumsum(x, axis=1) / jnp.arange(1, tokens.shape[1] + 1)[None, :, None]) @ out

    return logits_fn


def make_lm():
    from eval.lm_eval_adapter import RuPretrainLM

    return RuPretrainLM(logits_fn=prefix_mean_model(), encode=encode, eos_id=EOS, max_length=64, batch_size=4)


def test_loglikelihood_requests_match_our_scoring() -> None:
    lm = make_lm()
    pairs = [("Вопрос: кто?", " Он"), ("Ответ:", " да"), ("", "Просто текст")]
    got = lm.loglikelihood([SimpleNamespace(args=p) for p in pairs], disable_tqdm=True)
    encoder = PairEncoder(encode, EOS)
    expected = score_requests(lm.logits_fn, [encoder(*p) for p in pairs], batch_size=4, max_len=64)
    assert [g[0] for g in got] == pytest.approx([e.logprob for e in expected], abs=1e-6)
    assert all(isinstance(g[1], bool) for g in got)


def test_rolling_loglikelihood_covers_every_token_once() -> None:
    lm = make_lm()
    text = "Мороз и солнце; день чудесный! Ещё ты дремлешь, друг прелестный"  # > 64 tokens: two windows
    (rolling,) = lm.loglikelihood_rolling([SimpleNamespace(args=(text,))], disable_tqdm=True)
    ids = [EOS, *encode(text)]
    # the same windows by hand: each scored window of 64 tokens sees the token before it
    from eval.scoring import ScoreRequest

    manual = score_requests(lm.logits_fn, [ScoreRequest(ids[s - 1:s], ids[s:s + 64]) for s in range(1, len(ids), 64)],
                            batch_size=4, max_len=64)
    assert rolling == pytest.approx(sum(s.logprob for s in manual), abs=1e-5)
    assert sum(s.tokens for s in manual) == len(ids) - 1 and math.isfinite(rolling)


def test_simple_evaluate_runs_a_local_lm_eval_task(tmp_path: Path) -> None:
    from lm_eval.tasks import TaskManager

    docs = [{"question": f"Сколько будет {a} плюс {b}?", "choices": [str(a + b), str(a * b + 7), "ноль"],
             "gold": 0} for a, b in [(1, 2), (3, 4), (2, 2), (5, 1), (6, 3), (7, 2)]]
    data = tmp_path / "arith.jsonl"
    data.write_text("".join(json.dumps(d, ensure_ascii=False) + "\n" for d in docs), encoding="utf-8")
    (tmp_path / "arith.yaml").write_text(
        "task: ru_arith_local\n"
        "dataset_path: json\n"
        f"dataset_kwargs:\n  data_files:\n    test: {data}\n"
        "test_split: test\n"
        "output_type: multiple_choice\n"
        "doc_to_text: '{{question}}'\n"
        "doc_to_choice: '{{choices}}'\n"
        "doc_to_target: '{{gold}}'\n"
        "metric_list:\n  - metric: acc\n",
        encoding="utf-8",
    )
    lm = make_lm()
    results = lm_eval.simple_evaluate(model=lm, tasks=["ru_arith_local"],
                                      task_manager=TaskManager(include_path=str(tmp_path)))
    acc = results["results"]["ru_arith_local"]["acc,none"]
    # the same decision with our own scoring: lm-eval puts " " between question and answer
    encoder = PairEncoder(encode, EOS)
    correct = 0
    for doc in docs:
        scores = score_requests(lm.logits_fn, [encoder(doc["question"] + " ", c) for c in doc["choices"]],
                                batch_size=4, max_len=64)
        correct += int(np.argmax([s.logprob for s in scores]) == doc["gold"])
    assert acc == pytest.approx(correct / len(docs))


def tiny_generator():
    """A tiny random Llama of our own and a byte codec: what generate_until continues with."""
    from eval.completions import PromptCodec
    from model.llama.config import LlamaConfig
    from model.registry import get_family

    cfg = LlamaConfig(d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=64, max_seq_len=64)
    model = get_family("llama").init(cfg, VOCAB, seed=3)

    def decode(ids):
        return bytes(max(0, min(255, i - OFFSET)) for i in ids).decode("utf-8", errors="replace")

    return model, PromptCodec(lambda text: [EOS, *encode(text)], decode, (EOS,))


def test_generate_until_runs_a_local_generative_task_through_our_decoder(tmp_path: Path) -> None:
    from lm_eval.tasks import TaskManager

    from eval.completions import complete
    from eval.lm_eval_adapter import RuPretrainLM

    docs = [{"question": f"{a} + {b} =", "answer": str(a + b)} for a, b in [(1, 2), (3, 4), (20, 22), (5, 1)]]
    data = tmp_path / "sums.jsonl"
    data.write_text("".join(json.dumps(d, ensure_ascii=False) + "\n" for d in docs), encoding="utf-8")
    (tmp_path / "sums.yaml").write_text(
        "task: ru_sums_generate\n"
        "dataset_path: json\n"
        f"dataset_kwargs:\n  data_files:\n    test: {data}\n"
        "test_split: test\n"
        "output_type: generate_until\n"
        "doc_to_text: '{{question}}'\n"
        "doc_to_target: '{{answer}}'\n"
        "generation_kwargs:\n  until: ['\\n']\n  max_gen_toks: 8\n  do_sample: false\n"
        "metric_list:\n  - metric: exact_match\n",
        encoding="utf-8",
    )
    model, codec = tiny_generator()
    lm = RuPretrainLM(logits_fn=prefix_mean_model(), encode=encode, eos_id=EOS, max_length=64, batch_size=3,
                      model=model, codec=codec)
    results = lm_eval.simple_evaluate(model=lm, tasks=["ru_sums_generate"], log_samples=True,
                                      task_manager=TaskManager(include_path=str(tmp_path)))
    samples = results["samples"]["ru_sums_generate"]
    ours = {r["prompt"]: r["completion"] for r in complete(model, codec, [d["question"] for d in docs],
                                                            max_new_tokens=8, stop=["\n"], max_len=64)}
    assert len(samples) == len(docs)
    for sample in samples:
        assert sample["resps"][0][0] == ours[sample["doc"]["question"]]
        assert "\n" not in sample["resps"][0][0] and len(encode(sample["resps"][0][0])) <= 8 * 4
    exact = sum(ours[d["question"]].strip() == d["answer"] for d in docs) / len(docs)
    assert results["results"]["ru_sums_generate"]["exact_match,none"] == pytest.approx(exact)


def test_generate_until_keeps_the_end_of_a_long_context() -> None:
    from eval.lm_eval_adapter import RuPretrainLM

    model, codec = tiny_generator()
    lm = RuPretrainLM(logits_fn=prefix_mean_model(), encode=encode, eos_id=EOS, max_length=64, batch_size=2,
                      model=model, codec=codec)
    long = "слово " * 40  # 480 byte tokens: far past the model's 64
    (out,) = lm.generate_until([SimpleNamespace(args=(long, {"max_gen_toks": 5}))], disable_tqdm=True)
    (same,) = lm.generate_until([SimpleNamespace(args=(long[-200:], {"max_gen_toks": 5}))], disable_tqdm=True)
    assert out == same  # both keep the same last 59 tokens
    with pytest.raises(ConfigError, match="leaves no room"):  # the project's one-line error
        lm.generate_until([SimpleNamespace(args=("x", {"max_gen_toks": 64}))], disable_tqdm=True)
