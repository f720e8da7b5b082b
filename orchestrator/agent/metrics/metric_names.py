"""Names of metrics: a key as a training script prints it -> the name orch keeps it under (stdlib only, pure).

    >>> name_of("valid loss"), name_of("Acc@1"), name_of("CurrSamplesPerSec"), name_of("line")
    (('val', 'loss', 1.0), ('', 'acc1', 1.0), ('', 'samples_s', 1.0), None)

Lower case, words joined by ``_``, ``@`` dropped; a ``train``/``training`` word goes; an evaluation's word
(val/valid/validation/eval/evaluation/dev -> ``val``, test -> ``test``) is the split, kept apart. Only names of
metrics are names (losses, accuracies, perplexity, lr, norms, rates, counters; ``*_loss``, ``*_acc``); a time per
step has the split ``time`` and its scale to seconds.
"""

from __future__ import annotations

import functools
import re

_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")
_SPLIT = re.compile(r"[^a-z0-9]+")
EVAL_WORDS = {"val": "val", "valid": "val", "validation": "val", "eval": "val", "evaluation": "val",
               "dev": "val", "test": "test", "testing": "test"}
TRAIN_WORDS = {"train", "training"}
_FILLER = {"average", "avg", "mean", "running", "current", "curr", "cur", "end", "of", "the", "batch", "set"}
STRUCTURAL = {"step", "epoch", "total_steps", "total_epochs", "tokens", "total_tokens", "t"}
RATES = {"tok_s", "steps_s", "samples_s"}

# joined name -> (canonical, scale)
_NAMES: dict[str, tuple[str, float]] = {}
for _names, _canon, _scale in (
    (("step", "steps", "iter", "iteration", "it_num", "global_step", "num_updates", "updates"), "step", 1.0),
    (("epoch", "ep", "train"), "epoch", 1.0),  # timm: "Train: 3 [ 10/5004 ...]"
    (("total_steps", "max_steps", "num_steps"), "total_steps", 1.0),
    (("tokens", "tokens_seen", "ntokens", "consumed_tokens"), "tokens", 1.0),
    (("total_tokens", "target_tokens", "train_tokens"), "total_tokens", 1.0),
    (("loss", "lm_loss", "loss_value", "total_loss"), "loss", 1.0),  # total_loss: detectron2's sum of its losses
    (("ppl", "perplexity"), "ppl", 1.0),
    (("acc", "accuracy"), "acc", 1.0),
    (("acc1", "top1", "top_1", "acc_1", "prec1", "accuracy_top1", "acc_top1"), "acc1", 1.0),
    (("acc5", "top5", "top_5", "acc_5", "prec5", "accuracy_top5", "acc_top5"), "acc5", 1.0),
    (("lr", "learning_rate", "learning_rate_0", "lr_0"), "lr", 1.0),
    (("grad_norm", "gnorm", "grad_norm_total", "norm", "gradient_norm"), "grad_norm", 1.0),
    (("mfu",), "mfu", 1.0), (("tflops",), "tflops", 1.0),
    (("tok_s", "tok_sec", "tokens_s", "tokens_sec", "tokens_per_sec", "tokens_per_s", "tokens_per_second", "tps",
      "wps", "words_s", "tokens_per_sec_per_gpu"), "tok_s", 1.0),
    (("ktok_s", "ktok_sec", "ktokens_s"), "tok_s", 1e3),
    (("mtok_s", "mtokens_s"), "tok_s", 1e6),
    (("it_s", "steps_s", "steps_sec", "steps_per_second", "steps_per_sec", "ups", "iters_s", "updates_s"),
     "steps_s", 1.0),
    (("samples_s", "samples_sec", "samples_per_second", "samples_per_sec", "img_s", "imgs_s", "images_s",
      "images_sec", "ex_s", "examples_s", "examples_sec", "examples_per_sec", "sentences_s"), "samples_s", 1.0),
):
    for _n in _names:
        _NAMES[_n] = (_canon, _scale)
_OTHER = {"f1", "bleu", "wer", "cer", "auc", "map", "miou", "iou", "precision", "recall", "bpb", "bpc", "nll",
          "kl", "reward", "score", "mae", "mse", "rmse", "psnr", "dice", "top1_err", "top5_err", "error", "err"}
_ENDINGS = ("_loss", "_acc", "_accuracy", "_ppl", "_f1", "_error", "_reward")
# a time per step, in seconds: name -> scale to seconds
TIMES = {"time": 1.0, "batch_time": 1.0, "step_time": 1.0, "iter_time": 1.0, "dt": 1.0, "time_per_step": 1.0,
          "time_per_iter": 1.0, "s_it": 1.0, "sec_it": 1.0, "s_step": 1.0, "s_iter": 1.0, "ms_batch": 1e-3,
          "ms_step": 1e-3, "ms_it": 1e-3, "ms_iter": 1e-3, "time_ms": 1e-3, "step_time_ms": 1e-3, "ms": 1e-3,
          "iter_time_ms": 1e-3}

@functools.lru_cache(maxsize=4096)
def name_of(key: str) -> tuple[str, str, float] | None:
    """``(split, canonical, scale)`` for a key as printed, None when it names no metric: ``"valid loss"`` ->
    ``("val", "loss", 1.0)``; split is ``""`` (training), ``"val"``, ``"test"``, or ``"time"`` (a time per step,
    scale to seconds)."""
    text = _CAMEL.sub("_", key.replace("@", "")).lower() if not key.islower() else key.replace("@", "")
    words = [w for w in _SPLIT.split(text) if w]
    split = ""
    if len(words) > 1 and words[0] in EVAL_WORDS:
        split = EVAL_WORDS[words.pop(0)]
    elif len(words) > 1 and words[-1] in EVAL_WORDS:
        split = EVAL_WORDS[words.pop()]
    if len(words) > 1 and words[0] in TRAIN_WORDS:
        words.pop(0)
    elif len(words) > 1 and words[-1] in TRAIN_WORDS:
        words.pop()
    kept = [w for w in words if w not in _FILLER]
    if kept:
        words = kept
    joined = "_".join(words)
    known = _NAMES.get(joined)
    if known is not None:
        return split, known[0], known[1]
    if joined in TIMES:
        return (split or "time"), joined, TIMES[joined]
    if joined in _OTHER or joined.endswith(_ENDINGS) or joined.startswith("loss_"):
        return split, joined, 1.0
    return None


@functools.lru_cache(maxsize=4096)
def key_name(key: str) -> tuple[str, str, float] | None:
    """``name_of`` a key of several words, else of its last words (``INFO loss`` is ``loss``)."""
    found = name_of(key)
    if found is not None or " " not in key:
        return found
    words = key.split(" ")
    for i in range(1, len(words)):
        found = name_of(" ".join(words[i:]))
        if found is not None:
            return found
    return None


def kind_of_metric(name: str) -> str:
    """``train``, ``eval`` (``val_*``, ``test_*``) or ``summary`` (``summary_*``, Hugging Face's ``mean_loss`` and
    ``runtime_s``): which kind of line a kept metric came from."""
    if name.startswith(("val_", "test_")):
        return "eval"
    if name.startswith("summary_") or name in ("mean_loss", "runtime_s"):
        return "summary"
    return "train"
