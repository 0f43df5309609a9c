"""lm-evaluation-harness adapter: any lm-eval log-likelihood task on our checkpoints (``lm-eval`` extra).

    import lm_eval
    from eval.lm_eval_adapter import RuPretrainLM   # also registers the model name "ru-pretrain"
    lm_eval.simple_evaluate(model=RuPretrainLM(run_folder="runs/demo"), tasks=["xnli_ru"])

Requests go through the same scoring as recipe 05 (``eval.scoring``): every context starts a
document (EOS first), trailing spaces move to the continuation, rows are padded and masked.
Generation tasks (``generate_until``) run through recipe 09's code (eval/completions.py: our KV-cache
decoder, greedy unless a request asks to sample), cut at the request's stop strings; a context longer than
the model's length less the tokens to generate keeps its end, as lm-eval's Hugging Face model does.
The other path to lm-eval is the Hugging Face export (``--model hf``, see eval/README.md).
"""

from __future__ import annotations

from typing import Any

from lm_eval.api.model import LM
from lm_eval.api.registry import register_model

from eval.bpb import text_bpb
from eval.harness import Encode, PairEncoder
from eval.scoring import LogitsFn, model_logits_fn, score_requests
from experiment.progress import progress
from experiment.storage import location


@register_model("ru-pretrain")
class RuPretrainLM(LM):
    """A trained checkpoint of a run folder (``run_folder``, optional ``step``) as an lm-eval model."""

    def __init__(self, run_folder: str | None = None, step: int | str | None = None, batch_size: int | str = 16,
                 max_length: int | str | None = None, max_gen_toks: int | str = 256, *,
                 logits_fn: LogitsFn | None = None,
                 encode: Encode | None = None, eos_id: int | None = None, pad_id: int = 0,
                 model: Any = None, codec: Any = None) -> None:
        super().__init__()
        self.model, self.codec, self.max_gen_toks = model, codec, int(max_gen_toks)
        if logits_fn is None:
            if run_folder is None:
                raise ValueError("RuPretrainLM needs run_folder=... (or logits_fn, encode and eos_id)")
            from experiment.runfolder import RunFolder
            from tokenizer.loaded import load_run_tokenizer
            from trainer.trained_model import load_trained_model

            folder = RunFolder(location(run_folder))
            model, _, meta = load_trained_model(folder, step=None if step in (None, "") else int(step))
            tok = load_run_tokenizer(folder.tokenizer)
            logits_fn, encode, eos_id, pad_id = model_logits_fn(model), tok.encode, tok.eos_id, tok.pad_id
            from eval.completions import run_codec

            self.model, self.codec = model, run_codec(tok)
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
        """Each request's ``(context, gen_kwargs)`` continued by our decoder: ``until`` (stop strings),
        ``max_gen_toks``, ``do_sample`` with ``temperature`` (else greedy). Requests of the same settings are
        generated in batches."""
        from eval.completions import complete

        if self.model is None or self.codec is None:
            raise ValueError("generate_until needs a model: RuPretrainLM(run_folder=...), or model= and codec=")
        groups: dict[tuple[tuple[str, ...], int, float], list[int]] = {}
        for i, request in enumerate(requests):
            groups.setdefault(self._settings(request.args[1]), []).append(i)
        out: list[str] = [""] * len(requests)
        for (until, max_new, temperature), indices in progress(list(groups.items()), desc="lm-eval generate_until",
                                                               disable=disable_tqdm):
            codec = self._truncating(max_new)
            for first in range(0, len(indices), self.batch_size):
                chunk = indices[first:first + self.batch_size]
                records = complete(self.model, codec, [requests[i].args[0] for i in chunk], max_new_tokens=max_new,
                                   temperature=temperature, stop=until, max_len=self.max_length,
                                   batch_size=self.batch_size)
                for i, record in zip(chunk, records, strict=True):
                    out[i] = record["completion"]
        return out

    def _settings(self, gen_kwargs: dict[str, Any]) -> tuple[tuple[str, ...], int, float]:
        until = gen_kwargs.get("until") or ()
        until = (until,) if isinstance(until, str) else tuple(until)
        temperature = float(gen_kwargs.get("temperature", 0.0) or 0.0) if gen_kwargs.get("do_sample") else 0.0
        return until, int(gen_kwargs.get("max_gen_toks", self.max_gen_toks)), temperature

    def _truncating(self, max_new: int) -> Any:
        """The codec whose prompts keep their last ``max_length - max_new`` tokens (room for the new ones)."""
        from eval.completions import keeping_the_end

        return keeping_the_end(self.codec, self.max_length, max_new)
