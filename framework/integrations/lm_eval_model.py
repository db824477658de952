"""The ``adec`` model of lm-evaluation-harness: the community's benchmarks with any controller.

Importing this module registers ``adec`` with lm-eval (``lm_eval.api.registry``); lm-eval 0.4 has
no plugin discovery, so run it through ``adec lm-eval ARGS`` (lm-eval's own command line, with this
module imported first) or pass the class to ``lm_eval.simple_evaluate(model="adec", ...)`` after
importing it. ``--model_args`` takes, comma separated:

* ``model=``: what ``adec decode --model`` takes (a folder, a built-in name, a hub name in the local
  Hugging Face cache); ``dtype``, ``trust_remote_code``, ``chat_template`` (true / false; default:
  the tokenizer's own, i.e. an instruct model's prompt becomes one user turn, as in Fast-dLLM's
  evaluation) as the CLI's flags; ``device`` comes from lm-eval's ``--device``;
* ``controller=`` (default ``fast_dllm``) and its parameters (``threshold=0.9``), and the options of
  :class:`adaptive_decoding.framework.engine.config.DecodeConfig` (``gen_length``, ``block_length``, ``cache``, ...),
  validated with the errors ``adec decode --set`` gives; a built-in tiny model brings its task's
  ``gen_length`` and ``block_length`` as defaults, as in the CLI;
* ``mc_num`` (default 128), ``cfg`` (default 0) and ``check_greedy`` (default false): LLaDA's
  Monte-Carlo log-likelihood (:mod:`adaptive_decoding.framework.integrations.mc_likelihood`).

``generate_until`` decodes ``batch_size`` prompts per :func:`adaptive_decoding.framework.engine.loop.decode` call
(per-sample seeds, so the batching never changes a text) and cuts each text before the first of the
request's ``until`` strings. The generation length is ``gen_length``: lm-eval's ``max_gen_toks``,
``temperature`` and ``do_sample`` are ignored (a warning names them). ``loglikelihood`` is LLaDA's
Monte-Carlo estimate; ``loglikelihood_rolling`` (perplexity tasks) is not supported, as in LLaDA.
"""

from __future__ import annotations

import warnings
from typing import Any, Optional

from lm_eval.api.instance import Instance
from lm_eval.api.model import LM
from lm_eval.api.registry import register_model

from adaptive_decoding.framework.core.measure import tokens_per_forward
from adaptive_decoding.framework.core.params import Configurable, Param, ParameterError
from adaptive_decoding.framework.core.rng import stable_seed
from adaptive_decoding.framework.engine.config import DecodeConfig
from adaptive_decoding.framework.engine.context import DecodeContext
from adaptive_decoding.framework.engine.controller_io import build_controller, split_settings
from adaptive_decoding.framework.engine.denoise import check_cache_support
from adaptive_decoding.framework.engine.evaluate import answer_tokens_before, item_seeds
from adaptive_decoding.framework.engine.layout import config_for_model
from adaptive_decoding.framework.engine.loop import decode, model_device
from adaptive_decoding.framework.integrations.mc_likelihood import (
    MCRequest,
    greedy_matches,
    mc_loglikelihoods,
)

DTYPES = ("auto", "float32", "bfloat16", "float16")  # = adaptive_decoding.framework.models.hub_loading.DTYPES
#: lm-eval generation kwargs that are honoured (``until``) or only restate greedy decoding: never warned about
QUIET_GEN_KWARGS = {"until": None, "do_sample": False, "temperature": 0}


class AdapterOptions(Configurable):
    """The adapter's own ``--model_args`` (the rest go to the controller and the decode config)."""

    registry_name = "adec"
    params = {
        "model": Param(str, doc="folder, built-in name or cached hub name (as adec decode --model)"),
        "controller": Param(str, doc="registered controller or tuned:PATH.yaml"),
        "dtype": Param(str, choices=DTYPES, doc="weights dtype of a Hugging Face checkpoint"),
        "device": Param(str, doc="auto, cpu, cuda, cuda:N, mps (lm-eval's --device)"),
        "trust_remote_code": Param(bool, doc="let a checkpoint run its own modeling code"),
        "chat_template": Param(bool, nullable=True,
                               doc="wrap prompts in the chat template; null = the tokenizer's"),
        "batch_size": Param(int, low=1, doc="prompts per decode call; Monte-Carlo rows per forward"),
        "max_batch_size": Param(int, low=1, nullable=True, doc="lm-eval's auto batching bound (unused)"),
        "mc_num": Param(int, low=1, doc="Monte-Carlo samples per loglikelihood request (LLaDA: 128)"),
        "cfg": Param(float, low=0.0, doc="classifier-free guidance scale for loglikelihood (LLaDA's cfg)"),
        "check_greedy": Param(bool, doc="also check that greedy decoding reproduces the continuation"),
    }

    def __init__(self, model: str = "", controller: str = "fast_dllm", dtype: str = "auto",
                 device: str = "auto",
                 trust_remote_code: bool = False, chat_template: Optional[bool] = None, batch_size: int = 1,
                 max_batch_size: Optional[int] = None, mc_num: int = 128, cfg: float = 0.0,
                 check_greedy: bool = False) -> None:
        self.model = model
        self.controller = controller
        self.dtype = dtype
        self.device = device
        self.trust_remote_code = trust_remote_code
        self.chat_template = chat_template
        self.batch_size = batch_size
        self.max_batch_size = max_batch_size
        self.mc_num = mc_num
        self.cfg = cfg
        self.check_greedy = check_greedy


def split_model_args(args: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """``--model_args`` as (adapter options, decode-config keys, controller keys); an unknown key
    fails naming every key that is allowed. Values are validated by the caller."""
    return split_settings(str(args.get("controller", "fast_dllm")), args, flag="--model_args",
                          own_keys=set(AdapterOptions.param_names()))


def cut_at_stops(text: str, until: Any) -> str:
    """``text`` up to the first occurrence of any stop string (lm-eval's ``until``: a string or a list)."""
    stops = [until] if isinstance(until, str) else list(until or [])
    cut = min((i for i in (text.find(s) for s in stops if s) if i >= 0), default=len(text))
    return text[:cut]


@register_model("adec")
class AdecLM(LM):
    """lm-eval's ``LM`` over :func:`adaptive_decoding.framework.engine.loop.decode` (see the module docstring).

    ``model`` may also be a loaded model (``.denoiser``, ``.tokenizer``, e.g. a
    :class:`adaptive_decoding.framework.models.protocol.LoadedModel`) when the class is built in Python.
    """

    def __init__(self, model: Any = None, **model_args: Any) -> None:
        super().__init__()
        if model is None or model == "":
            raise ParameterError("--model_args needs model=NAME (a folder, a built-in name such as "
                                 "tiny-addition, or a hub name in the local Hugging Face cache, e.g. "
                                 "GSAI-ML/LLaDA-8B-Instruct)")
        if isinstance(model_args.get("batch_size"), str) and model_args["batch_size"].startswith("auto"):
            raise ParameterError(f"adec.batch_size={model_args['batch_size']!r} is not supported; allowed: "
                                 f"a number of prompts per decode call (--batch_size 8)")
        if model_args.get("device") is None:
            model_args.pop("device", None)
        own, cfg_kw, ctrl_kw = split_model_args(model_args)
        self.options = AdapterOptions.build(model=model if isinstance(model, str) else "(object)", **own)
        # each value now; the combination once the model's defaults are known
        for key, value in cfg_kw.items():
            cfg_kw[key] = DecodeConfig.params[key].check("DecodeConfig", key, value)
        self.controller_name = self.options.controller
        self.controller = build_controller(self.controller_name, **ctrl_kw)
        self.loaded = self._load(model) if isinstance(model, str) else model
        defaults: dict[str, Any] = {}
        task = getattr(self.loaded, "task", None)
        if task:
            from adaptive_decoding.framework.tasks.base import get_task

            t = get_task(task)
            defaults = {"gen_length": t.gen_length, "block_length": t.default_block_length}
            if "gen_length" in cfg_kw:  # the task's block length is meant for the task's generation length
                defaults.pop("block_length")
        self.config = DecodeConfig.build(**{**defaults, **cfg_kw})
        check_cache_support(self.loaded.denoiser, self.config.cache)
        config_for_model(self.config, self.loaded.denoiser)  # block-causal models: their block size, their caches
        self._device = model_device(self.loaded.denoiser)
        self._templated = False  # set once lm-eval applied the chat template itself (--apply_chat_template)
        self._warned: set[str] = set()
        self.stats = {"generated": 0, "nfe": 0, "answer_tokens": 0, "forwards": 0, "loglikelihood": 0}

    def _load(self, name: str) -> Any:
        from adaptive_decoding.framework.training.zoo import load_model

        o = self.options
        return load_model(name, device=o.device, dtype=o.dtype, trust_remote_code=o.trust_remote_code,
                          chat=o.chat_template)

    # ------------------------------------------------------------------ tokens
    @property
    def tokenizer(self) -> Any:
        return self.loaded.tokenizer

    def _hf(self, what: str) -> Any:
        hf = getattr(self.tokenizer, "tokenizer", None)
        if hf is None or not hasattr(hf, "apply_chat_template"):
            raise NotImplementedError(f"adec: {what} needs a Hugging Face tokenizer; "
                                      f"{type(self.tokenizer).__name__} of {self.loaded.name!r} has none")
        return hf

    def _plain_ids(self, text: str, special: bool = True) -> list[int]:
        """Token ids of ``text`` as is (no chat template), as LLaDA's evaluation tokenizes."""
        if getattr(self.tokenizer, "chat", False) or self._templated:
            return list(self._hf("plain tokenization")(text, add_special_tokens=special)["input_ids"])
        return list(self.tokenizer.encode(text))

    def _prompt_ids(self, text: str) -> list[int]:
        """Token ids of a generation prompt: as ``adec decode`` encodes it, unless lm-eval templated it."""
        if self._templated:
            return self._plain_ids(text, special=False)  # the template holds its special tokens
        return list(self.tokenizer.encode(text))

    def _encode_pair(self, context: str, continuation: str) -> tuple[list[int], list[int]]:
        """LLaDA's split: trailing spaces of the context move to the continuation; the continuation's
        ids are those of ``context + continuation`` after the context's."""
        n_spaces = len(context) - len(context.rstrip())
        if n_spaces:
            context, continuation = context[:-n_spaces], context[-n_spaces:] + continuation
        context_ids = self._plain_ids(context)
        whole = self._plain_ids(context + continuation)
        return context_ids, whole[len(context_ids):]

    # ------------------------------------------------------------------ lm-eval's API
    def generate_until(self, requests: list[Instance], disable_tqdm: bool = False) -> list[str]:
        contexts = [req.args[0] for req in requests]
        kwargs = [dict(req.args[1] or {}) if len(req.args) > 1 else {} for req in requests]
        self._warn_ignored(kwargs)
        seen: dict[str, int] = {}
        ids = []
        for c in contexts:  # the n-th repeat of a prompt gets its own seed
            seen[c] = seen.get(c, 0) + 1
            ids.append(f"{c}\x1e{seen[c]}")
        encoded = [self._prompt_ids(c) for c in contexts]
        order = sorted(range(len(requests)), key=lambda i: -len(encoded[i]))  # similar lengths share a batch
        texts: list[Optional[str]] = [None] * len(requests)
        bs = self.options.batch_size
        progress = _progress(len(requests), "adec generate_until", disable_tqdm)
        for start in range(0, len(order), bs):
            chunk = order[start : start + bs]
            res = decode(self.loaded.denoiser, [encoded[i] for i in chunk], self.controller, self.config,
                         seeds=item_seeds([ids[i] for i in chunk], self.config.seed),
                         context=DecodeContext.for_batch(self.tokenizer, [contexts[i] for i in chunk]))
            for j, i in enumerate(chunk):
                text = cut_at_stops(self.tokenizer.decode(res.generated[j].tolist(), stop_at_eos=True),
                                    kwargs[i].get("until"))
                texts[i] = text
                self.cache_hook.add_partial("generate_until", requests[i].args, text)
                self.stats["answer_tokens"] += self._answer_tokens(res, j, kwargs[i].get("until"))
            self.stats["generated"] += len(chunk)
            self.stats["nfe"] += int(res.nfe.sum())
            progress.update(len(chunk))
        progress.close()
        return [t or "" for t in texts]

    def _answer_tokens(self, res: Any, row: int, until: Any) -> int:
        """Row ``row``'s answer positions: to its first end-of-text, or before its first ``until`` string."""
        stops = [until] if isinstance(until, str) else list(until or [])
        return answer_tokens_before(self.tokenizer, res.generated[row].tolist(), int(res.answer_tokens[row]), stops)

    def loglikelihood(self, requests: list[Instance], disable_tqdm: bool = False) -> list[tuple[float, bool]]:
        seed = self.config.seed
        pairs = [self._encode_pair(req.args[0], req.args[1]) for req in requests]
        items = [MCRequest(prefix=c, target=t, seed=stable_seed(seed, req.args[0], req.args[1]))
                 for (c, t), req in zip(pairs, requests)]
        o = self.options
        progress = _progress(len(items), "adec loglikelihood", disable_tqdm)
        lls: list[float] = []
        chunk_size = max(1, o.batch_size)
        for start in range(0, len(items), chunk_size):  # chunks only pace the progress bar
            lls += mc_loglikelihoods(self.loaded.denoiser, items[start : start + chunk_size], mc_num=o.mc_num,
                                     batch_size=o.batch_size, cfg=o.cfg,
                                     pad_token_id=getattr(self.tokenizer, "pad_token_id", None))
            progress.update(min(chunk_size, len(items) - start))
        progress.close()
        greedy = (greedy_matches(self.loaded.denoiser, items, batch_size=o.batch_size) if o.check_greedy
                  else [False] * len(items))
        self.stats["loglikelihood"] += len(items)
        self.stats["forwards"] += o.mc_num * sum(1 for it in items if len(it.target)) * (
            2 if o.cfg > 0 else 1)
        out = [(float(ll), bool(g)) for ll, g in zip(lls, greedy)]
        for req, res in zip(requests, out):
            self.cache_hook.add_partial("loglikelihood", req.args, res)
        return out

    def loglikelihood_rolling(self, requests: list[Instance], disable_tqdm: bool = False) -> list[float]:
        raise NotImplementedError(
            "adec: loglikelihood_rolling (perplexity tasks such as wikitext) is not supported: a masked "
            "diffusion LM has no left-to-right factorisation to roll over, and LLaDA's evaluation does not "
            "support it either; use generate_until tasks or multiple-choice (loglikelihood) tasks")

    # ---------------------------------------------------- chat templates (--apply_chat_template)
    def apply_chat_template(self, chat_history: list[dict[str, str]],
                            add_generation_prompt: bool = True) -> str:
        hf = self._hf("--apply_chat_template")
        if not getattr(hf, "chat_template", None):
            raise NotImplementedError(f"adec: --apply_chat_template: the tokenizer of {self.loaded.name!r} "
                                      f"has no chat template")
        self._templated = True
        return hf.apply_chat_template(chat_history, tokenize=False,
                                      add_generation_prompt=add_generation_prompt)

    @property
    def tokenizer_name(self) -> str:
        hf = getattr(self.tokenizer, "tokenizer", None)
        return str(getattr(hf, "name_or_path", None) or self.loaded.name).replace("/", "__")

    def chat_template(self, chat_template: Any = False) -> Optional[str]:
        hf = getattr(self.tokenizer, "tokenizer", None)
        return getattr(hf, "chat_template", None) or ""

    def get_model_info(self) -> dict[str, Any]:
        """Recorded in lm-eval's results (``config``): the decoding setup and the cost of the run."""
        s = self.stats
        return {
            "adec_model": str(self.loaded.name), "adec_controller": self.controller_name,
            "adec_controller_params": self.controller.get_params(), "adec_decode": self.config.get_params(),
            "adec_mc_num": self.options.mc_num, "adec_cfg": self.options.cfg,
            "adec_generated": s["generated"],
            "adec_mean_nfe": s["nfe"] / s["generated"] if s["generated"] else None,
            "adec_tokens_per_forward": tokens_per_forward([s["answer_tokens"]], [s["nfe"]]) if s["nfe"] else None,
            "adec_loglikelihood_forward_rows": s["forwards"],
        }

    def _warn_ignored(self, kwargs: list[dict[str, Any]]) -> None:
        def quiet(key: str, value: Any) -> bool:
            return key in QUIET_GEN_KWARGS and (key == "until" or value in (None, QUIET_GEN_KWARGS[key]))

        ignored = sorted({k for kw in kwargs for k, v in kw.items() if not quiet(k, v)} - self._warned)
        if ignored:
            self._warned.update(ignored)
            warnings.warn(f"adec ignores lm-eval's generation kwargs {', '.join(ignored)}: decoding is set "
                          f"by --model_args (gen_length={self.config.gen_length}, "
                          f"temperature={self.config.temperature}, controller={self.controller_name})",
                          UserWarning, stacklevel=3)


def _progress(total: int, desc: str, disable: bool) -> Any:
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, disable=disable or total == 0)
