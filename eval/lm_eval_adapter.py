"""lm-evaluation-harness adapter: any lm-eval log-likelihood task on our checkpoints (``lm-eval`` extra).

    import lm_eval
    from eval.lm_eval_adapter import RuPretrainLM   # also registers the model name "ru-pretrain"
    lm_eval.simple_evaluate(model=RuPretrainLM(run_folder="runs/demo"), tasks=["xnli_ru"])

Requests go through the same scoring as recipe 05 (``eval.scoring``): every context starts a
document (EOS first), trailing spaces move to the continuation, rows are padded and masked.
Generation tasks are not supported (a base model in pretraining is scored by log-likelihood).
The other path to lm-eval is the Hugging Face export (``--model hf``, see eval/README.md).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lm_eval.api.model import LM
from lm_eval.api.registry import register_model

from eval.bpb import text_bpb
from eval.harness import Encode, PairEncoder
from eval.scoring import LogitsFn, model_logits_fn, score_requests
from experiment.progress import progress


@register_model("ru-pretrain")
class RuPretrainLM(LM):
    """A trained checkpoint of a run folder (``run_folder``, optional ``step``) as an lm-eval model."""

    def __init__(self, run_folder: str | None = None, step: int | str | None = None, batch_size: int | str = 16,
                 max_length: int | str | None = None, *, logits_fn: LogitsFn | None = None,
                 encode: Encode | None = None, eos_id: int | None = None, pad_id: int = 0) -> None:
        super().__init__()
        if logits_fn is None:
            if run_folder is None:
                raise ValueError("RuPretrainLM needs run_folder=... (or logits_fn, encode and eos_id)")
            from experiment.runfolder import RunFolder
            from tokenizer.loaded import load_run_tokenizer
            from trainer.trained_model import load_trained_model

            folder = RunFolder(Path(run_folder))
            model, _, meta = load_trained_model(folder, step=None if step in (None, "") else int(step))
            tok = load_run_tokenizer(folder.tokenizer)
            logits_fn, encode, eos_id, pad_id = model_logits_fn(model), tok.encode, tok.eos_id, tok.pad_id
            max_length = max_length or meta["model"]["max_seq_len"]
        if encode is None or eos_id is None or max_length is None:
            raise ValueError("RuPretrainLM with a logits_fn needs encode, eos_id and max_length")
        self.logits_fn, self.encode, self.eos_id, self.pad_id = logits_fn, encode, int(eos_id), int(pad_id)
        self.batch_size = int(batch_size)
        self.max_length = int(max_length)
        self.encoder = PairEncoder(encode, self.eos_id)

    def loglikelihood(self, requests: list[Any], disable_tqdm: bool = False) -> list[tuple[float, bool]]:
        scored = [self.encoder(*request.args) for request in requests]
        scores = score_requests(self.logits_fn, scored, batch_size=self.batch_size, max_len=self.max_length,
                                pad_id=self.pad_id, desc=None if disable_tqdm else "lm-eval loglikelihood")
        return [(s.logprob, s.greedy) for s in scores]

    def loglikelihood_rolling(self, requests: list[Any], disable_tqdm: bool = False) -> list[float]:
        return [-text_bpb(self.logits_fn, self.encode, [("request", request.args[0])], self.eos_id, self.max_length,
                          self.batch_size, pad_id=self.pad_id).nats
                for request in progress(requests, desc="lm-eval rolling", disable=disable_tqdm)]

    def generate_until(self, requests: list[Any], disable_tqdm: bool = False) -> list[str]:
        raise NotImplementedError("ru-pretrain scores log-likelihoods only; use the Hugging Face export "
                                  "(--model hf) for generation tasks")
